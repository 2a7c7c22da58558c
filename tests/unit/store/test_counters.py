"""The counters' records (store/counters.py): one per topic, written when a step touched
the topic, read back from a store an older ppmq wrote as one record."""

from __future__ import annotations

import msgspec

from ppmq.config import Config, SubscriberConfig, TopicConfig
from ppmq.core.broker import Broker
from ppmq.protocol import messages as p
from ppmq.store.counters import HEAD_KEY, TOPIC_PREFIX, TopicRecord, load_state
from ppmq.store.fsck import check, read_snapshot
from ppmq.store.state import NS, State, SubStats, TopicStats
from ppmq.store.store import Store

NOW = 1_800_000_000 * NS


def config_of(path, topics: list[str]) -> Config:
    return Config(
        server_socket=f"{path}/s.sock",
        data_path=str(path),
        sync=False,
        subscribers=[SubscriberConfig(name="s", socket=f"{path}/s-sub.sock")],
        topics=[TopicConfig(name=name, subscribers=["s"]) for name in topics],
    )


def publish(topic: str, *payloads: bytes) -> p.Request:
    return p.Request(topic=topic, messages=[p.Message(payload=msgspec.Raw(x)) for x in payloads], id=msgspec.Raw(b"1"))


def topic_record(store: Store, name: str) -> TopicRecord:
    with store.write() as txn:
        return msgspec.msgpack.decode(txn.get_meta(TOPIC_PREFIX + name.encode()), type=TopicRecord)


def test_a_step_rewrites_the_records_of_the_topics_it_touched_and_no_others(tmp_path):
    # Given a broker with a busy and an idle topic, and the idle topic's record changed behind its back
    store = Store(str(tmp_path), sync=False, max_bytes=1 << 24)
    broker = Broker(config_of(tmp_path, ["busy", "idle"]), store, NOW)
    marked = TopicRecord(TopicStats(published=999), {"s": SubStats(ready=[0])})
    with store.write() as txn:
        txn.put_meta(TOPIC_PREFIX + b"idle", msgspec.msgpack.encode(marked))
    # When steps publish to the busy topic and deliver it
    broker.step([publish("busy", b"1", b"2")], set(), NOW)
    broker.step([], {"s"}, NOW)
    # Then the busy topic's record holds its counters, and the idle one was not written
    assert topic_record(store, "busy").stats.published == 2
    assert topic_record(store, "busy").subs["s"].inflight == 2
    assert topic_record(store, "idle") == marked
    store.close()


def test_a_refused_request_leaves_no_count_in_memory_or_in_the_store(tmp_path):
    # Given a broker with one topic
    store = Store(str(tmp_path), sync=False, max_bytes=1 << 24)
    broker = Broker(config_of(tmp_path, ["t"]), store, NOW)
    # When one step holds a good publish, and one whose second message is refused
    bad = p.Request(
        topic="t", messages=[p.Message(payload=msgspec.Raw(b"3")), p.Message(payload=msgspec.Raw(b"4"), priority=7)], id=msgspec.Raw(b"2")
    )
    step = broker.step([publish("t", b"1"), bad], set(), NOW)
    # Then only the good one is counted, as the store's records say too
    assert [r.status for r in step.replies] == [200, 400]
    assert (broker.state.topics["t"].published, broker.state.subs["t"]["s"].ready) == (1, [1])
    with store.write() as txn:
        stored = load_state(txn)
    assert (stored.topics["t"].published, stored.subs["t"]["s"].ready, stored.rejected) == (1, [1], 1)
    store.close()


def test_the_single_counters_record_of_an_older_ppmq_is_read_and_split_per_topic(tmp_path):
    # Given a store whose counters are one record, as ppmq wrote them before per-topic records
    store = Store(str(tmp_path), sync=False, max_bytes=1 << 24)
    old = State(
        commits=7,
        topic_ids={"t": 1},
        sub_ids={"s": 1},
        topics={"t": TopicStats(seq=0, published=5)},
        subs={"t": {"s": SubStats(ready=[0], acked=5, delivered=5)}},
    )
    with store.write() as txn:
        txn.put_meta(HEAD_KEY, msgspec.msgpack.encode(old))
    # When a broker opens it
    broker = Broker(config_of(tmp_path, ["t"]), store, NOW)
    # Then it goes on from those counters, and they are now a record of their own
    assert (broker.state.commits, broker.state.topics["t"].published, broker.state.subs["t"]["s"].acked) == (7, 5, 5)
    assert topic_record(store, "t").subs["s"].acked == 5
    with store.write() as txn:
        head = msgspec.msgpack.decode(txn.get_meta(HEAD_KEY))
    assert "topics" not in head and "subs" not in head
    store.close()
    assert check(read_snapshot(str(tmp_path)), config_of(tmp_path, ["t"])) == []


def test_every_read_of_the_counters_sees_every_topic_whichever_a_step_looked_up(tmp_path):
    # Given a broker with a busy and an idle topic, after a step that looked up the busy one alone
    store = Store(str(tmp_path), sync=False, max_bytes=1 << 24)
    broker = Broker(config_of(tmp_path, ["busy", "idle"]), store, NOW)
    broker.step([publish("busy", b"1")], set(), NOW)
    # Then each way of reading the counters' dicts finds both topics
    topics, subs = broker.state.topics, broker.state.subs
    assert sorted(topics) == sorted(topics.keys()) == sorted(subs) == ["busy", "idle"]
    assert (len(topics), "idle" in topics, {name for name, _ in topics.items()}) == (2, True, {"busy", "idle"})
    assert [stats.published for stats in topics.values()] == [1, 0]
    assert topics.peek("idle") is topics["idle"] is topics.get("idle") and topics.get("gone") is None
    store.close()
