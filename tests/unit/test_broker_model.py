"""The broker against a small reference model of PROTOCOL §3.

Hypothesis drives the real Broker on a real LMDB store with random publishes
(some with a bad message, some replacing a dedupe key), deliveries to open
subscribers, acks, RECONNECTs, returned batches, confirmed writes on an
`AckRequired: false` topic, clock steps and restarts; topics have MaxMessages or
MaxBytes with either OverflowPolicy, and MaxAttempts with or without DeadLetter. After every step the
batches pushed must be exactly the ones the model predicts (topic, order,
contents) and every STATUS counter must agree. Only the clock is fake.

CHUNK_MESSAGES is made small, so that publishes larger than it are staged over
several steps (staging.py) on the topic `bulk`, interleaved with everything
else, crashed by restarts and cut short by a bad message; on the other topics
they are refused.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from dataclasses import dataclass, field

import msgspec
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from ppmq import protocol as p
from ppmq import staging
from ppmq.broker import Broker
from ppmq.config import Config, SubscriberConfig, TopicConfig
from ppmq.fsck import check, read_snapshot
from ppmq.ops import Returned, Written
from ppmq.state import NS
from ppmq.store import Store

SUBS = {"s1": (3, 5), "s2": (2, 2)}  # name: (BatchSize, Window)
TOPICS = [
    TopicConfig(
        name="plain", subscribers=["s1", "s2"], ack_retry=5.0, priorities=2, expire=True,
        max_messages=6, overflow_policy="drop-oldest", max_attempts=2, dead_letter="dead",
    ),
    TopicConfig(name="dd", subscribers=["s1", "s2"], dedupe=True, priorities=3, expire=True, max_bytes=150, max_attempts=3),
    TopicConfig(name="auto", subscribers=["s2"], ack_required=False, max_messages=4),
    TopicConfig(name="dead", subscribers=["s1"], priorities=2, max_messages=3),
    TopicConfig(name="bulk", subscribers=["s1", "s2"], priorities=2, expire=True, ack_retry=3.0),
]
CHUNK = 3  # staging.CHUNK_MESSAGES while the machine runs
TOPIC_IDS = {t.name: i for i, t in enumerate(TOPICS, 1)}
SUB_IDS = {s: i for i, s in enumerate(SUBS, 1)}
KEYS = ["a", "b", "c"]
START_NS = 1_800_000_000 * NS


@dataclass
class Msg:
    payload: int
    prio: int
    expires_ns: int  # 0: never
    m: int = 0  # the broker's message id, given when it is stored
    key: str = ""  # as delivered
    published_ns: int = 0
    origin: bytes | None = None  # of a dead letter (PROTOCOL §8)

    def size(self) -> int:
        """What MaxBytes counts: the message's JSON as delivered."""
        return len(p.message_fragment(self.key, b"%d" % self.payload, self.prio, self.expires_ns, self.origin))


@dataclass
class Job:
    """A publish being staged: `done` messages of it stored unseen so far."""

    req: p.Request
    idents: list[tuple[object, Msg]]
    bad_at: int | None
    done: int = 0
    reserved: bool = False  # its first chunk took the ids


@dataclass
class Counters:
    delivered: int = 0
    acked: int = 0
    redelivered: int = 0
    expired: int = 0
    ignored: int = 0
    dead_lettered: int = 0


@dataclass
class TopicModel:
    config: TopicConfig
    msgs: dict[object, Msg] = field(default_factory=dict)  # ident -> live message
    ready: dict[str, dict[object, tuple[int, int, int]]] = field(default_factory=dict)  # ident -> (prio, pos, attempts)
    inflight: dict[str, dict[object, tuple[int, int, int, int]]] = field(default_factory=dict)  # + deadline
    counters: dict[str, Counters] = field(default_factory=dict)
    seq: int = 0
    published: int = 0
    replaced: int = 0
    expired: int = 0
    dropped: int = 0

    def __post_init__(self) -> None:
        for s in self.config.subscribers:
            self.ready[s], self.inflight[s], self.counters[s] = {}, {}, Counters()

    def next_pos(self) -> int:
        self.seq += 1
        return self.seq

    def publish(self, ident: object, msg: Msg) -> bool:
        """PROTOCOL §3 Fan-out and Dedupe; False when the topic is full."""
        if ident not in self.msgs:
            msg.m = self.seq + 1
            msg.key = ident if self.config.dedupe else str(msg.m)
            if not self.make_room(msg.size()):
                return False
            pos = self.next_pos()
            for s in self.config.subscribers:
                self.ready[s][ident] = (msg.prio, pos, 0)
        else:
            old = self.msgs[ident]
            msg.m, msg.key = old.m, old.key
            self.replaced += 1
            new_pos = None
            for s in self.config.subscribers:
                place = self.ready[s].get(ident)
                if place is not None and msg.prio >= place[0]:
                    self.ready[s][ident] = (place[0], place[1], 0)
                    continue
                self.ready[s].pop(ident, None)
                self.inflight[s].pop(ident, None)
                new_pos = new_pos or self.next_pos()
                self.ready[s][ident] = (msg.prio, new_pos, 0)
        self.msgs[ident] = msg
        self.published += 1
        return True

    def reveal(self, first: int, idents: list[tuple[object, Msg]]) -> None:
        """A staged publish made whole: its messages at the ids reserved for it."""
        for i, (ident, msg) in enumerate(idents):
            msg.m = first + i
            msg.key = str(msg.m)
            for s in self.config.subscribers:
                self.ready[s][ident] = (msg.prio, msg.m, 0)
            self.msgs[ident] = msg
        self.published += len(idents)

    def stored_bytes(self) -> int:
        return sum(msg.size() for msg in self.msgs.values())

    def make_room(self, size: int) -> bool:
        """MaxMessages / MaxBytes: drop the oldest of the lowest priority, or refuse."""
        c = self.config
        if c.max_bytes and size > c.max_bytes:
            return False
        while (c.max_messages and len(self.msgs) >= c.max_messages) or (c.max_bytes and self.stored_bytes() + size > c.max_bytes):
            waiting = [(-prio, pos, ident) for s in c.subscribers for ident, (prio, pos, _) in self.ready[s].items()]
            if c.overflow_policy != "drop-oldest" or not waiting:
                return False
            self.discard(min(waiting)[2])
            self.dropped += 1
        return True

    def discard(self, ident: object) -> list[str]:
        """Gone from every queue and from in flight; the subscribers that held it."""
        held = [s for s in self.config.subscribers if self.ready[s].pop(ident, None) or self.inflight[s].pop(ident, None)]
        del self.msgs[ident]
        return held

    def holds(self, ident: object) -> bool:
        return any(ident in self.ready[s] or ident in self.inflight[s] for s in self.config.subscribers)

    def finish(self, s: str, ident: object) -> None:
        del self.inflight[s][ident]
        self.counters[s].acked += 1
        if not self.holds(ident):
            del self.msgs[ident]

    def expire(self, now_ns: int) -> None:
        if self.config.expire:
            for ident, msg in list(self.msgs.items()):
                if msg.expires_ns and msg.expires_ns <= now_ns:
                    self.expired += 1
                    for s in self.discard(ident):
                        self.counters[s].expired += 1

    def due(self, now_ns: int) -> list[tuple]:
        """In-flight entries past AckRetry, as the broker's deadline index orders them."""
        t = TOPIC_IDS[self.config.name]
        return [
            (deadline, t, SUB_IDS[s], self.msgs[ident].m, self.config.name, s, ident)
            for s in self.config.subscribers
            for ident, (_, _, deadline, _) in self.inflight[s].items()
            if deadline and deadline <= now_ns
        ]

    def requeue(self, s: str, ident: object) -> tuple[Msg, int] | None:
        """Back to its place; after MaxAttempts deliveries, given up: returns the
        message and its deliveries."""
        prio, pos, _, attempts = self.inflight[s].pop(ident)
        if self.config.max_attempts and attempts >= self.config.max_attempts:
            self.counters[s].dead_lettered += 1
            msg = self.msgs[ident]
            if not self.holds(ident):
                del self.msgs[ident]
            return msg, attempts
        self.ready[s][ident] = (prio, pos, attempts)
        return None

    def pull(self, s: str, now_ns: int) -> list[object]:
        batch, window = SUBS[s]
        limit = min(batch, window - len(self.inflight[s]))
        order = sorted(self.ready[s], key=lambda i: self.ready[s][i][:2])[: max(0, limit)]
        deadline = now_ns + int(self.config.ack_retry * NS) if self.config.ack_retry else 0
        for ident in order:
            prio, pos, attempts = self.ready[s].pop(ident)
            self.inflight[s][ident] = (prio, pos, deadline, attempts + 1)
            self.counters[s].delivered += 1
            self.counters[s].redelivered += attempts > 0
        return order


class BrokerMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="ppmq-model-")
        subs = [SubscriberConfig(name=n, socket=f"/nonexistent/{n}", batch_size=b, window=w) for n, (b, w) in SUBS.items()]
        self.config = Config(server_socket="/nonexistent/s", data_path=self.dir, subscribers=subs, topics=TOPICS, sync=False)
        self.now = START_NS
        self.model = {t.name: TopicModel(t) for t in TOPICS}
        self.payloads = iter(range(1, 10**9))
        self.keys: dict[tuple[str, object], str] = {}  # (topic, ident) -> key the broker delivered it with
        self.written: list = []  # deliveries of the last step, which may still fail to be written
        self.unconfirmed: list = []  # written to an AckRequired: false subscriber, Written not yet applied
        self.jobs: list[Job] = []  # large publishes: the head is being staged, the others wait
        self.orphan: int | None = None  # rows of an ended staging still to delete
        self.chunk_was, staging.CHUNK_MESSAGES = staging.CHUNK_MESSAGES, CHUNK
        self._open()

    def _open(self) -> None:
        self.store = Store(self.dir, sync=False, max_bytes=64 << 20)
        self.broker = Broker(self.config, self.store, self.now)

    def teardown(self) -> None:
        """Whatever the run did, fsck finds the store's rows, indexes and counters
        in agreement (in-flight publish times, staged rows and drops included)."""
        staging.CHUNK_MESSAGES = self.chunk_was
        self.store.close()
        try:
            assert check(read_snapshot(self.dir), self.config) == []
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def step(self, ops: list, open_subs: set[str] = frozenset(), apply=None) -> list:
        """One broker step; the model applies the ops (`apply` gets the replies), ticks
        and fills the same way, and both must agree."""
        result = self.broker.step(ops, set(open_subs), self.now)
        if apply is not None:
            apply(result.replies)
        self.stage(result.finished)
        self.tick()
        expected = []
        for s in sorted(open_subs):
            for tm in self.model.values():
                while s in tm.config.subscribers and (order := tm.pull(s, self.now)):  # batches up to the window
                    expected.append((s, tm.config.name, [self._expected_message(tm, i) for i in order], order))
        got = [(d.subscriber, d.topic, msgspec.json.decode(d.frame)["Messages"]) for d in result.deliveries]
        self._learn_keys(expected, got)
        assert [(s, t, [dict(m, Key=None) for m in ms]) for s, t, ms in got] == [(s, t, ms) for s, t, ms, _ in expected]
        self.written = [(d, order) for d, (*_, order) in zip(result.deliveries, expected)]
        self.unconfirmed += [(d, order) for d, order in self.written if d.auto_ack]
        return result.replies

    def stage(self, finished: list) -> None:
        """The model of Staging.step: an orphan's rows deleted a chunk at a time, or
        the head job's next chunk, which may fail, or make it whole and visible."""
        expected = []
        if self.orphan is not None:
            self.orphan = self.orphan - CHUNK if self.orphan >= CHUNK else None
        elif self.jobs:
            job, tm = self.jobs[0], self.model["bulk"]
            end = min(job.done + CHUNK, len(job.idents))
            if job.bad_at is not None and job.done <= job.bad_at < end:
                expected.append((job.req, 400, f"Messages[{job.bad_at}].Priority"))
                self.orphan = job.done if job.reserved else None
                self.jobs.pop(0)
            else:
                if not job.reserved:
                    job.reserved, job.first = True, tm.seq + 1
                    tm.seq += len(job.idents)
                job.done = end
                if end == len(job.idents):
                    tm.reveal(job.first, job.idents)
                    expected.append((job.req, 200, len(job.idents)))
                    self.jobs.pop(0)
        assert len(finished) == len(expected), (finished, expected)
        for (req, reply), (want_req, status, detail) in zip(finished, expected):
            assert req is want_req and reply.status == status, reply
            assert reply.accepted == detail if status == 200 else detail in reply.error, reply

    def _expected_message(self, tm: TopicModel, ident: object) -> dict:
        msg = tm.msgs[ident]
        out = {"Key": None, "Payload": msg.payload, "Priority": msg.prio}
        if msg.expires_ns:
            out["Expires"] = p.format_expires(msg.expires_ns)
        if msg.origin is not None:
            out["Origin"] = msgspec.json.decode(msg.origin)
        return out

    def _learn_keys(self, expected: list, got: list) -> None:
        """Dedupe topics deliver the client's key; others a generated one, fixed per message."""
        for (_, topic, _, order), (_, _, messages) in zip(expected, got):
            for ident, m in zip(order, messages):
                known = self.keys.setdefault((topic, ident), m["Key"])
                assert m["Key"] == known
                assert m["Key"] == self.model[topic].msgs[ident].key

    # --- rules ----------------------------------------------------------------------

    @rule(
        topic=st.sampled_from(["plain", "dd", "auto", "dead", "bulk"]),
        spec=st.lists(st.tuples(st.integers(0, 2), st.sampled_from(KEYS), st.sampled_from([None, 2, 6, 30])), min_size=1, max_size=10),
        bad_at=st.none() | st.integers(0, 9),
        subs=st.sets(st.sampled_from(sorted(SUBS))),
    )
    def publish(self, topic: str, spec: list, bad_at: int | None, subs: set[str]) -> None:
        """A publish, in a step that may also push to open subscribers."""
        tm = self.model[topic]
        messages, idents = [], []
        for i, (prio, key, ttl) in enumerate(spec):
            prio = prio % tm.config.priorities if i != bad_at else tm.config.priorities
            payload = next(self.payloads)
            messages.append(p.Message(payload=msgspec.Raw(b"%d" % payload), priority=prio, key=key, ttl_s=ttl))
            idents.append((key if tm.config.dedupe else payload, Msg(payload, prio, self.now + ttl * NS if ttl else 0, published_ns=self.now)))
        req = p.Request(topic=topic, messages=messages, id=msgspec.Raw(b"1"))

        def apply(replies: list) -> None:
            (reply,) = replies
            if len(spec) > CHUNK and topic != "bulk":  # Dedupe or limits: too large to stage
                assert reply.status == 413 and "split it" in reply.error, reply
                return
            if len(spec) > CHUNK:  # staged: answered in the step that ends it
                assert reply is None
                self.jobs.append(Job(req, idents, bad_at if bad_at is not None and bad_at < len(spec) else None))
                return
            if bad_at is not None and bad_at < len(spec):
                assert reply.status == 400 and f"Messages[{bad_at}].Priority" in reply.error
                return
            trial = copy.deepcopy(tm)
            full_at = next((i for i, (ident, msg) in enumerate(idents) if not trial.publish(ident, msg)), None)
            if full_at is None:
                assert (reply.status, reply.accepted) == (200, len(spec))
                self.model[topic] = trial
            else:  # the whole publish is refused; nothing dropped for it stays dropped
                assert reply.status == 507 and reply.error.startswith(f"Messages[{full_at}]: "), reply

        self.step([req], subs, apply)

    def requeue(self, tm: TopicModel, s: str, ident: object) -> None:
        """The model of Broker._requeue: a message given up goes to DeadLetter, if it has room."""
        given_up = tm.requeue(s, ident)
        if given_up is not None and tm.config.dead_letter:
            msg, attempts = given_up
            target = self.model[tm.config.dead_letter]
            prio = min(msg.prio, target.config.priorities - 1)
            origin = p.origin(tm.config.name, s, "attempts", attempts, msg.published_ns, msg.key.encode())
            target.publish((msg.payload, s), Msg(msg.payload, prio, 0, published_ns=self.now, origin=origin))

    def tick(self) -> None:
        for tm in self.model.values():
            tm.expire(self.now)
        for *_, topic, s, ident in sorted(e for tm in self.model.values() for e in tm.due(self.now)):
            self.requeue(self.model[topic], s, ident)

    @rule(subs=st.sets(st.sampled_from(sorted(SUBS)), min_size=1))
    def deliver(self, subs: set[str]) -> None:
        self.step([], subs)

    @precondition(lambda self: self.written)
    @rule(data=st.data())
    def a_write_fails(self, data) -> None:
        d, order = data.draw(st.sampled_from(self.written))
        self.unconfirmed = [u for u in self.unconfirmed if u[0] is not d]
        self.step([Returned(d.subscriber, d.topic, d.msgs)])
        tm = self.model[d.topic]
        for ident in order:
            if ident in tm.inflight[d.subscriber]:
                prio, pos, _, attempts = tm.inflight[d.subscriber].pop(ident)
                tm.ready[d.subscriber][ident] = (prio, pos, attempts - 1)
                tm.counters[d.subscriber].delivered -= 1
                tm.counters[d.subscriber].redelivered -= attempts > 1

    @precondition(lambda self: self.unconfirmed)
    @rule()
    def writes_are_confirmed(self) -> None:
        ops = [Written(d.subscriber, d.topic, d.msgs) for d, _ in self.unconfirmed]
        self.step(ops)
        for d, order in self.unconfirmed:
            tm = self.model[d.topic]
            for ident in order:
                if ident in tm.inflight[d.subscriber]:
                    tm.finish(d.subscriber, ident)
        self.unconfirmed = []

    @rule(data=st.data(), topic=st.sampled_from(["plain", "dd", "dead"]), sub=st.sampled_from(sorted(SUBS)))
    def ack(self, data, topic: str, sub: str) -> None:
        """Acks of in-flight keys apply; unknown, ready-only and repeated keys are ignored."""
        tm = self.model[topic]
        if sub not in tm.config.subscribers:
            return
        inflight_keys = {self.keys[(topic, i)]: i for i in tm.inflight[sub]}
        chosen = data.draw(st.lists(st.sampled_from(sorted(inflight_keys)), unique=True)) if inflight_keys else []
        ready_keys = [self.keys[(topic, i)] for i in tm.ready[sub] if (topic, i) in self.keys]
        strays = [k for k in ["999999", "zzz", *ready_keys, *chosen[:1]] if k not in inflight_keys or k in chosen]
        stray = data.draw(st.sampled_from(strays))
        (reply,) = self.step([p.Request(topic=topic, subscriber=sub, acks=[*chosen, stray], id=msgspec.Raw(b"2"))])
        assert (reply.status, reply.accepted) == (200, len(chosen))
        for key in chosen:
            tm.finish(sub, inflight_keys[key])
        tm.counters[sub].ignored += 1

    @rule(sub=st.sampled_from(sorted(SUBS)), topic=st.none() | st.sampled_from(["plain", "dd"]))
    def reconnect(self, sub: str, topic: str | None) -> None:
        if topic is not None and sub not in self.model[topic].config.subscribers:
            return
        (reply,) = self.step([p.Request(subscriber=sub, topic=topic, command="RECONNECT", id=msgspec.Raw(b"3"))])
        assert reply.status == 200
        for tm in self.model.values():
            if sub in tm.config.subscribers and topic in (None, tm.config.name):
                for ident in sorted(tm.inflight[sub], key=lambda i: tm.msgs[i].m):
                    self.requeue(tm, sub, ident)
        self.unconfirmed = [u for u in self.unconfirmed if u[0].subscriber != sub]

    @rule(seconds=st.sampled_from([0.5, 1, 3, 5, 7]))
    def time_passes(self, seconds: float) -> None:
        self.now += int(seconds * NS)
        self.step([])

    @rule()
    def restart(self) -> None:
        """What was pushed on an AckRequired: false topic, unconfirmed, comes back."""
        self.store.close()
        self._open()
        if self.jobs and self.jobs[0].reserved:  # the staged rows of a publish never answered
            self.orphan = self.jobs[0].done
        self.jobs = []
        self.written = []
        for tm in self.model.values():
            if not tm.config.ack_required:
                for s in tm.config.subscribers:
                    for ident in sorted(tm.inflight[s], key=lambda i: tm.msgs[i].m):
                        self.requeue(tm, s, ident)
        self.unconfirmed = []

    # --- invariants ---------------------------------------------------------------------

    @invariant()
    def status_counters_agree_with_the_model(self) -> None:
        """STATUS in a step of its own, which also stages a chunk (after STATUS has
        read the counters); the batches it would push wait for the next step."""
        written = self.written
        self.step([p.Request(command="STATUS", id=msgspec.Raw(b"9"))], set(), lambda replies: self.compare(replies[0]))
        self.written = written

    def compare(self, reply: p.Reply) -> None:
        topics = reply.body["Topics"]
        for name, tm in self.model.items():
            got = topics[name]
            counts = (got["Stored"], got["Published"], got["Replaced"], got["Expired"], got["StoredBytes"], got["Dropped"])
            assert counts == (len(tm.msgs), tm.published, tm.replaced, tm.expired, tm.stored_bytes(), tm.dropped), name
            for s in tm.config.subscribers:
                sub = got["Subscribers"][s]
                ready = [0] * tm.config.priorities
                for prio, _, _ in tm.ready[s].values():
                    ready[prio] += 1
                c = tm.counters[s]
                assert sub["Ready"] == ready, (name, s)
                assert sub["InFlight"] == len(tm.inflight[s]), (name, s)
                counts = (sub["Delivered"], sub["Acked"], sub["Redelivered"], sub["Expired"], sub["IgnoredAcks"], sub["DeadLettered"])
                assert counts == (c.delivered, c.acked, c.redelivered, c.expired, c.ignored, c.dead_lettered), (name, s)


BrokerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=50, deadline=None)
test_broker_agrees_with_the_reference_model = BrokerMachine.TestCase
