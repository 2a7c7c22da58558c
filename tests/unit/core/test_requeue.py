"""The broker's Requeue op, PHPMQ's re-queue (PROTOCOL §9): to the end of its
priority, with a new TTL, as a delivery attempt; refused by its access check."""

from __future__ import annotations

import logging

import msgspec
import pytest

from ppmq.core.broker import Broker
from ppmq.core.ops import Requeue
from ppmq.errors import Forbidden
from ppmq.protocol import messages as p
from ppmq.store.fsck import check, read_snapshot
from ppmq.store.peek import parts_of, peek
from ppmq.store.state import NS
from ppmq.store.store import Store

from .test_broker import NOW, open_broker, publish, two_subscribers


def allowed() -> None:
    return None


def refused() -> None:
    raise Forbidden("Nacks: uid 1 may not act as subscriber 's' (Users)")


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


def test_a_requeue_that_fails_on_a_bug_after_it_wrote_is_answered_500_and_logged_and_leaves_the_message_in_flight(
    tmp_path, monkeypatch, caplog
):
    # Given a message in flight to s, and a re-queue that moves it, then fails on a bug
    broker, store = open_broker(tmp_path)
    broker.step([publish(b"1")], set(), NOW)
    (key,) = delivered_keys(broker.step([], {"s"}, NOW))
    give_back = broker._settlement.give_back

    def give_back_then_fail(*args, **kwargs):
        give_back(*args, **kwargs)
        raise RuntimeError("a bug after the writes")

    monkeypatch.setattr(broker._settlement, "give_back", give_back_then_fail)
    # When PHPMQ re-queues it
    with caplog.at_level(logging.ERROR, logger="ppmq.broker"):
        step = broker.step([Requeue("t", "s", key, 60, allowed)], set(), NOW)
    # Then the re-queue is answered 500, counted rejected, its traceback logged once, and undone
    assert (step.replies[0].status, step.replies[0].error) == (500, "internal error: RuntimeError: a bug after the writes")
    assert [r.exc_info[0] for r in caplog.records if r.exc_info] == [RuntimeError]
    assert broker.state.rejected == 1
    assert (broker.state.subs["t"]["s"].inflight, broker.state.subs["t"]["s"].ready) == (1, [0])
    # And once the bug is gone, the next re-queue takes it back to ready
    monkeypatch.undo()
    assert broker.step([Requeue("t", "s", key, 60, allowed)], set(), NOW).replies[0].accepted == 1
    assert (broker.state.subs["t"]["s"].inflight, broker.state.subs["t"]["s"].ready) == (0, [1])
    store.close()
    assert check(read_snapshot(str(tmp_path)), broker.config) == []


# --- the re-queuing subscriber's copy alone (PROTOCOL §9 PHPMQ re-queue and other subscribers) ---


def shared(tmp_path, ttl_s: int) -> tuple[Broker, Store, str]:
    """A message with a TTL, held by s and r, in flight to s alone."""
    store = Store(str(tmp_path), sync=False, max_bytes=1 << 24)
    broker = Broker(two_subscribers(tmp_path, expire=True), store, NOW)
    broker.step([p.Request(topic="t", messages=[p.Message(payload=msgspec.Raw(b'"m"'), ttl_s=ttl_s)])], set(), NOW)
    (key,) = delivered_keys(broker.step([], {"s"}, NOW))
    return broker, store, key


def messages_to(step, sub: str) -> list[dict]:
    return [m for d in step.deliveries if d.subscriber == sub for m in msgspec.json.decode(d.frame)["Messages"]]


def consistent(broker, store, tmp_path) -> list[str]:
    store.close()
    return check(read_snapshot(str(tmp_path)), broker.config)


def test_a_requeue_gives_its_subscribers_copy_the_new_ttl_and_the_other_copy_keeps_its_expiry(tmp_path):
    # Given a message with a TTL of 60 s, held by s and r, in flight to s
    broker, store, key = shared(tmp_path, 60)
    # When s re-queues it with a TTL of 1 s
    assert broker.step([Requeue("t", "s", key, 1, allowed)], set(), NOW).replies[0].accepted == 1
    # Then after 2 s s's copy has expired, and r's has not: r gets it with the producer's Expires
    later = NOW + 2 * NS
    step = broker.step([], {"r", "s"}, later)
    assert (broker.state.subs["t"]["s"].expired, broker.state.subs["t"]["r"].expired) == (1, 0)
    assert messages_to(step, "s") == []
    assert [m["Expires"] for m in messages_to(step, "r")] == [p.format_expires(NOW + 60 * NS)]
    assert broker.state.topics["t"].stored == 1
    assert consistent(broker, store, tmp_path) == []


def test_a_requeue_with_ttl_0_keeps_its_copy_past_the_producers_expiry_but_not_the_other(tmp_path):
    # Given a message with a TTL of 5 s, held by s and r, in flight to s
    broker, store, key = shared(tmp_path, 5)
    # When s re-queues it with a TTL of 0 (no expiry)
    broker.step([Requeue("t", "s", key, 0, allowed)], set(), NOW)
    # Then after 10 s r's copy has expired, and s gets its copy again, with no Expires
    later = NOW + 10 * NS
    step = broker.step([], {"r", "s"}, later)
    assert (broker.state.subs["t"]["s"].expired, broker.state.subs["t"]["r"].expired) == (0, 1)
    (again,) = messages_to(step, "s")
    assert again["Key"] == key and "Expires" not in again
    assert messages_to(step, "r") == []
    with store.write() as txn:  # and PEEK shows s's copy without one
        t, s = broker.state.topic_ids["t"], broker.state.sub_ids["s"]
        assert [m["Expires"] for m in peek(txn, t, {"s": s}, parts_of(None), 10, None)["Messages"]] == [None]
    assert consistent(broker, store, tmp_path) == []  # the message's own expiry, passed, is out of its index
    # And once s acks it, it is gone
    store = Store(str(tmp_path), sync=False, max_bytes=1 << 24)
    broker = Broker(two_subscribers(tmp_path, expire=True), store, later)
    broker.step([p.Request(topic="t", subscriber="s", acks=[key])], set(), later)
    assert broker.state.topics["t"].stored == 0
    assert consistent(broker, store, tmp_path) == []


def test_a_copy_requeued_behind_other_messages_goes_out_with_its_own_expiry_in_the_same_run(tmp_path):
    # Given a message with a TTL of 60 s, held by s and r, in flight to s
    broker, store, key = shared(tmp_path, 60)
    # When s re-queues it with a TTL of 3600 s, and behind it two more messages are published
    broker.step([Requeue("t", "s", key, 3600, allowed)], set(), NOW)
    broker.step([p.Request(topic="t", messages=[p.Message(payload=msgspec.Raw(b'"n"')) for _ in range(2)])], set(), NOW)
    # Then s is given it again, in the same run, with its own Expires, and r with the producer's
    later = NOW + 61 * NS
    step = broker.step([], {"r", "s"}, NOW + NS)
    assert [m["Expires"] for m in messages_to(step, "s") if m["Key"] == key] == [p.format_expires(NOW + 3600 * NS)]
    assert [m["Expires"] for m in messages_to(step, "r") if m["Key"] == key] == [p.format_expires(NOW + 60 * NS)]
    # And past 60 s only r's copy is expired by the sweep, s's is still in flight
    broker.step([], set(), later)
    assert (broker.state.subs["t"]["s"].expired, broker.state.subs["t"]["r"].expired) == (0, 1)
    assert broker.state.subs["t"]["s"].inflight == 3
    assert consistent(broker, store, tmp_path) == []


def test_a_copys_own_expiry_survives_a_restart_and_goes_with_its_ack(tmp_path):
    # Given s's copy re-queued with a TTL of 3600 s, r's with the producer's 60 s
    broker, store, key = shared(tmp_path, 60)
    broker.step([Requeue("t", "s", key, 3600, allowed)], set(), NOW)
    store.close()
    # When the broker starts again, and s takes and acks it
    store = Store(str(tmp_path), sync=False, max_bytes=1 << 24)
    broker = Broker(two_subscribers(tmp_path, expire=True), store, NOW)
    (again,) = messages_to(broker.step([], {"s"}, NOW), "s")
    assert again["Expires"] == p.format_expires(NOW + 3600 * NS)
    broker.step([p.Request(topic="t", subscriber="s", acks=[key])], set(), NOW)
    # Then its own expiry is gone with it, and r's copy still expires at 60 s
    with store.write() as txn:
        assert txn.copy_expiries(broker.state.topic_ids["t"], broker.state.sub_ids["s"]) == {}
    broker.step([], set(), NOW + 61 * NS)
    assert (broker.state.subs["t"]["r"].expired, broker.state.topics["t"].stored) == (1, 0)
    assert consistent(broker, store, tmp_path) == []


def test_a_new_version_of_a_deduped_message_takes_every_copy_back_to_its_expiry(tmp_path):
    # Given s's copy of key k re-queued with no expiry, r's with the producer's 60 s
    store = Store(str(tmp_path), sync=False, max_bytes=1 << 24)
    broker = Broker(two_subscribers(tmp_path, expire=True, dedupe=True), store, NOW)
    version = lambda body, ttl_s: p.Request(topic="t", messages=[p.Message(key="k", payload=msgspec.Raw(body), ttl_s=ttl_s)])  # noqa: E731
    broker.step([version(b"1", 60)], set(), NOW)
    broker.step([], {"s"}, NOW)
    broker.step([Requeue("t", "s", "k", 0, allowed)], set(), NOW)
    # When a new version with a TTL of 5 s replaces it
    broker.step([version(b"2", 5)], set(), NOW)
    # Then both copies expire with it
    broker.step([], set(), NOW + 6 * NS)
    assert (broker.state.subs["t"]["s"].expired, broker.state.subs["t"]["r"].expired, broker.state.topics["t"].stored) == (1, 1, 0)
    assert consistent(broker, store, tmp_path) == []
