"""The broker's Requeue op, PHPMQ's re-queue (PROTOCOL §9): to the end of its
priority, with a new TTL, as a delivery attempt; refused by its access check."""

from __future__ import annotations

import msgspec
import pytest

from ppmq import protocol as p
from ppmq.fsck import check, read_snapshot
from ppmq.ops import Requeue
from ppmq.state import NS

from .test_broker import NOW, open_broker, publish


def allowed() -> None:
    return None


def refused() -> None:
    raise p.Forbidden("Nacks: uid 1 may not act as subscriber 's' (Users)")


def delivered_keys(step) -> list[str]:
    return [m["Key"] for d in step.deliveries for m in msgspec.json.decode(d.frame)["Messages"]]


def test_a_requeued_message_goes_to_the_end_of_its_priority_with_its_new_ttl_and_keeps_its_key(tmp_path):
    # Given three messages with a TTL, the first two in flight to s
    broker, store = open_broker(tmp_path, expire=True, window=2)
    msgs = [p.Message(payload=msgspec.Raw(b'"%d"' % i), ttl_s=60) for i in range(3)]
    broker.step([p.Request(topic="t", messages=msgs)], set(), NOW)
    first = broker.step([], {"s"}, NOW)
    taken = delivered_keys(first)
    # When the first is re-queued with a TTL of 3600 seconds, and the other acked
    later = NOW + 10 * NS
    step = broker.step([Requeue("t", "s", taken[0], 3600, allowed), p.Request(topic="t", subscriber="s", acks=[taken[1]])], set(), later)
    # Then it comes after the third message, with the same key, the new Expires and a second attempt
    assert step.replies[0].accepted == 1
    again = broker.step([], {"s"}, later)
    messages = [m for d in again.deliveries for m in msgspec.json.decode(d.frame)["Messages"]]
    assert [m["Key"] for m in messages] == ["3", taken[0]]
    assert messages[1]["Expires"] == p.format_expires(later + 3600 * NS)
    with store.write() as txn:
        t, s = broker.state.topic_ids["t"], broker.state.sub_ids["s"]
        assert txn.get_body(t, int(taken[0])).expires_ns == later + 3600 * NS
        assert txn.get_inflight(t, s, int(taken[0])).attempts == 2
    store.close()
    assert check(read_snapshot(str(tmp_path)), broker.config) == []


def test_a_requeue_with_ttl_0_leaves_the_message_without_expiry(tmp_path):
    broker, store = open_broker(tmp_path, expire=True)
    broker.step([p.Request(topic="t", messages=[p.Message(payload=msgspec.Raw(b"1"), ttl_s=5)])], set(), NOW)
    (key,) = delivered_keys(broker.step([], {"s"}, NOW))
    broker.step([Requeue("t", "s", key, 0, allowed)], set(), NOW)
    # Then it outlives its first TTL
    broker.step([], set(), NOW + 10 * NS)
    (again,) = broker.step([], {"s"}, NOW + 10 * NS).deliveries
    assert "Expires" not in msgspec.json.decode(again.frame)["Messages"][0]
    store.close()


def test_a_requeue_after_max_attempts_gives_the_message_up(tmp_path):
    broker, store = open_broker(tmp_path, max_attempts=1)
    broker.step([publish(b"1")], set(), NOW)
    (key,) = delivered_keys(broker.step([], {"s"}, NOW))
    broker.step([Requeue("t", "s", key, 60, allowed)], set(), NOW)
    assert broker.state.subs["t"]["s"].dead_lettered == 1
    assert broker.state.topics["t"].stored == 0
    store.close()


def test_a_requeue_of_a_key_not_in_flight_changes_nothing_and_is_counted_ignored(tmp_path):
    broker, store = open_broker(tmp_path)
    broker.step([publish(b"1")], set(), NOW)
    step = broker.step([Requeue("t", "s", "1", 60, allowed)], set(), NOW)
    assert step.replies[0].status == 200 and step.replies[0].accepted == 0
    assert broker.state.subs["t"]["s"].ignored_acks == 1
    assert broker.state.subs["t"]["s"].ready == [1]
    store.close()


@pytest.mark.parametrize("op", [Requeue("t", "s", "1", 60, refused), Requeue("gone", "s", "1", 60, allowed)])
def test_a_refused_requeue_is_answered_with_its_error_and_counted_rejected(tmp_path, op):
    broker, store = open_broker(tmp_path)
    broker.step([publish(b"1")], set(), NOW)
    broker.step([], {"s"}, NOW)
    step = broker.step([op], set(), NOW)
    assert step.replies[0].status in (403, 404)
    assert broker.state.rejected == 1
    assert broker.state.subs["t"]["s"].inflight == 1
    store.close()
