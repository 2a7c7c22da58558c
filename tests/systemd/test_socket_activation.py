"""The example subscribers started the way systemd starts them: by
systemd-socket-activate, which listens on the subscriber's socket and runs the
program only when the broker first connects, passing the socket as fd 3 named
`ppmq` (what FileDescriptorName=ppmq does in ppmq-subscriber@.socket); or, with
--accept (Accept=yes), runs one process per connection, passing it as fd 3."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import wait_for
from tests.systemd.layout import EXAMPLE, PARALLEL

ACTIVATE = shutil.which("systemd-socket-activate")

pytestmark = pytest.mark.skipif(ACTIVATE is None, reason="systemd-socket-activate is missing (apt-get install systemd)")


def command_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_the_example_starts_on_the_brokers_first_connection_and_acks_every_message(broker_factory, short_tmp):
    b = broker_factory([{"Name": "events", "Subscribers": ["archive"], "Priorities": 2}], ["archive"], start=False)
    state = short_tmp / "state"
    state.mkdir()
    sock = b.sub_socket("archive")
    os.makedirs(os.path.dirname(sock), exist_ok=True)
    env = {**os.environ, "PPMQ_CONFIG": str(b.config_path), "STATE_DIRECTORY": str(state)}
    log = open(short_tmp / "archive.log", "wb")
    activator = subprocess.Popen(
        [ACTIVATE, "-l", sock, "--fdname=ppmq", "-E", "PPMQ_CONFIG", "-E", "STATE_DIRECTORY", sys.executable, str(EXAMPLE / "archive")],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        # Given the activator listening and the broker not yet running: nothing started
        wait_for(lambda: os.path.exists(sock), what="the activator's socket")
        assert "systemd-socket-activate" in command_of(activator.pid)
        b.start()
        with b.client() as c:
            c.publish("events", [{"Payload": f"p{i}", "Priority": i % 2} for i in range(300)])
        # Then the example ran (the activator exec'd it) and acked every message
        wait_for(lambda: "archive" in command_of(activator.pid), what="the example to be started")
        wait_for(lambda: b.sub_status("events", "archive")["Acked"] >= 300, what="300 acks")
        s = b.sub_status("events", "archive")
        assert (s["InFlight"], s["Ready"]) == (0, [0, 0])
        lines = [json.loads(line) for line in (state / "messages.jsonl").read_text().splitlines()]
        assert {m["Payload"] for m in lines} == {f"p{i}" for i in range(300)}
        assert all(m["Topic"] == "events" and m["Priority"] == int(m["Payload"][1:]) % 2 for m in lines)
    finally:
        activator.terminate()
        activator.wait(timeout=10)
        log.close()
    assert "Traceback" not in (short_tmp / "archive.log").read_text()


def passed(env: dict[str, str]) -> list[str]:
    """-E options for what the children need: the activator passes nothing else
    (PYTHONPATH: the checkout under test rather than an installed ppmq)."""
    names = ("PPMQ_CONFIG", "STATE_DIRECTORY", "RUNTIME_DIRECTORY", "RENDER_SECONDS", "PYTHONPATH")
    return [arg for name in names if name in env for arg in ("-E", name)]


def rendered(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def overlapping(lines: list[dict]) -> int:
    """The most batches handled at one moment."""
    batches = {(m["Pid"], m["Began"], m["Ended"]) for m in lines}
    return max(sum(b <= began < e for _, b, e in batches) for _, began, _ in batches)


def test_with_accept_each_connection_runs_its_own_handler_and_three_work_at_once(broker_factory, short_tmp):
    # Given the parallel example behind systemd-socket-activate --accept (a process
    # per connection, passed as fd 3) and its subscriber with Connections: 3
    render = yaml.safe_load((PARALLEL / "ppmq.yaml").read_text())
    subs = [{k: v for k, v in sub.items() if k != "Socket"} for sub in render["Subscribers"]]  # one of the test's own
    b = broker_factory(render["Topics"], subs, start=False)
    state = short_tmp / "state"
    state.mkdir()
    sock = b.sub_socket("render")
    os.makedirs(os.path.dirname(sock), exist_ok=True)
    env = {**os.environ, "PPMQ_CONFIG": str(b.config_path), "STATE_DIRECTORY": str(state), "RENDER_SECONDS": "0.3"}
    log = open(short_tmp / "render.log", "wb")
    activator = subprocess.Popen(
        [ACTIVATE, "--accept", "-l", sock, *passed(env), sys.executable, str(PARALLEL / "render")],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: os.path.exists(sock), what="the activator's socket")
        b.start()
        # When 30 one-message batches are published
        with b.client() as c:
            c.publish("renders", [{"Payload": f"r{i}"} for i in range(30)])
        # Then every message is acked, handled by three processes, three at a time
        wait_for(lambda: b.sub_status("renders", "render")["Acked"] >= 30, what="30 acks")
        lines = rendered(state / "rendered.jsonl")
        assert {m["Payload"] for m in lines} == {f"r{i}" for i in range(30)}
        assert len({m["Pid"] for m in lines}) == 3
        assert overlapping(lines) == 3
    finally:
        activator.terminate()
        activator.wait(timeout=10)
        log.close()
        print((short_tmp / "render.log").read_text(), b.log)  # shown when it failed
    assert "Traceback" not in (short_tmp / "render.log").read_text()


def test_a_cold_start_after_an_idle_exit_gets_the_batch_that_woke_it_once(broker_factory, short_tmp):
    b = broker_factory([{"Name": "events", "Subscribers": ["archive"]}], ["archive"], start=False)
    state, runtime = short_tmp / "state", short_tmp / "run"
    state.mkdir()
    runtime.mkdir()
    sock = b.sub_socket("archive")
    os.makedirs(os.path.dirname(sock), exist_ok=True)
    env = {**os.environ, "PPMQ_CONFIG": str(b.config_path), "STATE_DIRECTORY": str(state), "RUNTIME_DIRECTORY": str(runtime)}
    record = runtime / "acked-all"

    def run(payloads: list[str], first: bool = False) -> None:
        """systemd-socket-activate listens, the broker's connection for `payloads`
        starts the example, and the example exits idle."""
        log = open(short_tmp / "archive.log", "ab")
        activator = subprocess.Popen(
            [ACTIVATE, "-l", sock, "--fdname=ppmq", *passed(env), sys.executable, str(EXAMPLE / "archive"), "--idle-exit", "1"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(lambda: os.path.exists(sock), what="the activator's socket")
            if first:
                b.start()
            with b.client() as c:
                c.publish("events", [{"Payload": p} for p in payloads])
            assert activator.wait(timeout=60) == 0, "the example did not exit idle"
        finally:
            if activator.poll() is None:
                activator.kill()
            log.close()

    # Given a first run, which finds no record and sends RECONNECT, and exits idle having acked all
    run(["a1", "a2", "a3"], first=True)
    assert record.exists()
    before = b.sub_status("events", "archive")
    # When the broker's next connection starts it again
    run(["b1", "b2", "b3"])
    # Then what woke it came once: no redelivery, each line once, and the record written anew
    after = b.sub_status("events", "archive")
    assert (after["Acked"], after["InFlight"], after["Redelivered"]) == (6, 0, before["Redelivered"])
    lines = [json.loads(line)["Payload"] for line in (state / "messages.jsonl").read_text().splitlines()]
    assert sorted(p for p in lines if p.startswith("b")) == ["b1", "b2", "b3"]
    assert record.exists()
    assert "Traceback" not in (short_tmp / "archive.log").read_text()
