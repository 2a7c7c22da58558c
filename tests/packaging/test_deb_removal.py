"""Removing and purging the .deb: the program goes, the operator's config stays
until purge, and the queued messages stay even then unless PPMQ_PURGE_DATA=yes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.packaging.conftest import Machine, Packages, known

DATA = Path("/var/lib/ppmq")
WANTS = (
    Path("/etc/systemd/system/sockets.target.wants/ppmq.socket"),
    Path("/etc/systemd/system/multi-user.target.wants/ppmq.service"),
)


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
