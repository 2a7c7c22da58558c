"""Publish and deliver through a real `ppmq serve`: PROTOCOL §3 end to end."""

from __future__ import annotations

import time

import pytest

from ppmq.client import ClientError

from ..conftest import wait_for


def test_every_subscriber_of_a_topic_receives_every_message_once_acked_it_is_gone(broker_factory):
    # Given a topic with two subscribers that ack on the delivery connection
    b = broker_factory([{"Name": "t", "Subscribers": ["a", "b"]}], ["a", "b"])
    a, bb = broker_factory.subscriber(b, "a"), broker_factory.subscriber(b, "b")
    # When 250 messages are published in three requests
    with b.client() as c:
        for start in (0, 100, 200):
            n = min(100, 250 - start)
            assert c.publish("t", [{"Payload": f"m{i}"} for i in range(start, start + n)]) == n
    # Then both receive all of them, in publish order, and the store ends empty
    for sub in (a, bb):
        sub.wait_messages(250)
        assert sub.payloads() == [f"m{i}" for i in range(250)]
    wait_for(lambda: b.status()["Topics"]["t"]["Stored"] == 0, what="store to empty")
    st = b.status()["Topics"]["t"]
    assert st["Published"] == 250
    for name in ("a", "b"):
        s = st["Subscribers"][name]
        assert (s["Delivered"], s["Acked"], s["InFlight"], s["Ready"]) == (250, 250, 0, [0])


def test_a_backlog_published_before_the_subscriber_appears_arrives_by_priority_then_order(broker_factory):
    b = broker_factory([{"Name": "t", "Priorities": 3, "Subscribers": ["s"]}], [{"Name": "s", "BatchSize": 7}])
    with b.client() as c:
        c.publish("t", [{"Payload": i, "Priority": (i * 7) % 3} for i in range(60)])
    assert b.sub_status("t", "s")["Ready"] == [20, 20, 20]
    sub = broker_factory.subscriber(b, "s")
    got = [m["Payload"] for m in sub.wait_messages(60)]
    expected = sorted(range(60), key=lambda i: ((i * 7) % 3, i))
    assert got == expected
    assert all(len(batch["Messages"]) <= 7 for batch in sub.batches)


def test_generated_keys_are_unique_and_never_reused_across_a_restart(broker_factory):
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"])
    sub = broker_factory.subscriber(b, "s")
    with b.client() as c:
        c.publish("t", [{"Payload": i, "Key": "ignored"} for i in range(5)])
    sub.wait_messages(5)
    assert b.stop() == 0
    b.start()
    with b.client() as c:
        c.publish("t", [{"Payload": i} for i in range(5, 10)])
    keys = [m["Key"] for m in sub.wait_messages(10)]
    assert len(set(keys)) == 10 and "ignored" not in keys
