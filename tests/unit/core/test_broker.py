"""Broker behaviour that the reference model does not reach: damaged stores, failed
commits, a full map, reloads in the same step as other requests, a process that
dies while a step's batches are out."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import msgspec
import pytest
import yaml

from ppmq.config import Config, SubscriberConfig, TopicConfig, load_config
from ppmq.core import broker as broker_module
from ppmq.core.broker import Broker
from ppmq.core.ops import Guarded, Reconfigure, Unwritten
from ppmq.errors import StoreError
from ppmq.protocol import messages as p
from ppmq.store.fsck import check, read_snapshot
from ppmq.store.state import NS
from ppmq.store.store import Store, Txn
from tests.conftest import make_config

NOW = 1_800_000_000 * NS


def two_subscribers(path, window: int = 100, subs: tuple[str, ...] = ("s", "r"), **topic: object) -> Config:
    """Topic `t` taken by `subs` (of subscribers s and r), on a store at path."""
    return Config(
        server_socket="/nonexistent",
        data_path=str(path),
        sync=False,
        subscribers=[SubscriberConfig(name=n, socket=f"/nonexistent/{n}", batch_size=100, window=window) for n in ("s", "r")],
        topics=[TopicConfig(name="t", subscribers=list(subs), **topic)],
    )


def open_broker(path, max_bytes: int = 1 << 24, **topic: object) -> tuple[Broker, Store]:
    """A broker with topic `t` and its one subscriber `s`, on a real store at path."""
    config = two_subscribers(path, subs=("s",), **topic)
    store = Store(str(path), sync=False, max_bytes=max_bytes)
    return Broker(config, store, NOW), store


def publish(*payloads: bytes, topic: str = "t") -> p.Request:
    return p.Request(topic=topic, messages=[p.Message(payload=msgspec.Raw(x)) for x in payloads], id=msgspec.Raw(b"1"))


STATUS = p.Request(command="STATUS", id=msgspec.Raw(b"2"))


def keys_by_payload(frames: list[bytes]) -> dict[str, list[str]]:
    """The keys each payload was pushed with, in the batches `frames`."""
    pushed: dict[str, list[str]] = {}
    for frame in frames:
        for m in msgspec.json.decode(frame)["Messages"]:
            pushed.setdefault(m["Payload"], []).append(m["Key"])
    return pushed


def test_a_ready_counter_above_the_real_queue_is_reset_instead_of_spinning(tmp_path):
    # Given a message queued for s, whose queue entry has been lost behind the broker's back
    broker, store = open_broker(tmp_path)
    msg = p.Message(payload=msgspec.Raw(b"1"))
    broker.step([p.Request(topic="t", messages=[msg], id=msgspec.Raw(b"1"))], set(), NOW)
    t, s = broker.state.topic_ids["t"], broker.state.sub_ids["s"]
    with store.write() as txn:
        assert txn.remove_ready(t, s, 0, 1)  # priority 0, first position
    assert broker.wants_step({"s"}, NOW)
    # When s can take a batch
    step = broker.step([], {"s"}, NOW)
    # Then nothing is pushed, the counter follows the queue, and no further step is wanted
    assert step.deliveries == []
    assert broker.state.subs["t"]["s"].ready == [0]
    assert not broker.wants_step({"s"}, NOW)
    store.close()


def test_a_batch_pushed_on_an_ack_required_false_topic_but_never_confirmed_is_pushed_again_after_a_restart(tmp_path):
    # Given a batch handed to the subscriber's connection, and the broker gone before the write was confirmed
    broker, store = open_broker(tmp_path, ack_required=False)
    messages = [p.Message(payload=msgspec.Raw(b"%d" % i)) for i in range(3)]
    broker.step([p.Request(topic="t", messages=messages)], set(), NOW)
    (first,) = broker.step([], {"s"}, NOW).deliveries
    store.close()
    # When it starts again on the same store
    broker, store = open_broker(tmp_path, ack_required=False)
    # Then the same messages are ready and pushed again, and count as redelivered
    assert broker.state.subs["t"]["s"].ready == [3]
    (again,) = broker.step([], {"s"}, NOW).deliveries
    assert again.msgs == first.msgs
    assert broker.state.subs["t"]["s"].redelivered == 3
    store.close()


def test_a_publish_that_fills_the_map_half_way_leaves_nothing_behind_even_for_an_open_subscriber(tmp_path):
    # Given an empty store whose map (1 MiB plus its headroom) is smaller than one request
    broker, store = open_broker(tmp_path, max_bytes=1 << 20)
    big = msgspec.Raw(b'"' + b"x" * 1_000_000 + b'"')
    request = p.Request(topic="t", messages=[p.Message(payload=big)] * 40, id=msgspec.Raw(b"1"))
    # When it is published in a step where s could take a batch
    step = broker.step([request], {"s"}, NOW)
    # Then it is refused whole: nothing pushed, nothing queued, nothing counted
    assert step.replies[0].status == 507
    assert step.deliveries == []
    assert broker.state.subs["t"]["s"].ready == [0]
    assert broker.state.topics["t"].stored == 0
    assert broker.step([], {"s"}, NOW).deliveries == []
    with store.write() as txn:
        t, s = broker.state.topic_ids["t"], broker.state.sub_ids["s"]
        assert txn.first_ready(t, s, 0) is None
    # And a publish that fits goes through and is pushed
    small = p.Request(topic="t", messages=[p.Message(payload=msgspec.Raw(b"1"))], id=msgspec.Raw(b"2"))
    step = broker.step([small], {"s"}, NOW)
    assert step.replies[0].status == 200 and len(step.deliveries) == 1
    store.close()


def test_a_reload_that_drops_a_subscription_in_the_step_of_a_publish_leaves_nothing_for_the_dropped_subscriber(tmp_path):
    # Given s and r, both open and caught up, so a publish goes straight towards them
    config = two_subscribers(tmp_path)
    store = Store(str(tmp_path), sync=False, max_bytes=1 << 24)
    broker = Broker(config, store, NOW)
    # When a publish and a reload that takes r off the topic share one step
    step = broker.step([publish(b"1", b"2", b"3"), Reconfigure(two_subscribers(tmp_path, subs=("s",)))], {"s", "r"}, NOW)
    assert [r.status for r in step.replies] == [200, 200]
    # Then once s acks what it got, nothing is stored, and no row names r
    keys = [m["Key"] for d in step.deliveries for m in msgspec.json.decode(d.frame)["Messages"]]
    assert [d.subscriber for d in step.deliveries] == ["s"]
    broker.step([p.Request(topic="t", subscriber="s", acks=keys)], {"s"}, NOW)
    assert broker.state.topics["t"].stored == 0
    store.close()
    assert check(read_snapshot(str(tmp_path)), broker.config) == []


def test_a_status_that_fails_mid_step_keeps_the_publishes_answered_before_it(tmp_path, monkeypatch):
    # Given a publish in a step where s is open, and a STATUS after it that fails
    broker, store = open_broker(tmp_path)
    monkeypatch.setattr(broker_module, "status_body", lambda *a: 1 / 0)
    step = broker.step([publish(b"1", b"2"), STATUS], {"s"}, NOW)
    # Then the publish stands and is delivered, and the STATUS alone failed
    assert [r.status for r in step.replies] == [200, 500]
    assert [d.msgs for d in step.deliveries] == [[1, 2]]
    assert broker.state.subs["t"]["s"].inflight == 2
    store.close()
    assert check(read_snapshot(str(tmp_path)), broker.config) == []


def test_the_queues_kept_from_step_to_step_count_right_around_an_undone_request_and_a_failed_commit(tmp_path, monkeypatch):
    # Given a message in flight to s, its queue built in that step
    broker, store = open_broker(tmp_path)
    broker.step([publish(b"1")], {"s"}, NOW)
    # When its ack shares a step with a STATUS that fails, and so runs again, each request undoable
    monkeypatch.setattr(broker_module, "status_body", lambda *a: 1 / 0)
    step = broker.step([p.Request(topic="t", subscriber="s", acks=["1"]), STATUS], set(), NOW)
    # Then the ack counts once
    assert [r.status for r in step.replies] == [200, 500]
    stats = broker.state.subs["t"]["s"]
    assert (stats.inflight, stats.acked, stats.delivered) == (0, 1, 1)
    # And when a step whose commit fails delivers the next message, the next step delivers it again, counted once
    failing = store.write

    def write_then_fail():
        writing = failing()

        class Failing:
            def __enter__(self):
                return writing.__enter__()

            def __exit__(self, *exc):
                writing.__exit__(StoreError, StoreError("disk"), None)
                raise StoreError("disk")

        return Failing()

    monkeypatch.setattr(store, "write", write_then_fail)
    assert broker.step([publish(b"2")], {"s"}, NOW).replies[0].status == 500
    monkeypatch.setattr(store, "write", failing)
    step = broker.step([], {"s"}, broker.next_tick_ns)
    stats = broker.state.subs["t"]["s"]
    assert [d.msgs for d in step.deliveries] == []  # the failed publish was never stored
    assert (stats.inflight, stats.acked, stats.delivered, stats.ready) == (0, 1, 1, [0])
    assert broker.step([publish(b"3")], {"s"}, broker.next_tick_ns).deliveries[0].msgs == [2]
    stats = broker.state.subs["t"]["s"]
    assert (stats.inflight, stats.acked, stats.delivered, stats.ready) == (1, 1, 2, [0])
    store.close()
    assert check(read_snapshot(str(tmp_path)), broker.config) == []


def test_an_access_check_that_fails_on_a_bug_costs_its_request_alone_answered_500_and_logged(tmp_path, caplog):
    # Given a publish whose connection's access check meets a bug, and a publish without one after it
    broker, store = open_broker(tmp_path)

    def broken_check(req: p.Request) -> None:
        raise AttributeError("'NoneType' object has no attribute 'allows'")

    # When both arrive in one step
    with caplog.at_level(logging.ERROR, logger="ppmq.broker"):
        step = broker.step([Guarded(publish(b"1"), broken_check), publish(b"2")], set(), NOW)
    # Then the first is answered 500, logged once with its traceback, and stores nothing; the second is stored
    assert [r.status for r in step.replies] == [500, 200]
    assert step.replies[0].error.startswith("internal error: AttributeError:")
    assert [r.exc_info[0] for r in caplog.records if r.exc_info] == [AttributeError]
    assert (broker.state.rejected, broker.state.topics["t"].stored) == (1, 1)
    store.close()


def test_a_window_lowered_below_what_is_in_flight_wants_no_step_until_acks_make_room(tmp_path):
    # Given 10 messages in flight to s (Window 10) and 10 more ready
    config = two_subscribers(tmp_path, window=10, subs=("s",))
    store = Store(str(tmp_path), sync=False, max_bytes=1 << 24)
    broker = Broker(config, store, NOW)
    broker.step([publish(*[b"%d" % i for i in range(20)])], {"s"}, NOW)
    # When a reload lowers its Window to 2
    broker.step([Reconfigure(two_subscribers(tmp_path, window=2, subs=("s",)))], set(), NOW)
    # Then no step is wanted for s, and a step pushes nothing
    assert not broker.wants_step({"s"}, NOW)
    assert broker.step([], {"s"}, NOW).deliveries == []
    # Until acks bring the in-flight count under the new Window
    broker.step([p.Request(topic="t", subscriber="s", acks=[str(i) for i in range(1, 10)])], set(), NOW)
    assert broker.wants_step({"s"}, NOW)
    store.close()


def test_a_generated_key_acks_only_in_its_canonical_spelling(tmp_path):
    # Given message 2 in flight to s
    broker, store = open_broker(tmp_path)
    broker.step([publish(b"1", b"2")], {"s"}, NOW)
    # When it is acked as "0002", "+2" or " 2"
    broker.step([p.Request(topic="t", subscriber="s", acks=["0002", "+2", " 2", "02"])], set(), NOW)
    # Then nothing is acked; "2" is
    assert broker.state.subs["t"]["s"].inflight == 2 and broker.state.subs["t"]["s"].ignored_acks == 4
    broker.step([p.Request(topic="t", subscriber="s", acks=["2"])], set(), NOW)
    assert broker.state.subs["t"]["s"].acked == 1
    store.close()


def test_a_topic_dropped_and_created_again_never_hands_out_a_key_twice(tmp_path):
    # Given topic t that handed out keys 1..3, then was dropped (its messages with it)
    config = two_subscribers(tmp_path, subs=("s",))
    store = Store(str(tmp_path), sync=False, max_bytes=1 << 24)
    broker = Broker(config, store, NOW)
    first = broker.step([publish(b"1", b"2", b"3")], {"s"}, NOW).deliveries
    empty = Config(server_socket="/nonexistent", data_path=str(tmp_path), sync=False, subscribers=config.subscribers, drop_topics=["t"])
    assert broker.step([Reconfigure(empty)], set(), NOW).replies[0].status == 200
    # When it is created again, also across a restart
    store.close()
    store = Store(str(tmp_path), sync=False, max_bytes=1 << 24)
    broker = Broker(config, store, NOW)
    again = broker.step([publish(b"4")], {"s"}, NOW).deliveries
    # Then its new message gets a key it never had
    assert keys_by_payload([d.frame for d in first]) == {1: ["1"], 2: ["2"], 3: ["3"]}
    (key,) = keys_by_payload([d.frame for d in again])[4]
    assert int(key) > 3
    store.close()


# A broker that runs one step, pushing a new message `first` to s, and dies
# (os._exit, a kill -9) as soon as the step's batches have left: before the
# step's commit, or after it when the step must hold them until then. Prints the
# batches that left. argv: the config, the topic, the configs of reloads that
# come in the same step.
STEP_AND_DIE = """
import os, sys
import msgspec
from ppmq.protocol import messages as p
from ppmq.core.broker import Broker
from ppmq.config import load_config
from ppmq.core.ops import Reconfigure
from ppmq.store.store import Store

config_path, topic, reloads = sys.argv[1], sys.argv[2], sys.argv[3:]
config = load_config(config_path)
broker = Broker(config, Store(config.data_path, sync=True, max_bytes=config.max_store_bytes), %d)
ops = [Reconfigure(load_config(path)) for path in reloads]
ops.append(p.Request(topic=topic, messages=[p.Message(payload=msgspec.Raw(b'"first"'))]))

def early(deliveries):
    for delivery in deliveries:
        sys.stdout.buffer.write(delivery.frame.rstrip(b"\\n") + b"\\n")
    sys.stdout.buffer.flush()
    os._exit(9)

broker.step(ops, {"s"}, %d, early)
""" % (NOW, NOW)


@pytest.mark.parametrize("created", [False, True], ids=["topic-in-the-config", "topic-created-by-a-reload-in-the-step"])
def test_a_key_pushed_by_a_step_that_died_with_its_process_is_never_handed_out_again(tmp_path, created):
    # Given a broker whose step pushes a new message to s and dies once the batch
    # has left: before the commit; or, for a topic a reload creates in that step
    # (no id of its sequence reserved by a commit yet), after it
    topics = [{"Name": "t", "Subscribers": ["s"]}] + ([{"Name": "u", "Subscribers": ["s"]}] if created else [])
    paths = []
    for i, config in enumerate([topics[:1], topics]):
        paths.append(tmp_path / f"ppmq{i}.yaml")
        paths[-1].write_text(yaml.safe_dump(make_config(tmp_path, config, ["s"])))
    topic = topics[-1]["Name"]
    died = subprocess.run(
        [sys.executable, "-c", STEP_AND_DIE, str(paths[0]), topic, *map(str, paths[1:] if created else [])], capture_output=True, timeout=60
    )
    assert died.returncode == 9, died.stderr.decode()
    (first,) = keys_by_payload(died.stdout.splitlines())["first"]
    # When the broker starts again on its store, and a new message comes
    config = load_config(paths[-1])
    store = Store(config.data_path, sync=False, max_bytes=1 << 24)
    broker = Broker(config, store, NOW)
    pushed = keys_by_payload([d.frame for d in broker.step([publish(b'"second"', topic=topic)], {"s"}, NOW).deliveries])
    # Then the new message's key is not the one `first` left with, whether `first` was committed or not
    assert pushed == {"second": pushed["second"]} and pushed["second"] != [first]
    assert broker.state.topics[topic].stored == (2 if created else 1)
    store.close()


def fill_the_map(store: Store) -> None:
    """Shrink LMDB's map to what it uses now: the next page anything needs is refused."""
    store.env.set_mapsize((store.env.info()["last_pgno"] + 1) * store.env.stat()["psize"])


def in_flight_on_a_full_map(path) -> tuple[Broker, Store, list[int]]:
    """1000 messages in flight to s, on a store whose map has no page left."""
    store = Store(str(path), sync=False, max_bytes=1 << 30)
    broker = Broker(two_subscribers(path, window=1000, subs=("s",)), store, NOW)
    broker.step([publish(*[b"%d" % i for i in range(1000)])], set(), NOW)
    msgs = [m for d in broker.step([], {"s"}, NOW).deliveries for m in d.msgs]
    fill_the_map(store)
    return broker, store, msgs


def test_a_map_that_fills_outside_any_request_answers_every_request_of_the_step_507(tmp_path):
    # Given a batch in flight, and a map with no page left
    broker, store, msgs = in_flight_on_a_full_map(tmp_path)
    # When the batch comes back (which needs pages, outside any request) in the step of a STATUS
    step = broker.step([Unwritten("s", "t", msgs), STATUS], set(), NOW)
    # Then the STATUS is answered 507, and nothing of the step happened
    assert step.replies[1].status == 507 and "full" in step.replies[1].error
    assert broker.state.subs["t"]["s"].inflight == 1000


def test_a_reload_whose_commit_fails_is_answered_and_leaves_the_old_config_whole(tmp_path):
    # Given a broker on topic t, and a map with no page left
    config = two_subscribers(tmp_path, subs=("s",))
    store = Store(str(tmp_path), sync=False, max_bytes=1 << 30)
    broker = Broker(config, store, NOW)
    broker.step([publish(*[b"%d" % i for i in range(1000)])], {"s"}, NOW)
    fill_the_map(store)
    # When a reload that adds topic u and drops subscriber s from t fails to commit
    new = two_subscribers(tmp_path, subs=("r",))
    new.topics.append(TopicConfig(name="u", subscribers=["s"]))
    step = broker.step([Reconfigure(new), publish(b"x", topic="u")], set(), NOW)
    # Then the reload is answered with the error, and the old config is the broker's, whole
    assert step.replies[0].status == 507
    assert broker.config is config and set(broker.topics) == {"t"} and broker.sub_topics["s"][0].name == "t"
    assert "u" not in broker.state.topics and broker.state.subs["t"]["s"].inflight == 100
    # And once there is room, the broker goes on under it: timers, publishes to t, STATUS
    store.env.set_mapsize(1 << 30)
    step = broker.step([publish(b"y"), STATUS], {"s"}, NOW + 10 * NS)
    assert [r.status for r in step.replies] == [200, 200]
    assert step.replies[1].body["Topics"].keys() == {"t"}
    store.close()


def test_a_full_map_backs_off_instead_of_retrying_every_moment(tmp_path, caplog):
    # Given a batch that comes back while the map has no page left
    broker, store, msgs = in_flight_on_a_full_map(tmp_path)
    broker.step([Unwritten("s", "t", msgs)], set(), NOW)
    # When time passes without requests
    # Then no step is wanted before the backoff, which grows with every failure, and one failure is logged
    assert not broker.wants_step(set(), NOW + NS // 20)
    retries = []
    now = NOW
    for _ in range(5):
        now = broker.next_tick_ns
        assert broker.wants_step(set(), now)
        broker.step([], set(), now)
        retries.append(broker.next_tick_ns - now)
    assert retries == sorted(retries) and retries[-1] > retries[0]
    assert len([r for r in caplog.records if "commit failed" in r.getMessage()]) == 1
    # And once there is room, the carried batch is ready again
    store.env.set_mapsize(1 << 30)
    broker.step([], set(), broker.next_tick_ns)
    assert broker.state.subs["t"]["s"].ready == [1000]
    assert any("succeed again" in r.getMessage() for r in caplog.records)
    store.close()


def keyed(*pairs: tuple[str, bytes], priority: int = 0) -> p.Request:
    messages = [p.Message(key=k, payload=msgspec.Raw(v), priority=priority) for k, v in pairs]
    return p.Request(topic="t", messages=messages, id=msgspec.Raw(b"1"))


def test_a_key_published_twice_in_one_step_to_an_open_subscriber_goes_out_once_with_the_newest_content(tmp_path):
    # Given a Dedupe topic whose subscriber is open and caught up
    broker, store = open_broker(tmp_path, dedupe=True, priorities=2)
    # When one step holds a publish of a and b, then a new version of a
    step = broker.step([keyed(("a", b"1"), ("b", b"2")), keyed(("a", b"3"))], {"s"}, NOW)
    # Then one batch goes out in queue order: a at its old place with its new content, then b
    (delivery,) = step.deliveries
    sent = [(m["Key"], m["Payload"]) for m in msgspec.json.decode(delivery.frame)["Messages"]]
    assert sent == [("a", 3), ("b", 2)]
    stats = broker.state.subs["t"]["s"]
    assert (stats.ready, stats.inflight, broker.state.topics["t"].stored) == ([0, 0], 2, 2)
    store.close()


def test_a_key_repeated_within_one_publish_is_stored_once_with_its_last_version(tmp_path):
    # Given a Dedupe topic whose subscriber is open and caught up
    broker, store = open_broker(tmp_path, dedupe=True, priorities=2)
    # When one publish brings a, b, a again and c, the second a of higher priority
    req = keyed(("a", b"1"), ("b", b"2"))
    req.messages += keyed(("a", b"3"), ("c", b"4"), priority=1).messages
    step = broker.step([req], {"s"}, NOW)
    # Then a is stored once, with the second version, and every key goes out once
    (delivery,) = step.deliveries
    sent = sorted((m["Key"], m["Payload"]) for m in msgspec.json.decode(delivery.frame)["Messages"])
    assert sent == [("a", 3), ("b", 2), ("c", 4)]
    assert (broker.state.topics["t"].stored, broker.state.topics["t"].replaced) == (3, 1)
    store.close()


def test_a_new_version_of_a_message_waiting_after_a_delivery_keeps_its_place_and_starts_its_attempts_anew(tmp_path):
    # Given a Dedupe topic where a was delivered once and nacked back before b, and c waits behind them
    broker, store = open_broker(tmp_path, dedupe=True, priorities=2, window=1)
    broker.step([keyed(("a", b"1"), ("b", b"2"), ("c", b"3"))], set(), NOW)
    assert [m["Key"] for d in broker.step([], {"s"}, NOW).deliveries for m in msgspec.json.decode(d.frame)["Messages"]] == ["a"]
    broker.step([p.Request(topic="t", subscriber="s", nacks=["a"])], set(), NOW)
    t, s = broker.state.topic_ids["t"], broker.state.sub_ids["s"]
    with store.write() as txn:
        place = txn.get_holders(t, txn.get_dedupe(t, b"a"))[s]
        assert txn.ready_attempts(t, s, *place) == 1
    # When a new version of a, and one of c of a lower priority, are published in one request
    broker.step([keyed(("a", b"4")), keyed(("c", b"5"), priority=1)], set(), NOW)
    # Then a is where it waited, never delivered as far as its queue knows; c moved behind b
    with store.write() as txn:
        assert txn.get_holders(t, txn.get_dedupe(t, b"a"))[s] == place and txn.ready_attempts(t, s, *place) == 0
    sent = []
    for _ in range(3):
        (delivery,) = broker.step([], {"s"}, NOW).deliveries
        (message,) = msgspec.json.decode(delivery.frame)["Messages"]
        sent.append((message["Key"], message["Payload"]))
        broker.step([p.Request(topic="t", subscriber="s", acks=[message["Key"]])], set(), NOW)
    assert sent == [("a", 4), ("b", 2), ("c", 5)]
    assert (broker.state.topics["t"].stored, broker.state.topics["t"].replaced) == (0, 2)
    store.close()


def test_drop_oldest_drops_a_message_of_the_same_step_that_has_not_been_pushed_yet(tmp_path):
    # Given a topic of at most 2 messages whose subscriber is open and caught up
    broker, store = open_broker(tmp_path, max_messages=2, overflow_policy="drop-oldest")
    # When one publish brings three
    step = broker.step([publish(b"1", b"2", b"3")], {"s"}, NOW)
    # Then the first made room for the third, and the other two go out
    (delivery,) = step.deliveries
    assert [m["Payload"] for m in msgspec.json.decode(delivery.frame)["Messages"]] == [2, 3]
    assert (broker.state.topics["t"].stored, broker.state.topics["t"].dropped) == (2, 1)
    stats = broker.state.subs["t"]["s"]
    assert (stats.ready, stats.inflight) == ([0], 2)
    store.close()


def test_a_publish_a_limited_topic_has_room_for_is_stored_whole_and_one_it_has_not_message_by_message(tmp_path):
    # Given a topic of at most 5 messages, dropping the oldest when full, with 3 priorities
    broker, store = open_broker(tmp_path, max_messages=5, overflow_policy="drop-oldest", priorities=3)

    def stored_keys() -> dict[str, str]:  # payload -> key
        t = broker.state.topic_ids["t"]
        with store.write() as txn:
            return {body.fragment.split(b'"Payload":')[1].split(b",")[0].decode(): body.key.decode() for _, body in txn.bodies_of(t)}

    # When a publish of priorities 2, 0, 1 finds room for all of it
    broker.step(
        [p.Request(topic="t", messages=[p.Message(payload=msgspec.Raw(b"%d" % i), priority=prio) for i, prio in ((1, 2), (2, 0), (3, 1))])],
        set(),
        NOW,
    )
    # Then it is stored at once: its keys go by priority
    assert stored_keys() == {"2": "1", "3": "2", "1": "3"}
    # When the next publish of 3 has room for 2 of them only
    broker.step([p.Request(topic="t", messages=[p.Message(payload=msgspec.Raw(b"%d" % i), priority=1) for i in (4, 5, 6)])], set(), NOW)
    # Then each made room for itself in turn: the oldest of the lowest priority went, and the keys follow the publish
    assert stored_keys() == {"2": "1", "3": "2", "4": "4", "5": "5", "6": "6"}
    assert (broker.state.topics["t"].stored, broker.state.topics["t"].dropped) == (5, 1)
    store.close()


def test_batches_handed_out_before_a_commit_that_fails_are_delivered_again(tmp_path, monkeypatch):
    # Given a message ready for s, and a step whose commit will fail after its batches were handed out early
    broker, store = open_broker(tmp_path)
    broker.step([publish(b"1")], set(), NOW)
    real, early = store.write, []

    @contextmanager
    def failing() -> Iterator[Txn]:
        with real() as txn:
            yield txn
            raise StoreError("the disk went away")

    monkeypatch.setattr(store, "write", failing)
    # When s can take a batch
    step = broker.step([], {"s"}, NOW, early=early.extend)
    # Then the batch went out before the commit, the step reports none, and the message is still ready
    assert [d.msgs for d in early] == [[1]] and step.deliveries == []
    assert broker.state.subs["t"]["s"].ready == [1] and broker.state.subs["t"]["s"].inflight == 0
    # and once commits succeed it is delivered again: at least once
    monkeypatch.setattr(store, "write", real)
    (again,) = broker.step([], {"s"}, NOW + 10 * NS).deliveries
    assert again.msgs == [1]
    store.close()


def test_an_idle_broker_wants_a_step_only_when_a_timer_is_due(tmp_path):
    # Given a broker whose subscriber holds a message in flight, and no timer waiting
    broker, store = open_broker(tmp_path)
    broker.step([publish(b"1")], {"s"}, NOW)
    key = str(broker.state.topics["t"].seq)
    # Then no step is wanted a tick later, nor a minute later; each look sets the next one a tick on
    assert not broker.wants_step(set(), broker.next_tick_ns)
    assert not broker.wants_step(set(), NOW + 60 * NS)
    assert broker.next_tick_ns == NOW + 61 * NS
    # When the message is nacked with a delay of 2.5 s
    later = NOW + 61 * NS
    broker.step([p.Request(topic="t", subscriber="s", nacks=[key], delay=2.5)], set(), later)
    # Then the next look is when the delay ends, and only then is a step wanted, which gives the message back
    due = later + 5 * NS // 2
    assert broker.next_tick_ns == later + NS
    assert not broker.wants_step(set(), later + 2 * NS)
    assert broker.next_tick_ns == due
    assert broker.wants_step(set(), due)
    broker.step([], set(), due)
    assert broker.state.subs["t"]["s"].ready == [1]
    store.close()
