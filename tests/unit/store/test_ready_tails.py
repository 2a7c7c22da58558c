"""Ready queues kept in memory (store/ready_tails.py) change nothing anyone can see.

Two brokers on two real stores take the same steps at the same times: one keeps
tails, the other none (a budget of 0 bytes), so it reads every batch from its
rows. Hypothesis drives publishes (priorities, TTLs, Delays, dedupe keys), a
Window full and then freed by acks, nacks, AckRetry redeliveries, RECONNECT,
PURGE, PAUSE, requests that fail half way, a large publish staged over several
steps, and restarts; every step's replies, batches (byte for byte), journal
events and STATUS must be the same in both. A deterministic test shows that the
path is taken.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import msgspec
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from ppmq.config import Config, JournalConfig, SubscriberConfig, TopicConfig
from ppmq.core import staging
from ppmq.core.broker import Broker
from ppmq.core.ops import Abandoned, Take
from ppmq.protocol import messages as p
from ppmq.store import ready as ready_rows
from ppmq.store.fsck import check, read_snapshot
from ppmq.store.ready_tails import ReadyTails
from ppmq.store.state import NS
from ppmq.store.store import Store

START_NS = 1_800_000_000 * NS
SUBS = {"s1": (3, 3), "s2": (2, 4)}  # name: (BatchSize, Window)
PULL = "w"  # a Pull subscriber (PROTOCOL §9), Window 4, whose takers TAKE
ANY_SUB = st.sampled_from([*sorted(SUBS), PULL])
TOPICS = [
    TopicConfig(name="plain", subscribers=["s1", "s2", PULL], priorities=3, ack_retry=4.0),
    TopicConfig(name="exp", subscribers=["s1", PULL], priorities=2, expire=True),
    TopicConfig(name="dd", subscribers=["s1", "s2", PULL], dedupe=True, priorities=2),
]
OPEN = st.sets(st.sampled_from(sorted(SUBS)))


def config(path: str) -> Config:
    subs = [SubscriberConfig(name=n, socket=f"/nonexistent/{n}", batch_size=b, window=w) for n, (b, w) in SUBS.items()]
    subs.append(SubscriberConfig(name=PULL, pull=True, window=4))
    return Config(
        server_socket="/nonexistent/s", data_path=path, subscribers=subs, topics=TOPICS, sync=False, journal=JournalConfig(enabled=True)
    )


class Twins(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.dirs = [tempfile.mkdtemp(prefix="ppmq-tails-") for _ in range(2)]
        self.now = START_NS
        self.payloads = iter(range(1, 10**9))
        self.delivered: dict[tuple[str, str], list[str]] = {}  # (topic, sub) -> keys in flight, as both delivered them
        self.chunk_was, staging.CHUNK_MESSAGES = staging.CHUNK_MESSAGES, 4
        self.run_was, ready_rows.READY_RUN = ready_rows.READY_RUN, 2
        self._open()

    def _open(self) -> None:
        self.stores = [Store(d, sync=False, max_bytes=64 << 20) for d in self.dirs]
        self.stores[1].ready_tails.budget_bytes = 0
        self.brokers = [Broker(config(d), store, self.now) for d, store in zip(self.dirs, self.stores)]

    def teardown(self) -> None:
        staging.CHUNK_MESSAGES, ready_rows.READY_RUN = self.chunk_was, self.run_was
        for d, store in zip(self.dirs, self.stores):
            store.close()
            try:
                assert check(read_snapshot(d), config(d)) == []
            finally:
                shutil.rmtree(d, ignore_errors=True)

    def step(self, ops: list, open_subs: set[str] = frozenset()) -> None:
        with_tails, without = (b.step(list(ops), set(open_subs), self.now) for b in self.brokers)
        assert with_tails.replies == without.replies
        assert [(d.subscriber, d.topic, d.msgs, d.frame) for d in with_tails.deliveries] == [
            (d.subscriber, d.topic, d.msgs, d.frame) for d in without.deliveries
        ]
        assert with_tails.finished == without.finished
        assert [msgspec.json.encode(e) for e in with_tails.events] == [msgspec.json.encode(e) for e in without.events]
        for d in with_tails.deliveries:
            keys = [m["Key"] for m in msgspec.json.decode(d.frame)["Messages"]]
            self.delivered.setdefault((d.topic, d.subscriber), []).extend(keys)
        for op, reply in zip(ops, with_tails.replies):
            if isinstance(op, Take) and reply.status == 200:
                keys = [msgspec.json.decode(m)["Key"] for m in reply.body["Messages"]]
                self.delivered.setdefault((op.request.topic, PULL), []).extend(keys)

    def _in_flight(self, data, topic: str, sub: str) -> list[str]:
        keys = self.delivered.get((topic, sub), [])
        return data.draw(st.lists(st.sampled_from(keys), unique=True)) if keys else []

    @rule(
        topic=st.sampled_from(["plain", "plain", "exp", "dd"]),
        spec=st.lists(
            st.tuples(st.integers(0, 2), st.sampled_from("abc"), st.sampled_from([None, None, 1, 5]), st.sampled_from([None] * 7 + [2.0])),
            min_size=1,
            max_size=9,
        ),
        bad=st.sampled_from([False] * 4 + [True]),
        subs=OPEN,
    )
    def publish(self, topic: str, spec: list, bad: bool, subs: set[str]) -> None:
        """A publish (a large one is staged over several steps), alone or with a
        request after it that fails, which makes the step run again with savepoints."""
        prios = {t.name: t.priorities for t in TOPICS}[topic]
        messages = [
            p.Message(payload=msgspec.Raw(b"%d" % next(self.payloads)), priority=prio % prios, key=key, ttl_s=ttl, delay=delay)
            for prio, key, ttl, delay in spec
        ]
        ops = [p.Request(topic=topic, messages=messages, id=msgspec.Raw(b"1"))]
        if bad:
            ops.append(p.Request(topic="plain", messages=[p.Message(payload=msgspec.Raw(b"0"), priority=9)], id=msgspec.Raw(b"2")))
        self.step(ops, subs)

    @rule(data=st.data(), topic=st.sampled_from(["plain", "exp", "dd"]), sub=ANY_SUB, subs=OPEN)
    def ack(self, data, topic: str, sub: str, subs: set[str]) -> None:
        if sub not in {s for t in TOPICS if t.name == topic for s in t.subscribers}:
            return
        keys = self._in_flight(data, topic, sub)
        self.step([p.Request(topic=topic, subscriber=sub, acks=keys + ["999999"], id=msgspec.Raw(b"3"))], subs | {sub})
        self.delivered[topic, sub] = [k for k in self.delivered.get((topic, sub), []) if k not in keys]

    @rule(topic=st.sampled_from(["plain", "exp", "dd"]), sub=st.sampled_from(sorted(SUBS)))
    def ack_all(self, topic: str, sub: str) -> None:
        """What a subscriber that keeps up does: ack its batches, and take the next."""
        keys = self.delivered.pop((topic, sub), [])
        self.step([p.Request(topic=topic, subscriber=sub, acks=keys)] if keys else [], {sub})

    @rule(data=st.data(), sub=ANY_SUB, delay=st.sampled_from([None, 0, 3.0]), subs=OPEN)
    def nack(self, data, sub: str, delay: float | None, subs: set[str]) -> None:
        keys = self._in_flight(data, "plain", sub)
        self.step([p.Request(topic="plain", subscriber=sub, nacks=keys, delay=delay, id=msgspec.Raw(b"4"))], subs)
        self.delivered["plain", sub] = [k for k in self.delivered.get(("plain", sub), []) if k not in keys]

    @rule(subs=OPEN)
    def deliver(self, subs: set[str]) -> None:
        self.step([], subs)

    @rule(data=st.data(), topic=st.sampled_from(["plain", "exp", "dd"]), taker=st.sampled_from([1, 2]), count=st.integers(1, 5), subs=OPEN)
    def take(self, data, topic: str, taker: int, count: int, subs: set[str]) -> None:
        """A worker of the Pull subscriber TAKEs, acking some of what it holds first."""
        acks = self._in_flight(data, topic, PULL)
        req = p.Request(topic=topic, subscriber=PULL, command="TAKE", count=count, id=msgspec.Raw(b"7"), acks=acks or None)
        self.step([Take(taker, req)], subs)
        self.delivered[topic, PULL] = [k for k in self.delivered.get((topic, PULL), []) if k not in acks]

    @rule(taker=st.sampled_from([1, 2]), subs=OPEN)
    def taker_gone(self, taker: int, subs: set[str]) -> None:
        """What it took and did not ack is ready again (the keys kept for acks may be stale: acks of those are ignored)."""
        self.step([Abandoned(taker)], subs)

    @rule(seconds=st.sampled_from([0.5, 2, 5]), subs=OPEN)
    def time_passes(self, seconds: float, subs: set[str]) -> None:
        """Delays come due, messages expire, AckRetry sends again."""
        self.now += int(seconds * NS)
        self.step([], subs)

    @rule(sub=ANY_SUB, command=st.sampled_from(["RECONNECT", "PURGE", "PAUSE", "RESUME"]), subs=OPEN)
    def command(self, sub: str, command: str, subs: set[str]) -> None:
        topic = None if command == "RECONNECT" else "plain"
        self.step([p.Request(topic=topic, subscriber=sub, command=command, id=msgspec.Raw(b"5"))], subs)
        if command in ("RECONNECT", "PURGE"):
            for key in [k for k in self.delivered if k[1] == sub and (topic is None or k[0] == topic)]:
                self.delivered[key] = [] if command == "RECONNECT" else self.delivered[key]

    @rule()
    def restart(self) -> None:
        for store in self.stores:
            store.close()
        self._open()

    @invariant()
    def tails_agree_with_their_rows(self) -> None:
        assert self.stores[0].ready_tails.disagreed == 0

    @invariant()
    def same_status(self) -> None:
        status = [b.step([p.Request(command="STATUS", id=msgspec.Raw(b"6"))], set(), self.now).replies[0].body for b in self.brokers]
        assert status[0]["Topics"] == status[1]["Topics"]


Twins.TestCase.settings = settings(max_examples=int(os.environ.get("PPMQ_MODEL_EXAMPLES", 200)), stateful_step_count=50, deadline=None)
test_tails_change_nothing_anyone_can_see = Twins.TestCase


class Pair:
    """The twin brokers outside Hypothesis: each step is taken by both and compared."""

    def __init__(self, path, monkeypatch) -> None:
        self.machine = Twins.__new__(Twins)
        self.machine.dirs = [str(path / "tails"), str(path / "rows")]
        self.machine.now = START_NS
        self.machine.payloads = iter(range(1, 10**9))
        self.machine.delivered = {}
        monkeypatch.setattr(staging, "CHUNK_MESSAGES", 4)
        self.machine._open()
        self.taken: list[list[int]] = []  # what each take from a tail gave
        take = ReadyTails.take
        monkeypatch.setattr(ReadyTails, "take", lambda tails, *args: self._note(take(tails, *args), tails))

    def _note(self, taken, tails):
        if taken is not None and tails is self.machine.stores[0].ready_tails:
            self.taken.append([m for m, *_ in taken])
        return taken

    def publish(self, *prios: int, topic: str = "plain", subs: frozenset = frozenset({"s1"}), **fields: object) -> None:
        messages = [p.Message(payload=msgspec.Raw(b"%d" % next(self.machine.payloads)), priority=prio, **fields) for prio in prios]
        self.machine.step([p.Request(topic=topic, messages=messages, id=msgspec.Raw(b"1"))], subs)

    def step(self, ops: list, subs: frozenset = frozenset({"s1"})) -> None:
        self.machine.step(ops, subs)

    def in_flight(self, topic: str = "plain", sub: str = "s1") -> list[str]:
        return self.machine.delivered.get((topic, sub), [])

    def ack(self, keys: list[str], topic: str = "plain", sub: str = "s1") -> None:
        keys = list(keys)  # not the list the step adds the next batch's keys to
        self.step([p.Request(topic=topic, subscriber=sub, acks=keys)], frozenset({sub}))
        self.machine.delivered[topic, sub] = [k for k in self.in_flight(topic, sub) if k not in keys]

    def keep_acking(self, batches: int) -> None:
        """s1 acks what it has, `batches` times: each ack makes room for a batch."""
        for _ in range(batches):
            self.ack(self.in_flight())

    def close(self) -> None:
        assert self.machine.stores[0].ready_tails.disagreed == 0
        self.machine.same_status()
        for store in self.machine.stores:
            store.close()
        for d in self.machine.dirs:
            assert check(read_snapshot(d), config(d)) == []


def full_window_and_a_tail(pair: Pair, topic: str = "plain", **fields: object) -> None:
    """s1's Window (3) full, and a publish of three behind it, kept as a tail."""
    pair.publish(0, 0, 0, topic=topic)
    pair.publish(2, 0, 1, topic=topic, **fields)


def test_a_batch_the_publishes_before_left_in_the_queue_is_taken_from_memory_in_queue_order(tmp_path, monkeypatch):
    pair = Pair(tmp_path, monkeypatch)
    # Given s1's Window full and two publishes of mixed priorities behind it
    full_window_and_a_tail(pair)  # priorities 2, 0, 1: ids 4, 5, 6 at 0, 1, 2 (a publish's ids go by priority)
    pair.publish(0, 2, 1)  # ids 7, 8, 9 at priorities 0, 1, 2
    # When s1 acks its batch, and then the next
    pair.keep_acking(3)
    # Then both batches came from memory, by priority then position, as from the rows
    assert pair.taken == [[4, 7, 5], [8, 6, 9]]
    pair.close()


def test_a_long_queue_in_memory_gives_its_batches_by_priority_then_position_across_publishes_cut_anywhere(tmp_path, monkeypatch):
    pair = Pair(tmp_path, monkeypatch)
    # Given s1's Window full and three publishes of mixed priorities behind it
    full_window_and_a_tail(pair)  # ids 4, 5, 6 at priorities 0, 1, 2
    pair.publish(1, 1, 1)  # ids 7, 8, 9
    pair.publish(0, 0, 2)  # ids 10, 11, 12 at priorities 0, 0, 2
    # When s1 acks its batch twice, a fourth publish comes, and s1 goes on acking
    pair.keep_acking(2)
    pair.publish(1)  # id 13
    pair.keep_acking(3)
    # Then each batch came from memory: a priority's publishes in order, the
    # second batch cutting the publish of 7, 8, 9 after 8, and 13 behind 9
    assert pair.taken == [[4, 10, 11], [5, 7, 8], [9, 13, 6], [12]]
    pair.close()


def test_a_pull_subscribers_takes_are_taken_from_memory_as_its_workers_take_and_ack(tmp_path, monkeypatch):
    pair = Pair(tmp_path, monkeypatch)
    # Given two publishes of mixed priorities that no worker of the Pull subscriber took yet
    pair.publish(2, 0, 1)  # ids 1, 2, 3 at priorities 0, 1, 2
    pair.publish(1, 0)  # ids 4, 5 at priorities 0, 1
    # When a worker takes three, then acks them in a TAKE of ten
    pair.step([Take(1, p.Request(topic="plain", subscriber=PULL, command="TAKE", count=3, id=msgspec.Raw(b"7")))])
    held = list(pair.in_flight(sub=PULL))
    pair.step([Take(1, p.Request(topic="plain", subscriber=PULL, command="TAKE", count=10, id=msgspec.Raw(b"7"), acks=held))])
    # Then both came from memory, by priority then position, as from the rows
    assert (held, pair.taken) == (["1", "4", "2"], [[1, 4, 2], [5, 3]])
    pair.close()


def redeliver_by_nack(pair: Pair) -> None:
    pair.step([p.Request(topic="plain", subscriber="s1", nacks=pair.in_flight()[:1])])


def redeliver_by_ack_retry(pair: Pair) -> None:
    pair.machine.now += 5 * NS  # AckRetry: 4 s
    pair.step([], frozenset())


def reconnect(pair: Pair) -> None:
    pair.step([p.Request(subscriber="s1", command="RECONNECT")], frozenset())
    pair.machine.delivered["plain", "s1"] = []


def purge(pair: Pair) -> None:
    pair.step([p.Request(topic="plain", subscriber="s1", command="PURGE", id=msgspec.Raw(b"7"))], frozenset())


def publish_delayed(pair: Pair) -> None:
    pair.publish(0, delay=1.0)
    pair.machine.now += 2 * NS


def stage_a_large_publish(pair: Pair) -> None:
    pair.publish(*[i % 3 for i in range(9)], subs=frozenset())


def purge_one_of_them(pair: Pair) -> None:
    pair.step([p.Request(topic="plain", subscriber="s1", command="PURGE", keys=["6"], id=msgspec.Raw(b"7"))], frozenset())


def join_it_and_fail_a_request(pair: Pair) -> None:
    """The tail grows in a step that runs again: the first run's growth is undone."""
    joining = p.Request(topic="plain", messages=[p.Message(payload=msgspec.Raw(b"0"), priority=1)] * 2)
    pair.step([joining, p.Request(topic="plain", messages=[p.Message(payload=msgspec.Raw(b"0"), priority=7)])])


def restart(pair: Pair) -> None:
    pair.machine.restart()


@pytest.mark.parametrize(
    "meanwhile",
    [
        redeliver_by_nack,
        redeliver_by_ack_retry,
        reconnect,
        purge,
        purge_one_of_them,
        publish_delayed,
        stage_a_large_publish,
        join_it_and_fail_a_request,
        restart,
    ],
)
def test_a_queue_changed_another_way_is_read_from_its_rows(tmp_path, monkeypatch, meanwhile):
    pair = Pair(tmp_path, monkeypatch)
    full_window_and_a_tail(pair)
    meanwhile(pair)
    pair.keep_acking(4)
    assert pair.taken == []
    pair.close()


def test_no_tail_is_kept_while_a_publish_is_staged_whose_entries_come_first(tmp_path, monkeypatch):
    pair = Pair(tmp_path, monkeypatch)
    # Given s1's Window full, and a large publish being staged (chunks of 4) when three come behind
    pair.publish(0, 0, 0)
    stage_a_large_publish(pair)
    pair.publish(2, 0, 1)
    # When s1 acks, while the staged publish is not whole and once it is
    pair.keep_acking(6)
    # Then every batch came from the rows, the staged messages first
    assert pair.taken == []
    pair.close()


def test_a_tail_whose_message_may_have_expired_or_was_replaced_is_read_from_its_rows(tmp_path, monkeypatch):
    pair = Pair(tmp_path, monkeypatch)
    full_window_and_a_tail(pair, topic="exp", ttl_s=1.0)
    pair.machine.now += 2 * NS
    pair.ack(pair.in_flight("exp"), topic="exp")
    full_window_and_a_tail(pair, topic="dd", key="k")
    pair.publish(0, topic="dd", key="k")
    pair.ack(pair.in_flight("dd"), topic="dd")
    assert pair.taken == []
    pair.close()
