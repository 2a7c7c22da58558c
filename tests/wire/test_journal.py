"""The delivery journal of a real broker: what a workload leaves under DataPath/journal/."""

from __future__ import annotations

import gzip
import json
import socket
from pathlib import Path

from ..conftest import wait_for


def journal_records(data_path: str) -> list[dict]:
    """Every record of a stopped broker's journal, in order."""
    out = []
    for path in sorted(Path(data_path, "journal").iterdir()):
        assert path.name.endswith(".jsonl.gz"), f"a stopped broker leaves only closed segments: {path.name}"
        out += [json.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()]
    return out


def of(records: list[dict], event: str, **match: str) -> list[dict]:
    return [r for r in records if r["Event"] == event and all(r.get(k) == v for k, v in match.items())]


def column(records: list[dict], name: str) -> list:
    """A column of every record, a column written once (all its entries equal) as many times as the record has ids."""
    return [v for r in records for v in (r[name] * len(r["Ids"]) if len(r[name]) == 1 else r[name])]


def test_publish_deliver_and_ack_are_journaled_with_their_times(broker_factory) -> None:
    """Given a subscriber that acks every batch, when 30 messages pass through,
    then the journal has each message published, delivered once and acked, with
    the publish time carried to the delivery, and the ack after it."""
    b = broker_factory([{"Name": "t", "Subscribers": ["a"], "Priorities": 2}], ["a"])
    sub = broker_factory.subscriber(b, "a")
    with b.client() as c:
        for i in range(3):
            c.publish("t", [{"Payload": f"m{i}-{j}", "Priority": j % 2} for j in range(10)])
    sub.wait_messages(30)
    wait_for(lambda: b.sub_status("t", "a")["Acked"] == 30, what="30 acks")
    assert b.stop() == 0
    records = journal_records(b.config["DataPath"])
    assert {r["V"] for r in records} == {2}
    assert {r["Host"] for r in records} == {socket.gethostname()}
    published = of(records, "publish", Topic="t")
    ids = column(published, "Ids")
    assert sorted(ids) == sorted(int(m["Key"]) for m in sub.messages)
    assert column(published, "Prio") == [j // 5 for _ in range(3) for j in range(10)]  # a publish's ids go by priority
    assert column(published, "Replaced") == [False] * 30
    pub_ns = {m: r["Ts"] for r in published for m in r["Ids"]}
    delivered = of(records, "deliver", Topic="t", Subscriber="a")
    assert sorted(column(delivered, "Ids")) == sorted(ids)
    assert column(delivered, "Attempts") == [1] * 30
    assert all(p == pub_ns[m] <= r["Ts"] for r in delivered for m, p in zip(r["Ids"], column([r], "PubNs")))
    acked = of(records, "ack", Topic="t", Subscriber="a")
    assert sorted(column(acked, "Ids")) == sorted(ids)
    assert all(set(r) == {"V", "Host", "Event", "Ts", "Topic", "Subscriber", "Ids"} for r in acked), "an ack has its ids only"
    assert all(pub_ns[m] < r["Ts"] for r in acked for m in r["Ids"])
    sizes = dict(zip(column(published, "Ids"), column(published, "Bytes")))
    assert dict(zip(column(delivered, "Ids"), column(delivered, "Bytes"))) == sizes
    assert all(len(json.dumps(m, separators=(",", ":"))) == sizes[int(m["Key"])] for m in map(_without_topic, sub.messages))


def _without_topic(m: dict) -> dict:
    return {k: v for k, v in m.items() if k != "Topic"}


def test_replacements_expiries_rejections_and_redeliveries_are_journaled(broker_factory) -> None:
    """Given a dedupe topic nobody listens to and a subscriber that does not ack,
    when keys are replaced, a message expires, a publish is rejected and the
    subscriber reconnects, then each leaves its record."""
    b = broker_factory(
        [
            {"Name": "d", "Dedupe": True, "Expire": True, "Subscribers": ["away"]},
            {"Name": "r", "Subscribers": ["slow"]},
        ],
        ["away", "slow"],
    )
    slow = broker_factory.subscriber(b, "slow", ack=None)
    with b.client() as c:
        for version in range(3):
            c.publish("d", [{"Key": "k", "Payload": version}])
        c.publish("d", [{"Key": "e", "Payload": "soon gone", "TTL": 0.2}])
        c.publish("r", [{"Payload": i} for i in range(4)])
        slow.wait_messages(4)
        c.reconnect("slow")
        slow.wait_messages(8)
        c.ack("r", "slow", [m["Key"] for m in slow.messages[4:]])
    wait_for(lambda: b.status()["Topics"]["d"]["Expired"] == 1, what="the expiry")
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(b.socket)
        s.sendall(b'{"Id": 1, "Topic": "r", "Messages": [{"Payload": 1}, {"Payload": 2, "Priority": 7}]}\n')
        assert b'"Status":400' in s.makefile("rb").readline()
    assert b.stop() == 0
    records = journal_records(b.config["DataPath"])
    assert column(of(records, "publish", Topic="d"), "Replaced") == [False, True, True, False]
    [expired] = of(records, "expire", Topic="d", Subscriber="away")
    assert expired["Delivered"] == [False]
    assert expired["Ids"] == [column(of(records, "publish", Topic="d"), "Ids")[3]]
    [requeue] = of(records, "requeue", Topic="r", Subscriber="slow")
    assert requeue["Reason"] == "Reconnect" and sorted(requeue["Ids"]) == sorted(int(m["Key"]) for m in slow.messages[:4])
    assert sorted(column(of(records, "deliver", Topic="r"), "Attempts")) == [1] * 4 + [2] * 4
    redelivered = [m for r in of(records, "deliver", Topic="r") for m, a in zip(r["Ids"], column([r], "Attempts")) if a == 2]
    assert sorted(column(of(records, "ack", Topic="r"), "Ids")) == sorted(redelivered)
    [rejected] = of(records, "reject")
    assert rejected["Topic"] == "r" and rejected["Status"] == 400 and rejected["Count"] == 2
    assert "Messages[1].Priority" in rejected["Error"]
    assert not of(records, "publish", Topic="r")[1:], "the rejected publish stored nothing"


def test_the_journal_can_be_turned_off(broker_factory) -> None:
    b = broker_factory([{"Name": "t", "Subscribers": ["a"]}], ["a"], Journal={"Enabled": False})
    with b.client() as c:
        c.publish("t", [{"Payload": 1}])
    assert b.stop() == 0
    assert not Path(b.config["DataPath"], "journal").exists()


def test_overflow_drops_and_dead_letters_are_journaled(broker_factory) -> None:
    """Given a topic that keeps 2 messages and drops the oldest, and one that gives
    up on a message after one delivery, then the journal says what was dropped
    and what went to the dead-letter topic."""
    b = broker_factory(
        [
            {"Name": "small", "MaxMessages": 2, "OverflowPolicy": "drop-oldest", "Subscribers": ["away"]},
            {"Name": "once", "MaxAttempts": 1, "DeadLetter": "dead", "Subscribers": ["slow"]},
            {"Name": "dead"},
        ],
        ["away", "slow"],
    )
    slow = broker_factory.subscriber(b, "slow", ack=None)
    with b.client() as c:
        c.publish("small", [{"Payload": i} for i in range(3)])
        c.publish("once", [{"Payload": "x"}])
        slow.wait_messages(1)
        c.reconnect("slow")
    assert b.stop() == 0
    records = journal_records(b.config["DataPath"])
    first = column(of(records, "publish", Topic="small"), "Ids")[0]
    [overflow] = of(records, "overflow", Topic="small", Subscriber="away")
    assert (overflow["Ids"], overflow["Delivered"]) == ([first], [False])
    [given_up] = of(records, "requeue", Topic="once", Subscriber="slow")
    assert given_up["Reason"] == "MaxAttempts" and given_up["Ids"] == [int(slow.messages[0]["Key"])]
