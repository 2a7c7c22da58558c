"""Removing and purging the .deb under a real systemd: this host's OS booted in a
container whose /usr, /etc and /var are overlays of the host's, thrown away at exit,
so the package installs there as on a real host and this machine is left alone. A
oneshot unit (CHECK below) installs it, enables a subscriber socket as the README
says, lets a connection start the subscriber, then removes and purges the package,
writing what systemctl says at each step; the tests read that report."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.packaging.conftest import Packages
from tests.systemd.layout import boot_container

BOOT_TIMEOUT_S = 180

pytestmark = [
    pytest.mark.skipif(shutil.which("systemd-nspawn") is None, reason="systemd-nspawn is missing (apt-get install systemd-container)"),
]

CHECK_UNIT = """\
[Unit]
Description=ppmq package check
After=basic.target

[Service]
Type=oneshot
ExecStart=/bin/sh /results/check.sh
# the container's exit, however the check went: the report tells the rest
ExecStopPost=/usr/bin/systemctl --no-block exit
"""

# Each `state NAME` line of the report: the states of the broker's units and of the
# subscriber `demo`'s socket and service, and whether its socket is enabled.
CHECK = """\
#!/bin/sh
exec >/results/log.txt 2>&1
set -x
unit_state() { systemctl is-active "$1" 2>/dev/null || true; }
state() {
    link=/etc/systemd/system/sockets.target.wants/ppmq-subscriber@demo.socket
    enabled=no; [ -L "$link" ] && enabled=yes
    echo "$1 broker=$(unit_state ppmq.service) socket=$(unit_state ppmq.socket)" \\
        "sub_socket=$(unit_state ppmq-subscriber@demo.socket) sub=$(unit_state ppmq-subscriber@demo.service)" \\
        "sub_enabled=$enabled" >>/results/report.txt
}
subscriber_started() {
    /opt/ppmq/bin/python3 -c 'import socket; socket.socket(socket.AF_UNIX).connect("/run/ppmq/sub/demo.sock")'
    for _ in $(seq 100); do
        [ "$(unit_state ppmq-subscriber@demo.service)" = active ] && return
        sleep 0.1
    done
}
run_demo() {
    install -m 0755 /results/handler /etc/ppmq/subscribers/demo
    systemctl enable --now ppmq-subscriber@demo.socket
    subscriber_started
}

# An image built for containers may forbid package scripts to start or stop services
# (policy-rc.d exits 101); a host does not. The overlay is thrown away at exit.
rm -f /usr/sbin/policy-rc.d

dpkg --install /results/ppmq.deb
run_demo
state installed
dpkg --remove ppmq
state removed
dpkg --purge ppmq
state purged

dpkg --install /results/ppmq.deb
run_demo
state reinstalled
dpkg --purge ppmq
state purged_at_once
"""

# A subscriber that stays up until stopped.
HANDLER = "#!/bin/sh\nexec sleep 600\n"


def boot(tree: Path) -> str:
    """Boot until the check unit exits the container; what went wrong, or ''."""
    return boot_container(
        [
            "--private-network",
            "--volatile=yes",
            # Empty upper directories: the container's writes go to throwaway ones.
            "--overlay=/usr::/usr",
            "--overlay=/etc::/etc",
            "--overlay=/var::/var",
            f"--bind-ro={tree / 'ppmq-pkgcheck.service'}:/etc/systemd/system/ppmq-pkgcheck.service",
            f"--bind={tree / 'results'}:/results",
            "--boot",
            "systemd.firstboot=off",
            "systemd.unit=ppmq-pkgcheck.service",
        ],
        BOOT_TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def states(packages: Packages, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """Boot once: each step's unit states, by step."""
    if os.geteuid() != 0:
        pytest.fail("booting a container needs root")
    tree = tmp_path_factory.mktemp("deb-systemd")
    results = tree / "results"
    results.mkdir()
    (tree / "ppmq-pkgcheck.service").write_text(CHECK_UNIT)
    (results / "check.sh").write_text(CHECK)
    (results / "handler").write_text(HANDLER)
    shutil.copy(packages.deb, results / "ppmq.deb")
    trouble = boot(tree)
    log = (results / "log.txt").read_text() if (results / "log.txt").exists() else ""
    report = (results / "report.txt").read_text() if (results / "report.txt").exists() else ""
    assert not trouble and report.count("\n") == 5, f"{trouble}\n{report}\n{log[-8000:]}"
    steps = {}
    for line in report.splitlines():
        step, *pairs = line.split()
        steps[step] = dict(pair.split("=", 1) for pair in pairs)
    steps["log"] = {"text": log[-8000:]}
    return steps


def test_the_package_starts_the_broker_and_a_connection_starts_the_enabled_subscriber(states: dict[str, dict[str, str]]) -> None:
    for step in ("installed", "reinstalled"):
        expected = {"broker": "active", "socket": "active", "sub_socket": "active", "sub": "active", "sub_enabled": "yes"}
        assert states[step] == expected, states["log"]["text"]


def test_remove_stops_the_subscriber_and_keeps_it_enabled_and_purge_disables_it(states: dict[str, dict[str, str]]) -> None:
    stopped = {"broker": "inactive", "socket": "inactive", "sub_socket": "inactive", "sub": "inactive"}
    assert states["removed"] == {**stopped, "sub_enabled": "yes"}, states["log"]["text"]
    assert states["purged"] == {**stopped, "sub_enabled": "no"}, states["log"]["text"]


def test_purge_of_the_installed_package_stops_and_disables_the_subscriber(states: dict[str, dict[str, str]]) -> None:
    stopped = {"broker": "inactive", "socket": "inactive", "sub_socket": "inactive", "sub": "inactive"}
    assert states["purged_at_once"] == {**stopped, "sub_enabled": "no"}, states["log"]["text"]
