"""Runs inside the booted container as a oneshot unit: drives the installed
broker and the example subscriber through systemd and writes what it saw to
RESULTS/report.json, with the journal beside it. The test on the host asserts
on the report; this side only observes, so that one failure still leaves the
rest of the picture.

    container_check.py RESULTS_DIR
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ppmq.client.library import Client
from ppmq.errors import ClientError

SERVER_SOCKET = "/run/ppmq/ppmq.sock"
ARCHIVE = Path("/var/lib/ppmq-archive/messages.jsonl")
BROKER, SUBSCRIBER = "ppmq.service", "ppmq-subscriber@archive.service"
TOPIC = "audit"  # the example subscriber's (examples/subscriber/ppmq.yaml)
FIRST, SECOND, HELD = 500, 50, 20  # messages before and after a stop; messages for a subscriber that never runs
THIRD = 10  # messages that start the subscriber again after its idle exit
RENDERS = 12  # one-message batches for the slow subscriber of three connections (examples/parallel)
RENDERED = Path("/var/lib/ppmq-render/rendered.jsonl")
WAIT_S = 20.0  # one request or systemctl call
BUDGET_S = 45.0  # all the waiting together; the host gives the whole boot 90 s


def show(unit: str, *props: str) -> dict[str, str]:
    out = subprocess.run(["systemctl", "show", unit, *(f"--property={p}" for p in props)], capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def systemctl(*args: str) -> dict[str, Any]:
    try:
        done = subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        return {"rc": None, "output": f"no answer in {WAIT_S}s"}
    return {"rc": done.returncode, "output": done.stdout + done.stderr}


def status() -> dict[str, Any]:
    try:
        with Client(SERVER_SOCKET, timeout_s=WAIT_S) as c:
            return c.request({"Command": "STATUS"}).body
    except ClientError as exc:
        return {"error": str(exc)}


def publish(topic: str, payloads: list[Any], priorities: int = 2) -> str:
    try:
        with Client(SERVER_SOCKET, timeout_s=WAIT_S) as c:
            c.publish(topic, [{"Payload": p, "Priority": i % priorities} for i, p in enumerate(payloads)])
        return "ok"
    except ClientError as exc:
        return str(exc)


def archive_settled(acked: int) -> dict[str, Any] | None:
    s = status().get("Topics", {}).get(TOPIC, {}).get("Subscribers", {}).get("archive")
    return s if s and s["Acked"] >= acked and s["InFlight"] == 0 and not any(s["Ready"]) else None


def archived() -> list[Any]:
    return [json.loads(line)["Payload"] for line in ARCHIVE.read_text().splitlines()] if ARCHIVE.exists() else []


class Report:
    """What was seen so far, saved after every step: a container killed for taking
    too long still leaves its report and journal."""

    def __init__(self, results: Path) -> None:
        self.results = results
        self.data: dict[str, Any] = {}
        self.deadline = time.monotonic() + BUDGET_S

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key] = value
        (self.results / "report.json").write_text(json.dumps(self.data, indent=1))
        journal = subprocess.run(["journalctl", "-b", "--no-pager", "-o", "short-monotonic"], capture_output=True, text=True)
        (self.results / "journal.txt").write_text(journal.stdout + journal.stderr)

    def wait(self, predicate: Callable[[], Any]) -> Any:
        """Poll until true or the budget is spent; returns the last value."""
        while not (value := predicate()) and time.monotonic() < self.deadline:
            time.sleep(0.1)
        return value


def main(results: Path) -> None:
    report = Report(results)
    props = ("ActiveState", "SubState", "MainPID", "StatusText", "NRestarts", "ExecMainStartTimestampMonotonic")
    report["broker_active"] = bool(report.wait(lambda: show(BROKER, "ActiveState")["ActiveState"] == "active"))
    report["broker"] = show(BROKER, *props)
    if not report.data["broker_active"]:
        return
    report["subscriber"] = show(SUBSCRIBER, "TriggeredBy", *props)
    report["publish"] = publish(TOPIC, [f"first{i}" for i in range(FIRST)])
    report["publish_held"] = publish("held", [f"held{i}" for i in range(HELD)])
    report["settled"] = report.wait(lambda: archive_settled(FIRST))
    report["subscriber_after"] = show(SUBSCRIBER, "TriggeredBy", *props)
    report["archived"] = archived()

    report["kill_missing"] = shutil.which("kill") is None and not Path("/bin/kill").exists()
    report["reload"] = systemctl("reload", BROKER)
    report["after_reload"] = show(BROKER, *props)

    report["stop"] = systemctl("stop", BROKER)
    report["stopped"] = show(BROKER, *props)
    report["socket_while_stopped"] = show("ppmq.socket", "ActiveState", "SubState")
    report["publish_while_stopped"] = publish(TOPIC, [f"second{i}" for i in range(SECOND)])
    report["restarted"] = show(BROKER, *props)
    report["settled_again"] = report.wait(lambda: archive_settled(FIRST + SECOND))
    report["archived_again"] = archived()
    report["status_end"] = status()
    report["broker_end"] = show(BROKER, *props)

    # the subscriber runs with --idle-exit IDLE_EXIT_S: nothing more comes, so it should exit and stay down
    idle = show(SUBSCRIBER, "InvocationID", "ActiveState")
    report["idle_before"] = idle
    report["idle_after"] = report.wait(lambda: (now := show(SUBSCRIBER, "InvocationID", "ActiveState")) != idle and now)
    time.sleep(1.0)
    report["idle_later"] = show(SUBSCRIBER, "InvocationID", "ActiveState")
    # that idle exit acked all it was given, as its RuntimeDirectory records: the
    # next start sends no RECONNECT, and what woke it comes once
    report["acked_all_recorded"] = Path("/run/ppmq-subscriber/archive/acked-all").exists()
    redelivered = status()["Topics"][TOPIC]["Subscribers"]["archive"]["Redelivered"]
    report["publish_cold"] = publish(TOPIC, [f"third{i}" for i in range(THIRD)])
    cold = report.wait(lambda: archive_settled(FIRST + SECOND + THIRD))
    report["redelivered_cold"] = cold and cold["Redelivered"] - redelivered
    check_parallel(report)


def running_renders() -> list[str]:
    """The ppmq-render@ instances running now: one per connection (Accept=yes)."""
    out = subprocess.run(
        ["systemctl", "list-units", "ppmq-render@*", "--state=running", "--no-legend", "--plain"], capture_output=True, text=True
    ).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def check_parallel(report: Report) -> None:
    """Connections: 3 to a socket unit with Accept=yes, and a slow handler."""
    report.deadline = time.monotonic() + BUDGET_S / 3
    report["render_publish"] = publish("renders", [f"render{i}" for i in range(RENDERS)], priorities=1)
    seen: set[str] = set()
    most = 0

    def settled() -> dict[str, Any] | None:
        nonlocal most
        running = running_renders()
        seen.update(running)
        most = max(most, len(running))
        s = status().get("Topics", {}).get("renders", {}).get("Subscribers", {}).get("render")
        return s if s and s["Acked"] >= RENDERS and s["InFlight"] == 0 else None

    report["render_settled"] = report.wait(settled)
    report["render_instances"] = sorted(seen)
    report["render_most_at_once"] = most
    report["rendered"] = [json.loads(line) for line in RENDERED.read_text().splitlines()] if RENDERED.exists() else []


if __name__ == "__main__":
    main(Path(sys.argv[1]))
