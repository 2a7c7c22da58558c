"""Removing and purging the .deb: the program goes, the operator's config stays
until purge, and the queued messages stay even then unless PPMQ_PURGE_DATA=yes.
The instances of the package's templates that the site enabled stay enabled until
purge, which disables them and nothing else."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.packaging.conftest import Machine, Packages, known, run

DATA = Path("/var/lib/ppmq")
SYSTEM = Path("/etc/systemd/system")
WANTS = (SYSTEM / "sockets.target.wants/ppmq.socket", SYSTEM / "multi-user.target.wants/ppmq.service")
# What `systemctl enable` of the instances makes, and a socket unit of the site's own
# (examples/parallel) whose name starts as theirs do.
INSTANCES = ("ppmq-subscriber@demo.socket", "ppmq-bridge@demo.service")
INSTANCE_LINKS = (SYSTEM / "sockets.target.wants/ppmq-subscriber@demo.socket", SYSTEM / "multi-user.target.wants/ppmq-bridge@demo.service")
SITE_UNIT = SYSTEM / "ppmq-render.socket"
SITE_LINK = SYSTEM / "sockets.target.wants/ppmq-render.socket"


@pytest.fixture
def installed_with_data(machine: Machine, packages: Packages) -> Path:
    """The package installed, and a file standing for the queued messages."""
    machine.install(packages.deb)
    marker = DATA / "data.mdb"
    marker.write_bytes(b"queued messages")
    return marker


def test_remove_takes_the_program_and_keeps_the_config(machine: Machine, installed_with_data: Path) -> None:
    machine.remove()
    for gone in ("/opt/ppmq", "/usr/bin/ppmq", "/usr/lib/systemd/system/ppmq.service", "/usr/lib/sysusers.d/ppmq.conf"):
        assert not Path(gone).exists(), gone
    assert Path("/etc/ppmq/ppmq.yaml").is_file()
    machine.purge()


def test_purge_keeps_the_data_and_the_user_but_forgets_the_units(machine: Machine, installed_with_data: Path) -> None:
    assert all(link.is_symlink() for link in WANTS)
    machine.purge()
    assert installed_with_data.read_bytes() == b"queued messages"
    assert known("passwd", "ppmq")
    assert not Path("/etc/ppmq").exists()
    assert not any(link.is_symlink() for link in WANTS)


def test_purge_with_PPMQ_PURGE_DATA_yes_deletes_the_data(machine: Machine, installed_with_data: Path) -> None:
    machine.purge(PPMQ_PURGE_DATA="yes")
    assert not DATA.exists()


@pytest.fixture
def enabled_instances(machine: Machine, packages: Packages) -> Iterator[None]:
    """The package installed, a subscriber socket and a bridge enabled as the README
    says, and the site's own ppmq-render.socket enabled beside them (systemctl works
    on the files when systemd is not running)."""
    machine.install(packages.deb)
    shutil.copy("/usr/share/doc/ppmq/examples/parallel/ppmq-render.socket", SITE_UNIT)
    try:
        run("systemctl", "enable", *INSTANCES, SITE_UNIT.name)
        assert all(link.is_symlink() for link in (*INSTANCE_LINKS, SITE_LINK))
        yield
    finally:
        for path in (*INSTANCE_LINKS, SITE_LINK, SITE_UNIT):
            path.unlink(missing_ok=True)


def test_remove_keeps_the_enabled_instances_and_purge_disables_them_but_not_the_sites_units(
    machine: Machine, enabled_instances: None
) -> None:
    machine.remove()
    assert all(link.is_symlink() for link in INSTANCE_LINKS)
    machine.purge()
    assert not any(link.is_symlink() for link in INSTANCE_LINKS)
    assert SITE_LINK.resolve() == SITE_UNIT


def test_purge_of_the_installed_package_disables_the_enabled_instances(machine: Machine, enabled_instances: None) -> None:
    machine.purge()
    assert not any(link.is_symlink() for link in INSTANCE_LINKS)
    assert SITE_LINK.resolve() == SITE_UNIT
