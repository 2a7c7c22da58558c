"""The shipped units, sysusers and tmpfiles snippets, checked by systemd's own
tools against a scratch root: `systemd-analyze verify` (any output fails, since
a misspelt key is only a warning with exit status 0), `systemd-sysusers --root`
and `systemd-tmpfiles --root --create`."""

from __future__ import annotations

import configparser
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from ppmq.client import subscriber as kit
from ppmq.config import load_config
from tests.systemd.layout import EXAMPLE, PARALLEL, UNITS, install_units

STUBS = (
    "usr/bin/ppmq",
    "etc/ppmq/subscribers/archive",
    "etc/ppmq/subscribers/render",
    "etc/ppmq/bridge/orders.conf",
)  # what the units execute

pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("systemd-analyze", "systemd-sysusers", "systemd-tmpfiles")),
    reason="systemd's tools are missing (apt-get install systemd)",
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A root with our units in /etc, the distribution's in /usr/lib, and stub executables."""
    install_units(tmp_path)
    shutil.copytree("/usr/lib/systemd/system", tmp_path / "usr/lib/systemd/system", symlinks=True)
    for stub in STUBS:
        path = tmp_path / stub
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    return tmp_path


def verify(root: Path, *units: str) -> str:
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", f"--root={root}", *units],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return f"exit {done.returncode}\n{done.stdout}{done.stderr}".strip()


def test_the_broker_units_verify_without_a_word(root):
    assert verify(root, "ppmq.socket", "ppmq.service") == "exit 0"


def test_the_subscriber_template_with_the_example_drop_in_verifies_without_a_word(root):
    assert verify(root, "ppmq-subscriber@archive.socket", "ppmq-subscriber@archive.service") == "exit 0"


def test_the_bridge_template_verifies_without_a_word(root):
    assert verify(root, "ppmq-bridge@orders.service") == "exit 0"


def test_the_parallel_example_with_accept_verifies_without_a_word(root):
    for unit in PARALLEL.glob("*.s*"):
        shutil.copy(unit, root / "etc/systemd/system")
    assert verify(root, "ppmq-render.socket", "ppmq-render@1.service") == "exit 0"
    sub = next(s for s in yaml.safe_load((PARALLEL / "ppmq.yaml").read_text())["Subscribers"] if s["Name"] == "render")
    assert unit_setting(PARALLEL / "ppmq-render.socket", "Socket", "ListenStream") == sub["Socket"]
    assert int(unit_setting(PARALLEL / "ppmq-render.socket", "Socket", "MaxConnections")) >= sub["Connections"]


def test_a_misspelt_key_is_reported_although_verify_exits_0(root):
    unit = root / "etc/systemd/system/ppmq.service"
    unit.write_text(unit.read_text().replace("NoNewPrivileges=", "NoNewPrivilegez="))
    out = verify(root, "ppmq.service")
    assert out.startswith("exit 0") and "Unknown key 'NoNewPrivilegez'" in out


def test_sysusers_creates_the_broker_user_and_the_clients_group(root):
    subprocess.run(["systemd-sysusers", f"--root={root}", str(UNITS / "sysusers.d/ppmq.conf")], check=True, capture_output=True, timeout=60)
    users = {line.split(":")[0]: line.split(":") for line in (root / "etc/passwd").read_text().splitlines()}
    groups = {line.split(":")[0] for line in (root / "etc/group").read_text().splitlines()}
    assert users["ppmq"][5:] == ["/var/lib/ppmq", "/usr/sbin/nologin"]
    assert int(users["ppmq"][2]) < 1000  # a system user
    assert {"ppmq", "ppmq-clients"} <= groups


def test_tmpfiles_creates_the_socket_directories_and_a_private_data_directory(root):
    subprocess.run(["systemd-sysusers", f"--root={root}", str(UNITS / "sysusers.d/ppmq.conf")], check=True, capture_output=True, timeout=60)
    done = subprocess.run(
        ["systemd-tmpfiles", f"--root={root}", "--create", str(UNITS / "tmpfiles.d/ppmq.conf")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")
    uid = int(next(line for line in (root / "etc/passwd").read_text().splitlines() if line.startswith("ppmq:")).split(":")[2])
    modes = {d: (stat.S_IMODE((root / d).stat().st_mode), (root / d).stat().st_uid) for d in ("run/ppmq", "run/ppmq/sub", "var/lib/ppmq")}
    assert modes == {"run/ppmq": (0o755, 0), "run/ppmq/sub": (0o755, 0), "var/lib/ppmq": (0o700, uid)}


def unit_setting(path: Path, section: str, key: str) -> str:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str
    parser.read(path)
    return parser[section][key]


def test_the_example_config_matches_its_socket_unit_and_the_kit(tmp_path):
    # Given the example's snippet completed with the two keys every config has
    snippet = yaml.safe_load((EXAMPLE / "ppmq.yaml").read_text())
    config = tmp_path / "ppmq.yaml"
    config.write_text(yaml.safe_dump({"ServerSocket": "/run/ppmq/ppmq.sock", "DataPath": "/var/lib/ppmq", **snippet}))
    # Then it is a valid config, and the subscriber's socket is where the socket unit listens
    sub = next(s for s in load_config(config).subscribers if s.name == "archive")
    socket_unit = UNITS / "ppmq-subscriber@.socket"
    assert unit_setting(socket_unit, "Socket", "ListenStream").replace("%i", "archive") == sub.socket
    assert unit_setting(socket_unit, "Socket", "FileDescriptorName") == kit.FD_NAME
    assert unit_setting(UNITS / "ppmq.socket", "Socket", "ListenStream") == "/run/ppmq/ppmq.sock"


def test_the_example_subscriber_is_sandboxed_to_what_it_needs(root):
    # systemd-analyze's scale is 0-100 here; below 20 (1.9 as printed) it rates SAFE
    done = subprocess.run(
        [
            "systemd-analyze",
            "security",
            "--offline=yes",
            f"--root={root}",
            "--threshold=19",
            "--no-pager",
            "ppmq-subscriber@archive.service",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "SAFE" in done.stdout, done.stdout + done.stderr
