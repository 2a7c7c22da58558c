"""What the packages ship, checked from the sources: the project's licence metadata,
and what `make package` and `make test-package` install first."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tests.unit.test_makefile import planned

ROOT = Path(__file__).resolve().parents[2]


def test_the_project_licence_is_an_spdx_expression_with_its_text() -> None:
    """A licence table is deprecated by setuptools, which then prints a banner on
    every `pip install -e .`; the string form needs setuptools 77."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "MIT"
    for pattern in pyproject["project"]["license-files"]:
        assert list(ROOT.glob(pattern)), pattern
    (setuptools,) = [r for r in pyproject["build-system"]["requires"] if r.startswith("setuptools")]
    minimum = re.fullmatch(r"setuptools>=(\d+)(?:\.\d+)*", setuptools)
    assert minimum and int(minimum.group(1)) >= 77, setuptools


def test_make_package_installs_the_build_tools_alone() -> None:
    commands = planned("package")
    assert "packaging/install-tools.sh .venv" in commands
    assert "packaging/build.sh dist deb" in commands
    for unwanted in ("java", "openjdk", "chromium", "spark", "[test", "pip install"):
        assert unwanted not in commands, unwanted


def test_make_test_package_installs_the_broker_and_pytest_but_not_the_rest_of_the_test_stack() -> None:
    commands = planned("test-package")
    assert "pip install --quiet -e .\n" in commands and "pip install --quiet 'pytest>=8'" in commands
    for unwanted in ("java", "openjdk", "chromium", "spark", "[test"):
        assert unwanted not in commands, unwanted
    assert commands.splitlines()[-1].endswith("-m pytest -q tests/packaging")
