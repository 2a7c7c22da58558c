"""One broker per DataPath (PROTOCOL §1): a second broker, or `ppmq migrate`,
on the DataPath of a running broker refuses, naming the first one's pid, and
touches nothing of its store or journal; read-only tools go on working."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from ..conftest import WAIT_S, BrokerProcess, wait_for
from .test_cli import ENV, PPMQ, ppmq

TOPICS = [{"Name": "t", "Subscribers": ["s"]}]


def journal_segments(b: BrokerProcess) -> list[str]:
    return sorted(p.name for p in Path(b.config["DataPath"], "journal").iterdir())


def journaled_publishes(b: BrokerProcess) -> int:
    """Publish records in the segment being written (the journal flushes every batch of steps)."""
    (active,) = list(Path(b.config["DataPath"], "journal").glob("*.jsonl"))
    return sum(json.loads(line)["Event"] == "publish" for line in active.read_text().splitlines())


def test_a_second_broker_on_the_same_data_path_refuses_naming_the_first_and_touches_nothing(broker_factory, short_tmp):
    # Given a running broker with a message stored and journaled, and no subscriber yet
    b = broker_factory(TOPICS, ["s"])
    with b.client() as c:
        c.publish("t", [{"Payload": "first"}])
    wait_for(lambda: journaled_publishes(b) == 1, what="the first publish in the journal")
    segments = journal_segments(b)
    # When a second broker starts on the same DataPath, with a ServerSocket of its own
    second = short_tmp / "second.yaml"
    second.write_text(json.dumps({**b.config, "ServerSocket": str(short_tmp / "second.sock")}))
    proc = subprocess.Popen([*PPMQ, "serve", "-c", str(second)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        _, stderr = proc.communicate(timeout=WAIT_S)
    finally:
        proc.kill()
        proc.wait()
    # Then it exits 1, naming the DataPath and the first broker's pid
    assert proc.returncode == 1, stderr
    assert f"DataPath {b.config['DataPath']} is in use by ppmq pid {b.proc.pid}" in stderr
    assert "Traceback" not in stderr
    # And it touched nothing: no socket of its own, the first one's journal segment still open
    assert not (short_tmp / "second.sock").exists()
    assert journal_segments(b) == segments
    # And the first broker goes on in that segment, and delivers each message once
    with b.client() as c:
        c.publish("t", [{"Payload": "second"}])
    wait_for(lambda: journaled_publishes(b) == 2, what="the second publish in the same journal segment")
    sub = broker_factory.subscriber(b, "s")
    assert [m["Payload"] for m in sub.wait_messages(2)] == ["first", "second"]
    wait_for(lambda: b.sub_status("t", "s")["Acked"] == 2, what="both acked")
    assert b.sub_status("t", "s")["Delivered"] == 2


def test_migrate_refuses_while_a_broker_runs_and_fsck_reads_the_store_meanwhile(broker_factory):
    b = broker_factory(TOPICS, ["s"])
    with b.client() as c:
        c.publish("t", [{"Payload": "kept"}])
    r = ppmq("migrate", "-c", b.config_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert f"is in use by ppmq pid {b.proc.pid}" in r.stderr
    r = ppmq("fsck", "-c", b.config_path)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "clean (1 messages" in r.stderr
    assert b.status()["Topics"]["t"]["Stored"] == 1


def test_a_broker_killed_with_sigkill_leaves_no_lock_behind(broker_factory):
    b = broker_factory(TOPICS, ["s"])
    b.kill()
    b.start()
    assert b.status()["Topics"]["t"]["Stored"] == 0
    assert b.stop() == 0
    r = ppmq("migrate", "-c", b.config_path)
    assert r.returncode == 0, r.stderr
