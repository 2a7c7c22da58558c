"""The .rpm built with rpmbuild from packaging/rpm/ppmq.spec on this machine: the
same files as the .deb, the scriptlets of the RHEL family, and a payload that runs
once unpacked into a throwaway root."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

from tests.packaging.conftest import REPO, Packages, run

DEB_ONLY = {"/usr/share/doc/ppmq/changelog.Debian.gz", "/usr/share/lintian/overrides/ppmq"}
# Where the .rpm puts a file the .deb has elsewhere: zsh on EL reads site-functions.
RPM_PATHS = {"/usr/share/zsh/vendor-completions/_ppmq": "/usr/share/zsh/site-functions/_ppmq"}


def rpm_query(rpm: Path, *args: str) -> str:
    return run("rpm", "--query", "--package", *args, rpm)


def deb_files(deb: Path) -> set[str]:
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", deb], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        return {m.name.removeprefix(".") for m in t.getmembers() if not m.isdir()}


def test_the_rpm_installs_the_same_files_as_the_deb(packages: Packages) -> None:
    listing = rpm_query(packages.rpm, "--queryformat", "[%{FILEMODES:perms} %{FILENAMES}\n]")
    rpm_files = {line.split(" ", 1)[1] for line in listing.splitlines() if not line.startswith("d")}
    assert rpm_files == {RPM_PATHS.get(f, f) for f in deb_files(packages.deb) - DEB_ONLY}


def test_the_rpm_creates_the_sysusers_user_before_unpacking(packages: Packages) -> None:
    scripts = rpm_query(packages.rpm, "--scripts")
    preinstall = scripts.split("preinstall scriptlet")[1].split("scriptlet")[0]
    sysusers = (REPO / "systemd/sysusers.d/ppmq.conf").read_text().splitlines()
    for kind, name, *_ in (line.split() for line in sysusers if line and not line.startswith("#")):
        assert f"getent {'passwd' if kind == 'u' else 'group'} {name}" in preinstall
    assert "useradd -r -g ppmq -d /var/lib/ppmq" in preinstall
    assert "systemd-tmpfiles --create ppmq.conf" in scripts.split("postinstall scriptlet")[1]
    assert 'PPMQ_PURGE_DATA:-}" = yes' in scripts.split("postuninstall scriptlet")[1]


def test_erasing_the_rpm_stops_and_disables_the_instances_of_its_templates(packages: Packages) -> None:
    """As the .deb's prerm and postrm do, which tests/packaging/test_deb_systemd.py
    runs under systemd: a stop of the running instances, then their links removed."""
    scripts = rpm_query(packages.rpm, "--scripts")
    preuninstall = scripts.split("preuninstall scriptlet")[1].split("scriptlet")[0]
    postuninstall = scripts.split("postuninstall scriptlet")[1]
    assert "systemctl stop 'ppmq-subscriber@*.socket' 'ppmq-subscriber@*.service' 'ppmq-bridge@*.service'" in preuninstall
    for template in ("ppmq-subscriber@.socket", "ppmq-subscriber@.service", "ppmq-bridge@.service"):
        assert f"*/lib/systemd/system/{template}" in postuninstall
    assert 'rm -f "$link"' in postuninstall


def test_the_rpm_keeps_an_edited_config_and_requires_the_venvs_python(packages: Packages) -> None:
    flags = rpm_query(packages.rpm, "--queryformat", "[%{FILEFLAGS:fflags} %{FILENAMES}\n]").splitlines()
    assert "cn /etc/ppmq/ppmq.yaml" in flags  # %config(noreplace)
    # stage.sh builds the venv on what /usr/bin/python3 points to, python3.X.
    assert Path("/usr/bin/python3").resolve().name in rpm_query(packages.rpm, "--requires").split()


def test_the_rpm_is_the_projects_version(packages: Packages) -> None:
    version = rpm_query(packages.rpm, "--queryformat", "%{VERSION}")
    assert f'version = "{version}"' in (REPO / "pyproject.toml").read_text()


def test_the_rpm_payload_runs_from_a_throwaway_root(packages: Packages, tmp_path: Path) -> None:
    """Unpacked without scriptlets: the venv is complete and checks the packaged config."""
    run("rpm", "--root", tmp_path, "--initdb")
    run("rpm", "--root", tmp_path, "--install", "--nodeps", "--noscripts", packages.rpm)
    out = run(tmp_path / "opt/ppmq/bin/python3", "-m", "ppmq.cli", "check", "-c", tmp_path / "etc/ppmq/ppmq.yaml")
    assert "ok" in out
    assert (tmp_path / "usr/bin/ppmq").readlink() == Path("/opt/ppmq/bin/ppmq")
