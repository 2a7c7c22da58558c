"""The units under a real systemd: this host's OS booted in a container
(`systemd-nspawn --volatile=yes --boot`: a tmpfs root, the host's /usr read-only),
with the project and the units from systemd/ installed as a site would install
them, the broker and the example subscriber enabled, and a oneshot unit
(container_check.py) driving them. The test reads what that unit reported.

What is installed where: the units in /etc/systemd/system, enabled with
`systemctl --root`; the sysusers and tmpfiles snippets in /etc; a virtualenv on
the distribution's python3 (tests/systemd/setup.sh builds it) at /opt/ppmq, with
this checkout's src/ppmq mounted over its copy of ppmq, and /usr/bin/ppmq
running it; /etc/ppmq/ppmq.yaml and the example subscriber as
/etc/ppmq/subscribers/archive.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.systemd.container_check import FIRST, HELD, RENDERS, SECOND
from tests.systemd.layout import EXAMPLE, PARALLEL, REPO, UNITS, boot_container, install_units

VENV = REPO / "build" / "system-venv"
SITE_PACKAGES = next(VENV.glob("lib/python3*/site-packages"), VENV)
BOOT_TIMEOUT_S = 120
IDLE_EXIT_S = 2  # the example subscriber's --idle-exit in the container

pytestmark = [
    pytest.mark.skipif(
        shutil.which("systemd-nspawn") is None, reason="systemd-nspawn is missing (tests/systemd/setup.sh installs systemd-container)"
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="booting a container needs root"),
    pytest.mark.skipif(not (VENV / "bin" / "python3").exists(), reason=f"{VENV} is missing (run tests/systemd/setup.sh)"),
]

E2E_UNIT = f"""\
[Unit]
Description=ppmq end-to-end check
After=ppmq.socket ppmq-subscriber@archive.socket

[Service]
Type=oneshot
ExecStart=/opt/ppmq/bin/python3 {REPO}/tests/systemd/container_check.py /results
# the container's exit, however the check went: the report tells the rest
ExecStopPost=/usr/bin/systemctl --no-block exit

[Install]
WantedBy=multi-user.target
"""


def install(tree: Path) -> None:
    """Lay out what a package and a site administrator put on the machine."""
    units = install_units(tree / "root")
    (units / "ppmq-e2e.service").write_text(E2E_UNIT)
    for unit in PARALLEL.glob("*.s*"):
        shutil.copy(unit, units)
    (units / "ppmq-render@.service.d").mkdir()
    (units / "ppmq-render@.service.d/fast.conf").write_text("[Service]\nEnvironment=RENDER_SECONDS=0.5\n")
    (units / "ppmq-subscriber@archive.service.d/idle.conf").write_text(
        f"[Service]\nExecStart=\nExecStart=/etc/ppmq/subscribers/%i --idle-exit {IDLE_EXIT_S}\n"
    )
    subprocess.run(
        [
            "systemctl",
            f"--root={tree / 'root'}",
            "enable",
            "ppmq.socket",
            "ppmq.service",
            "ppmq-subscriber@archive.socket",
            "ppmq-render.socket",
            "ppmq-e2e.service",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    etc = tree / "etc-ppmq"
    (etc / "subscribers").mkdir(parents=True)
    config = {"ServerSocket": "/run/ppmq/ppmq.sock", "DataPath": "/var/lib/ppmq", **yaml.safe_load((EXAMPLE / "ppmq.yaml").read_text())}
    # a second topic whose subscriber never listens: its messages must outlive a stop
    config["Subscribers"].append({"Name": "absent", "Socket": "/run/ppmq/sub/absent.sock"})
    config["Topics"].append({"Name": "held", "Subscribers": ["absent"], "Priorities": 2})
    render = yaml.safe_load((PARALLEL / "ppmq.yaml").read_text())
    config["Subscribers"] += render["Subscribers"]
    config["Topics"] += render["Topics"]
    (etc / "ppmq.yaml").write_text(yaml.safe_dump(config))
    shutil.copy(EXAMPLE / "archive", etc / "subscribers" / "archive")
    shutil.copy(PARALLEL / "render", etc / "subscribers" / "render")
    (tree / "bin").mkdir()
    (tree / "bin" / "ppmq").write_text('#!/bin/sh\nexec /opt/ppmq/bin/python3 -m ppmq.cli "$@"\n')
    (tree / "bin" / "ppmq").chmod(0o755)
    # An overlay whiteout: no /bin/kill, as on a minimal system without procps,
    # which the package does not depend on.
    os.mknod(tree / "bin" / "kill", stat.S_IFCHR, os.makedev(0, 0))
    (tree / "results").mkdir()


def boot(tree: Path) -> str:
    """Boot until the check unit exits the container; what went wrong, or ''."""
    return boot_container(
        [
            "--volatile=yes",
            f"--bind-ro={tree / 'root/etc/systemd/system'}:/etc/systemd/system",
            f"--bind={tree / 'etc-ppmq'}:/etc/ppmq",
            f"--bind-ro={UNITS / 'sysusers.d/ppmq.conf'}:/etc/sysusers.d/ppmq.conf",
            f"--bind-ro={UNITS / 'tmpfiles.d/ppmq.conf'}:/etc/tmpfiles.d/ppmq.conf",
            f"--bind-ro={REPO}",
            f"--bind-ro={VENV}:/opt/ppmq",
            f"--bind-ro={REPO / 'src/ppmq'}:/opt/ppmq/{SITE_PACKAGES.relative_to(VENV)}/ppmq",
            f"--overlay-ro=/usr/bin:{tree / 'bin'}:/usr/bin",
            f"--bind={tree / 'results'}:/results",
            "--boot",
            "systemd.firstboot=off",
            "systemd.unit=multi-user.target",
        ],
        BOOT_TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def container(tmp_path_factory) -> tuple[dict, str]:
    """Boot once; every test below reads the same report."""
    tree = tmp_path_factory.mktemp("nspawn")
    install(tree)
    trouble = boot(tree)
    journal = (tree / "results/journal.txt").read_text() if (tree / "results/journal.txt").exists() else ""
    report_file = tree / "results/report.json"
    assert not trouble and report_file.exists(), f"{trouble}\n{report_file.read_text() if report_file.exists() else ''}\n{journal[-8000:]}"
    return json.loads(report_file.read_text()), journal


def explain(journal: str, *units: str) -> str:
    """The journal lines of these units, for a failure message."""
    return "\n".join(line for line in journal.splitlines() if any(u in line for u in units))[-6000:]


def test_the_broker_becomes_active_only_after_it_says_ready(container):
    report, journal = container
    assert report["broker_active"], explain(journal, "ppmq")
    assert report["broker"]["StatusText"], "Type=notify: STATUS= should show in StatusText"


def test_systemd_starts_the_subscriber_on_the_brokers_connection_and_every_message_is_acked(container):
    report, journal = container
    assert report["publish"] == "ok", explain(journal, "ppmq")
    assert report["settled"], explain(journal, "ppmq")
    sub = report["subscriber_after"]
    assert sub["TriggeredBy"] == "ppmq-subscriber@archive.socket"
    assert int(sub["ExecMainStartTimestampMonotonic"]) >= int(report["broker"]["ExecMainStartTimestampMonotonic"])
    assert set(report["archived"]) == {f"first{i}" for i in range(FIRST)}
    subscriber_log = explain(journal, "archive[")
    assert "Traceback" not in subscriber_log and "RECONNECT failed" not in subscriber_log, subscriber_log


def test_reload_runs_the_check_and_keeps_the_broker_running_without_procps(container):
    report, journal = container
    assert report["kill_missing"], "the container should have no /bin/kill"
    assert report["reload"]["rc"] == 0, report["reload"]["output"] + explain(journal, "ppmq")
    after = report["after_reload"]
    assert (after["ActiveState"], after["MainPID"]) == ("active", report["broker"]["MainPID"])
    assert "Reloaded ppmq.service" in journal
    assert "config reloaded" in explain(journal, "ppmq["), explain(journal, "ppmq")


def test_a_stopped_broker_is_started_by_the_next_producer_with_nothing_lost(container):
    report, journal = container
    assert report["stop"]["rc"] == 0 and report["stopped"]["ActiveState"] == "inactive"
    assert report["socket_while_stopped"] == {"ActiveState": "active", "SubState": "listening"}
    assert report["publish_while_stopped"] == "ok", explain(journal, "ppmq")
    assert report["restarted"]["ActiveState"] == "active"
    assert report["restarted"]["MainPID"] != report["broker"]["MainPID"]
    assert report["settled_again"], explain(journal, "ppmq")
    assert set(report["archived_again"]) == {f"first{i}" for i in range(FIRST)} | {f"second{i}" for i in range(SECOND)}
    held = report["status_end"]["Topics"]["held"]
    assert (held["Stored"], held["Subscribers"]["absent"]["Ready"]) == (HELD, [HELD // 2, HELD // 2])


def test_the_broker_was_never_restarted_and_shows_its_status(container):
    report, _ = container
    assert report["broker_end"]["NRestarts"] == "0"
    assert report["broker_end"]["StatusText"]


def test_an_idle_subscriber_exits_and_systemd_does_not_start_it_again_while_nothing_is_queued(container):
    report, journal = container
    assert report["idle_after"], "the subscriber neither exited nor was restarted"
    assert report["idle_later"]["ActiveState"] == "inactive", explain(journal, "archive")


def test_a_cold_start_after_an_idle_exit_gets_what_woke_it_once(container):
    # Given the subscriber exited idle having acked all, which its RuntimeDirectory records
    report, journal = container
    assert report["acked_all_recorded"], explain(journal, "archive")
    # When a publish starts it again, Then nothing was delivered twice
    assert report["publish_cold"] == "ok", explain(journal, "ppmq")
    assert report["redelivered_cold"] == 0, explain(journal, "archive")


def test_a_subscriber_of_three_connections_runs_three_handler_processes_at_once_and_all_is_acked(container):
    # Given Connections: 3, a socket unit with Accept=yes and a handler taking 0.5 s a batch
    report, journal = container
    assert report["render_publish"] == "ok", explain(journal, "ppmq")
    # Then every message was handled and acked, by three processes, three at a time
    assert report["render_settled"], explain(journal, "render")
    assert {m["Payload"] for m in report["rendered"]} == {f"render{i}" for i in range(RENDERS)}
    assert len({m["Pid"] for m in report["rendered"]}) == 3, explain(journal, "render")
    assert report["render_most_at_once"] == 3 and len(report["render_instances"]) == 3, report["render_instances"]
    assert "Traceback" not in explain(journal, "render[")
