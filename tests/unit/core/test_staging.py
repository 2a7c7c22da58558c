"""Publishes larger than a chunk, staged over several steps (core/staging.py), in-process
with a small CHUNK_MESSAGES: invisible until whole, answered once, cleaned up
after a failure, a reload, a failed commit or a crash."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest

from ppmq.config import Config, SubscriberConfig, TopicConfig
from ppmq.core import staging
from ppmq.core.broker import Broker
from ppmq.core.ops import Reconfigure
from ppmq.errors import StoreFullError
from ppmq.protocol import messages as p
from ppmq.server.group_commit import GroupCommit
from ppmq.store.fsck import check, read_snapshot
from ppmq.store.schema import TM, holders_columns
from ppmq.store.state import NS
from ppmq.store.store import Store, Txn

NOW = 1_800_000_000 * NS
CHUNK = 4


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(staging, "CHUNK_MESSAGES", CHUNK)


def make_config(path: Path, **bulk: object) -> Config:
    return Config(
        server_socket=str(path / "ppmq.sock"),
        data_path=str(path / "data"),
        sync=False,
        subscribers=[SubscriberConfig(name=n, socket=str(path / f"{n}.sock"), batch_size=100) for n in ("a", "b")],
        topics=[
            TopicConfig(name="bulk", subscribers=["a", "b"], priorities=2, expire=True, **bulk),
            TopicConfig(name="dd", subscribers=["a"], dedupe=True),
            TopicConfig(name="capped", subscribers=["a"], max_messages=100),
        ],
    )


def publish(topic: str, n: int, rid: int = 1, **overrides: dict) -> p.Request:
    """n messages with payloads 0..n-1; `overrides` maps an index (as a string) to fields."""
    messages = [
        msgspec.convert({"Payload": msgspec.Raw(b"%d" % i), "Key": f"k{i}", **overrides.get(str(i), {})}, p.Message) for i in range(n)
    ]
    return p.Request(topic=topic, messages=messages, id=msgspec.Raw(b"%d" % rid))


class Harness:
    def __init__(self, path: Path) -> None:
        self.config = make_config(path)
        self.open()

    def open(self) -> None:
        self.store = Store(self.config.data_path, sync=False, max_bytes=1 << 26)
        self.broker = Broker(self.config, self.store, NOW)

    def status(self) -> dict:
        return self.broker.step([p.Request(command="STATUS", id=msgspec.Raw(b"0"))], set(), NOW).replies[0].body["Topics"]

    def fsck(self) -> list[str]:
        """fsck on the closed store (py-lmdb opens an environment once per process)."""
        self.store.close()
        try:
            return check(read_snapshot(self.config.data_path), self.config)
        finally:
            self.open()


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path)
    yield harness
    harness.store.close()


def run_until_answered(h: Harness, ops: list, open_subs: set[str] = frozenset()) -> tuple[p.Reply, list]:
    """Steps until a staged publish is answered; its reply, and every batch on the way."""
    deliveries, step = [], h.broker.step(ops, set(open_subs), NOW)
    while not step.finished:
        deliveries += step.deliveries
        step = h.broker.step([], set(open_subs), NOW)
    ((_, reply),) = step.finished
    return reply, deliveries + step.deliveries


def keys(deliveries: list) -> list[str]:
    return [m["Key"] for d in deliveries for m in msgspec.json.decode(d.frame)["Messages"]]


def test_a_large_publish_is_answered_once_in_the_step_that_makes_it_whole_and_unseen_before(h):
    # Given a publish of 10 messages, chunks of 4, and an open subscriber
    big = publish("bulk", 10)
    first = h.broker.step([big], {"a"}, NOW)
    # Then it has no reply in the step it arrived in, and nothing of it is delivered
    assert first.replies == [None] and first.finished == [] and first.deliveries == []
    # When a small publish comes meanwhile
    small = h.broker.step([publish("bulk", 2, rid=2)], {"a"}, NOW)
    # Then it is answered in its own step and delivered alone, after the reserved ids 1..10
    assert small.replies[0].status == 200 and small.finished == [] and keys(small.deliveries) == ["11", "12"]
    # And the step of the last chunk answers the large one, once, and delivers all of it
    last = h.broker.step([], {"a"}, NOW)
    assert last.finished == [(big, p.Reply(status=200, id=big.id, accepted=10))]
    assert keys(last.deliveries) == [str(m) for m in range(1, 11)]
    assert not h.broker.staging
    assert h.status()["bulk"]["Stored"] == 12 and h.status()["bulk"]["Published"] == 12
    assert h.fsck() == []


def test_each_chunk_of_a_staged_publish_has_holders_rows_of_its_own_beside_a_publish_stored_meanwhile(h):
    # Given a publish of 10 in chunks of 4, and one of 2 stored after its first chunk (ids 11, 12)
    h.broker.step([publish("bulk", 10)], set(), NOW)
    h.broker.step([publish("bulk", 2, rid=2)], set(), NOW)
    run_until_answered(h, [])
    # Then the holders rows tile the ids in the order of ids, not of writing
    t = h.broker.state.topic_ids["bulk"]
    with h.store.write() as txn, txn.txn.cursor(db=h.store.dbs["holders"]) as cur:
        rows = [(TM.unpack(key)[1], list(holders_columns(raw)[0])) for key, raw in cur if TM.unpack(key)[0] == t]
    assert rows == [(1, [1, 2, 3, 4]), (5, [5, 6, 7, 8]), (9, [9, 10]), (11, [11, 12])]
    assert h.fsck() == []


def test_a_staged_publish_is_invisible_to_status_and_fsck_finds_the_store_clean_meanwhile(h):
    h.broker.step([publish("bulk", 13, **{"0": {"TTL": 1}})], set(), NOW)  # four chunks
    # STATUS runs before the step's chunk: after the first chunk, and after the second
    for _ in range(2):
        topic = h.status()["bulk"]
        assert (topic["Stored"], topic["StoredBytes"], topic["Published"]) == (0, 0, 0)
        assert topic["Subscribers"]["a"]["Ready"] == [0, 0] and topic["Subscribers"]["a"]["OldestReadyAge"] is None
    assert h.broker.staging
    assert h.fsck() == []


def test_a_bad_message_near_the_end_rejects_the_whole_publish_naming_its_index_and_nothing_stays(h):
    reply, deliveries = run_until_answered(h, [publish("bulk", 10, **{"9": {"Priority": 5}})], {"a"})
    assert reply.status == 400 and reply.error.startswith("Messages[9].Priority: 5 is out of range"), reply
    assert deliveries == []
    while h.broker.staging:  # its rows are deleted a chunk per step
        h.broker.step([], set(), NOW)
    assert h.status()["bulk"]["Stored"] == 0
    assert h.fsck() == []
    # And the ids it took are not handed out again (fsck reopened the store: the broker goes on above its reservation)
    (key,) = keys(h.broker.step([publish("bulk", 1)], {"a"}, NOW).deliveries)
    assert int(key) > 10


def test_a_request_failing_half_way_in_the_step_a_large_publish_arrives_in_leaves_it_queued_once(h):
    # Given the capped topic one message short of its MaxMessages (100)
    h.broker.step([publish("capped", 4, rid=i) for i in range(24)] + [publish("capped", 3, rid=24)], set(), NOW)
    assert h.status()["capped"]["Stored"] == 99
    # When a large publish, a capped publish that fills the topic at its first
    # message and is refused at its second, and a small publish share a step
    big = publish("bulk", 10)
    step = h.broker.step([big, publish("capped", 2, rid=2), publish("bulk", 2, rid=3)], {"a"}, NOW)
    # Then the capped publish alone is refused, and nothing of it stays
    assert [r and r.status for r in step.replies] == [None, 507, 200]
    assert h.status()["capped"]["Stored"] == 99
    # And the large publish is staged once: answered once, its 10 messages stored once
    reply, _ = run_until_answered(h, [], {"a"})
    assert (reply.status, reply.accepted) == (200, 10)
    for _ in range(3):
        assert h.broker.step([], {"a"}, NOW).finished == []
    assert h.status()["bulk"]["Stored"] == 12 and not h.broker.staging
    assert h.fsck() == []


def test_a_staging_record_left_by_a_crash_is_deleted_at_start_and_its_ids_never_reused(h):
    h.broker.step([publish("bulk", 10)], set(), NOW)
    h.broker.step([], set(), NOW)  # two chunks stored, never answered
    h.store.close()  # the process dies
    h.open()
    assert h.broker.staging
    while h.broker.staging:
        h.broker.step([], set(), NOW)
    assert h.fsck() == []
    with h.store.write() as txn:
        assert txn.staged() is None and list(txn.bodies_of(h.broker.state.topic_ids["bulk"])) == []
    (key,) = keys(h.broker.step([publish("bulk", 1)], {"a"}, NOW).deliveries)
    assert int(key) > 10


def test_a_reload_that_changes_the_topic_ends_the_staged_publish_with_503(h, tmp_path):
    big = publish("bulk", 10)
    h.broker.step([big], set(), NOW)
    changed = make_config(tmp_path, ack_retry=5)
    reply, _ = run_until_answered(h, [Reconfigure(changed)])
    assert reply.status == 503 and "reconfigured while this publish was being stored" in reply.error
    while h.broker.staging:
        h.broker.step([], set(), NOW)
    h.config = changed
    assert h.status()["bulk"]["Stored"] == 0 and h.fsck() == []


def test_a_commit_that_fails_ends_the_staged_publish_with_its_error_and_the_next_one_goes_on(h, monkeypatch):
    first, second = publish("bulk", 10, rid=1), publish("bulk", 5, rid=2)
    h.broker.step([first, second], set(), NOW)  # the first's first chunk; the second waits
    real = h.store.write

    @contextmanager
    def failing() -> Iterator[Txn]:
        with real() as txn:
            yield txn
            raise StoreFullError("disk full")

    monkeypatch.setattr(h.store, "write", failing)
    failed = h.broker.step([], set(), NOW)
    monkeypatch.setattr(h.store, "write", real)
    assert [(req, reply.status) for req, reply in failed.finished] == [(first, 507)]
    reply, _ = run_until_answered(h, [])
    assert reply.status == 200 and reply.accepted == 5
    assert h.status()["bulk"]["Stored"] == 5 and h.fsck() == []


def test_the_writer_backs_off_failing_commits_also_while_a_publish_is_staged(h, monkeypatch):
    # Given a publish in progress, and a store where every commit fails
    h.broker.step([publish("bulk", 10, rid=1), publish("bulk", 5, rid=2)], set(), NOW)
    real, commits = h.store.write, []

    @contextmanager
    def failing() -> Iterator[Txn]:
        commits.append(time.monotonic())
        with real() as txn:
            yield txn
            raise StoreFullError("disk full")

    monkeypatch.setattr(h.store, "write", failing)

    async def run() -> None:
        writer = GroupCommit(h.broker)
        task = asyncio.create_task(writer.run())
        await asyncio.wait_for(writer.until(lambda: len(commits) >= 3), timeout=10)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    # When the writer has tried three times
    asyncio.run(run())
    # Then it tried with growing pauses (100 ms, then 200 ms), not thousands of times
    first, second, third = commits
    assert h.broker.staging and second - first >= 0.09 and third - second >= 0.19


@pytest.mark.parametrize("topic", ["dd", "capped"])
def test_topics_with_dedupe_or_limits_refuse_a_publish_larger_than_a_chunk_with_413(h, topic):
    (reply,) = h.broker.step([publish(topic, CHUNK + 1)], set(), NOW).replies
    assert reply.status == 413 and "split it" in reply.error and str(CHUNK) in reply.error
    (reply,) = h.broker.step([publish(topic, CHUNK)], set(), NOW).replies
    assert reply.status == 200


def test_the_writer_holds_back_a_connections_later_requests_until_its_staged_publish_is_answered(h):
    """Replies of one connection stay in the order it sent its requests; others go on."""
    got: list[tuple[str, int]] = []

    async def run() -> None:
        writer = GroupCommit(h.broker)
        task = asyncio.create_task(writer.run())
        conn_a = lambda reply: got.append(("a", int(reply.id)))  # noqa: E731
        conn_b = lambda reply: got.append(("b", int(reply.id)))  # noqa: E731
        writer.submit(publish("bulk", 10, rid=1), conn_a)
        writer.submit(publish("bulk", 1, rid=2), conn_a)
        writer.submit(publish("bulk", 1, rid=3), conn_b)
        writer.stop()
        await task

    asyncio.run(run())
    assert got == [("b", 3), ("a", 1), ("a", 2)]


def test_fsck_reports_staged_rows_left_without_their_record(h):
    h.broker.step([publish("bulk", 10)], set(), NOW)
    with h.store.write() as txn:
        txn.put_staged(None)  # the record lost, the rows kept
    found = h.fsck()
    assert any("counts 0 stored, the store holds 4" in line for line in found), found
