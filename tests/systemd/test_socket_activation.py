"""The example subscriber started the way systemd starts it: by
systemd-socket-activate, which listens on the subscriber's socket and runs the
program only when the broker first connects, passing the socket as fd 3 named
`ppmq` (what FileDescriptorName=ppmq does in ppmq-subscriber@.socket)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.systemd.layout import EXAMPLE
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
        [ACTIVATE, "-l", sock, "--fdname=ppmq", "-E", "PPMQ_CONFIG", "-E", "STATE_DIRECTORY", sys.executable, str(EXAMPLE / "archive")], env=env, stdout=log, stderr=subprocess.STDOUT,
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
