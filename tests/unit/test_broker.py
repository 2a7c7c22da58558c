"""Broker behaviour that the reference model does not reach: damaged stores."""

from __future__ import annotations

import msgspec

from ppmq import protocol as p
from ppmq.broker import Broker
from ppmq.config import Config, SubscriberConfig, TopicConfig
from ppmq.state import NS
from ppmq.store import Store

NOW = 1_800_000_000 * NS


def open_broker(path, max_bytes: int = 1 << 24, **topic: object) -> tuple[Broker, Store]:
    """A broker with topic `t` and its one subscriber `s`, on a real store at path."""
    config = Config(
        server_socket="/nonexistent", data_path=str(path), sync=False,
        subscribers=[SubscriberConfig(name="s", socket="/nonexistent/s", batch_size=100, window=100)],
        topics=[TopicConfig(name="t", subscribers=["s"], **topic)],
    )
    store = Store(str(path), sync=False, max_bytes=max_bytes)
    return Broker(config, store, NOW), store


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
