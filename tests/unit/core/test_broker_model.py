"""The broker against a small reference model of PROTOCOL §3 and §8.

Hypothesis drives the real Broker on a real LMDB store with random publishes
(some with a bad message, some replacing a dedupe key, some waiting with a Delay
or a NotBefore), deliveries to open subscribers, acks, RECONNECTs, unwritten
batches, confirmed writes on an `AckRequired: false` topic, nacks (with and
without a Delay), rejects and touches in one request with acks, PURGE, REDRIVE,
PAUSE and RESUME, clock steps and restarts; topics have MaxMessages or MaxBytes
with either OverflowPolicy, and MaxAttempts with or without DeadLetter (and
DeadLetterReasons). After every step the batches pushed must be exactly the
ones the model (broker_model.py) predicts (topic, order, contents, a dead
letter's Origin) and every STATUS counter must agree, Delayed, Paused and
DeadLettered included. Only the clock is fake.

PROTOCOL §9 too: the Pull subscriber `w` is taken from by up to three takers,
several in one step (competing consumers), with acks in the TAKE or on their
own, and takers that go away; each TAKE must return exactly the messages the
model predicts, and after STATUS the takers the broker knows hold messages
must be the model's. The push subscriber `L` has two connections (lanes),
opened and closed from step to step: each batch must go to the lane the model
predicts, and what the step reports as gone from flight, booked on a
`lanes.LaneLoads` as the link books it, must leave each lane carrying what the
model says it carries.

CHUNK_MESSAGES is made small, so that publishes larger than it are staged over
several steps (core/staging.py) on the topic `bulk`, interleaved with everything
else, crashed by restarts and cut short by a bad message; on the other topics
they are refused. READY_RUN is made small too, so that queues of a few messages
are stored over several ready runs, which split and empty as entries come and go.

`PPMQ_MODEL_EXAMPLES` sets hypothesis' examples (default 200).
"""

from __future__ import annotations

import copy
import datetime as dt
import itertools
import os
import shutil
import tempfile

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

from ppmq.config import Config, JournalConfig, SubscriberConfig
from ppmq.core import staging
from ppmq.core.broker import Broker
from ppmq.core.lanes import LaneLoads
from ppmq.core.ops import Abandoned, Take, Unwritten, Written
from ppmq.protocol import messages as p
from ppmq.store import ready as ready_rows
from ppmq.store.fsck import check, read_snapshot
from ppmq.store.state import NS
from ppmq.store.store import Store
from tests.unit.core.broker_model import LANED, PULL, SUBS, TOPICS, Given, Job, Msg, TopicModel

CHUNK = 3  # staging.CHUNK_MESSAGES while the machine runs
RUN = 2  # ready_rows.READY_RUN while the machine runs
KEYS = ["a", "b", "c"]
START_NS = 1_800_000_000 * NS
WAITS = [("Delay", 0), ("Delay", 1.5), ("Delay", 4), ("Unix", -1), ("Unix", 2), ("RFC3339", 0), ("RFC3339", 2.5)]
OPEN = st.sampled_from([set(), {"s1"}, {"s2"}, {"s1", "s2"}])  # the subscribers open in a step
STRAYS = ["999999", "zzz", "007"]  # keys that name no message, or none the broker would write
EVERYONE = sorted([*SUBS, *PULL, *LANED])
[(LANED_SUB, (_, _, CONNECTIONS))] = LANED.items()
[PULL_SUB] = PULL
LANES = st.sampled_from([(True, False), (False, True), (True, True)])  # L's lanes open in a step
TAKERS = st.integers(1, 3)


class BrokerMachine(RuleBasedStateMachine):
    @initialize(journaled=st.booleans())
    def start(self, journaled: bool) -> None:
        """A broker with or without its journal: the paths that collect journal
        events must not change what the broker does, nor fail without them."""
        self.dir = tempfile.mkdtemp(prefix="ppmq-model-")
        subs = [SubscriberConfig(name=n, socket=f"/nonexistent/{n}", batch_size=b, window=w) for n, (b, w) in SUBS.items()]
        subs += [SubscriberConfig(name=n, pull=True, window=w) for n, w in PULL.items()]
        subs += [
            SubscriberConfig(name=n, socket=f"/nonexistent/{n}", batch_size=b, window=w, connections=c) for n, (b, w, c) in LANED.items()
        ]
        self.config = Config(
            server_socket="/nonexistent/s",
            data_path=self.dir,
            subscribers=subs,
            topics=TOPICS,
            sync=False,
            journal=JournalConfig(enabled=journaled),
        )
        self.now = START_NS
        self.model = {t.name: TopicModel(t) for t in TOPICS}
        self.payloads = iter(range(1, 10**9))
        self.serial = itertools.count()  # idents of the messages the broker makes: dead letters, redriven ones
        self.keys: dict[tuple[str, object], str] = {}  # (topic, ident) -> key the broker delivered it with
        self.written: list = []  # deliveries of the last step, which may still fail to be written
        self.unconfirmed: list = []  # written to an AckRequired: false subscriber, Written not yet applied
        self.jobs: list[Job] = []  # large publishes: the head is being staged, the others wait
        self.orphan: int | None = None  # rows of an ended staging still to delete
        self.chunk_was, staging.CHUNK_MESSAGES = staging.CHUNK_MESSAGES, CHUNK
        self.run_was, ready_rows.READY_RUN = ready_rows.READY_RUN, RUN
        self._open()

    def _open(self) -> None:
        self.store = Store(self.dir, sync=False, max_bytes=64 << 20)
        self.broker = Broker(self.config, self.store, self.now)
        self.ledger = LaneLoads(CONNECTIONS)  # what L's lanes carry, kept as its link keeps it

    def teardown(self) -> None:
        """Whatever the run did, fsck finds the store's rows, indexes and counters
        in agreement (in-flight publish times, staged rows and drops included)."""
        staging.CHUNK_MESSAGES = self.chunk_was
        ready_rows.READY_RUN = self.run_was
        self.store.close()
        try:
            assert check(read_snapshot(self.dir), self.config) == []
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def step(self, ops: list, open_subs: set[str] = frozenset(), apply=None, lanes: tuple[bool, ...] | None = None) -> list:
        """One broker step; the model applies the ops (`apply` gets the replies), ticks
        and fills the same way, and both must agree. `lanes`: those of L that are
        open (L is open when one is), reported with what each carries."""
        open_subs = set(open_subs) | ({LANED_SUB} if lanes else set())
        reported = {LANED_SUB: self.ledger.lanes(list(lanes))} if lanes else None
        result = self.broker.step(ops, open_subs, self.now, lanes=reported)
        if apply is not None:
            apply(result.replies)
        self.stage(result.finished)
        self.tick()
        expected = []
        for s in sorted(open_subs):
            for tm in self.model.values():
                while s in tm.config.subscribers:  # batches up to the window
                    order, lane = tm.pull_to_lane(s, self.now, list(lanes)) if s in LANED else (tm.pull(s, self.now), 0)
                    if not order:
                        break
                    expected.append((s, tm.config.name, [self._expected_message(tm, i) for i in order], lane, order))
        got = [(d.subscriber, d.topic, msgspec.json.decode(d.frame)["Messages"], d.lane) for d in result.deliveries]
        self._learn_keys(expected, got)
        assert [(s, t, [dict(m, Key=None) for m in ms], lane) for s, t, ms, lane in got] == [e[:4] for e in expected]
        self.written = [(d, order) for d, (*_, order) in zip(result.deliveries, expected)]
        self.unconfirmed += [(d, order) for d, order in self.written if d.auto_ack]
        self._book_lanes(result)
        return result.replies

    def _book_lanes(self, result) -> None:
        """As L's link does after a step (writer._free): its batches booked on their
        lanes, then what left flight freed."""
        for d in result.deliveries:
            if d.subscriber == LANED_SUB:
                self.ledger.carry(d.lane, d.topic, d.msgs)
        assert result.left.keys() <= {LANED_SUB}, result.left
        for topic, msgs in result.left.get(LANED_SUB, {}).items():
            self.ledger.left(topic, msgs)

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
        return self._as_delivered(tm.msgs[ident])

    def _as_delivered(self, msg: Msg) -> dict:
        """A message as a batch carries it, but for its Key (None)."""
        out = {"Key": None, "Payload": msg.payload, "Priority": msg.prio}
        if msg.expires_ns:
            out["Expires"] = p.format_expires(msg.expires_ns)
        if msg.origin is not None:
            out["Origin"] = msgspec.json.decode(msg.origin)
        return out

    def _learn_keys(self, expected: list, got: list) -> None:
        """Dedupe topics deliver the client's key; others a generated one, fixed per message."""
        for (_, topic, _, _, order), (_, _, messages, _) in zip(expected, got):
            for ident, m in zip(order, messages):
                known = self.keys.setdefault((topic, ident), m["Key"])
                assert m["Key"] == known
                assert m["Key"] == self.model[topic].msgs[ident].key

    # --- rules ----------------------------------------------------------------------

    @rule(
        topic=st.sampled_from(["plain", "dd", "dm", "auto", "dead", "bulk"]),
        spec=st.lists(st.tuples(st.integers(0, 2), st.sampled_from(KEYS), st.sampled_from([None, 2, 6, 30])), min_size=0, max_size=10),
        bad_at=st.none() | st.integers(0, 9),
        waits=st.none() | st.dictionaries(st.integers(0, 9), st.sampled_from(WAITS), min_size=1),
        subs=st.sets(st.sampled_from(sorted(SUBS))),
        lanes=st.none() | LANES,
    )
    def publish(self, topic: str, spec: list, bad_at: int | None, waits: dict | None, subs: set[str], lanes: tuple | None) -> None:
        """A publish, in a step that may also push to open subscribers; `waits`:
        the messages that wait, by index (PROTOCOL §8 Delay, NotBefore)."""
        tm = self.model[topic]
        waits = {i: w for i, w in (waits or {}).items() if i < len(spec)}
        messages, idents = [], []
        for i, (prio, key, ttl) in enumerate(spec):
            prio = prio % tm.config.priorities if i != bad_at else tm.config.priorities
            payload = next(self.payloads)
            message = p.Message(payload=msgspec.Raw(b"%d" % payload), priority=prio, key=key, ttl_s=ttl)
            due_ns = self._wait(message, waits.get(i))
            messages.append(message)
            msg = Msg(payload, prio, self.now + ttl * NS if ttl else 0, published_ns=self.now)
            idents.append((key if tm.config.dedupe else payload, msg, due_ns))
        req = p.Request(topic=topic, messages=messages, id=msgspec.Raw(b"1"))

        def apply(replies: list) -> None:
            (reply,) = replies
            if len(spec) > CHUNK and (topic != "bulk" or waits):  # Dedupe, limits, waits: not staged
                assert reply.status == 413 and "split it" in reply.error, reply
                return
            if len(spec) > CHUNK:  # staged: answered in the step that ends it
                assert reply is None
                self.jobs.append(
                    Job(req, [(ident, msg) for ident, msg, _ in idents], bad_at if bad_at is not None and bad_at < len(spec) else None)
                )
                return
            if bad_at is not None and bad_at < len(spec):
                assert reply.status == 400 and f"Messages[{bad_at}].Priority" in reply.error
                return
            trial = copy.deepcopy(tm)
            full_at = trial.publish_all(idents)
            if full_at is None:
                assert (reply.status, reply.accepted) == (200, len(spec))
                self.model[topic] = trial
            else:  # the whole publish is refused; nothing dropped for it stays dropped
                assert reply.status == 507 and reply.error.startswith(f"Messages[{full_at}]: "), reply

        self.step([req], subs, apply, lanes)

    def _wait(self, message: p.Message, wait: tuple | None) -> int:
        """Sets the message's Delay or NotBefore (Unix seconds or an RFC 3339 time,
        `wait[1]` seconds from now); returns when the model expects it due (0: now)."""
        if wait is None:
            return 0
        form, seconds = wait
        if form == "Delay":
            message.delay = seconds
            return self.now + int(seconds * NS) if seconds else 0
        if form == "Unix":
            message.not_before = self.now // NS + seconds
            due_ns = message.not_before * NS
        else:
            message.not_before = dt.datetime.fromtimestamp(self.now / NS + seconds, dt.UTC)
            due_ns = self.now + int(seconds * NS)
        return due_ns if due_ns > self.now else 0

    def give_back(self, tm: TopicModel, s: str, ident: object, due_ns: int = 0) -> None:
        """The model of Settlement.give_back: back to its place, or given up on after MaxAttempts."""
        self.dead_letter(tm, s, tm.give_back(s, ident, due_ns), "attempts")

    def dead_letter(self, tm: TopicModel, s: str, given_up: Given | None, reason: str) -> None:
        """PROTOCOL §8: a copy of what s gave up on goes to DeadLetter with its
        Origin, if the topic keeps dead letters for `reason` and DeadLetter has room."""
        c = tm.config
        if given_up is None or c.dead_letter is None or reason not in c.dead_letter_reasons:
            return
        msg, attempts = given_up
        target = self.model[c.dead_letter]
        prio = min(msg.prio, target.config.priorities - 1)
        origin = p.origin(c.name, s, reason, attempts, msg.published_ns, msg.key.encode(), msg.prio)
        target.publish(("dead", next(self.serial)), Msg(msg.payload, prio, 0, published_ns=self.now, origin=origin))

    def tick(self) -> None:
        for tm in self.model.values():
            tm.expire(self.now)
        for *_, topic, s, ident in sorted(e for tm in self.model.values() for e in tm.due(self.now)):
            self.give_back(self.model[topic], s, ident)
        for tm in self.model.values():
            tm.release_due(self.now)

    @rule(subs=st.sets(st.sampled_from(sorted(SUBS)), min_size=1))
    def deliver(self, subs: set[str]) -> None:
        self.step([], subs)

    # --- pull subscribers and parallel push connections (PROTOCOL §9) ---------------------

    @rule(lanes=LANES, subs=OPEN)
    def deliver_on_lanes(self, lanes: tuple[bool, ...], subs: set[str]) -> None:
        """L's open lanes take batches, each to the least loaded, within its Window."""
        self.step([], subs, lanes=lanes)

    @rule(
        data=st.data(),
        feed=st.lists(st.tuples(st.integers(0, 2), st.sampled_from(KEYS), st.sampled_from([None, 2, 30])), max_size=CHUNK),
        takes=st.lists(st.tuples(TAKERS, st.integers(1, 4), st.sampled_from([None] * 6 + ["Count", "Subscriber"])), min_size=1, max_size=3),
        subs=OPEN,
    )
    def take(self, data, feed: list[tuple[int, str, int | None]], takes: list[tuple[int, int, str | None]], subs: set[str]) -> None:
        """TAKEs for w by one to three takers in one step (competing consumers: each
        message goes to one of them), each acking keys first, after a publish
        to the topic in the same step (`feed`, if any: messages w may take
        before they are ever queued). A TAKE with a bad Count, or for a push
        subscriber, is refused whole, its acks undone."""
        topics = [name for name, tm in self.model.items() if PULL_SUB in tm.config.subscribers]
        busy = [name for name in topics if self.model[name].ready[PULL_SUB] or self.model[name].inflight[PULL_SUB]]
        topic = data.draw(st.sampled_from(busy + topics))
        tm = self.model[topic]
        pool = sorted(tm.msgs[i].key for i in tm.inflight[PULL_SUB]) * 2 + self._strays(tm)
        ops, entries = [], []
        if feed:
            for prio, key, ttl in feed:
                payload = next(self.payloads)
                msg = Msg(payload, prio % tm.config.priorities, self.now + ttl * NS if ttl else 0, published_ns=self.now)
                entries.append((key if tm.config.dedupe else payload, msg, 0))
            messages = [
                p.Message(payload=msgspec.Raw(b"%d" % msg.payload), priority=msg.prio, key=ident if tm.config.dedupe else None, ttl_s=ttl)
                for (ident, msg, _), (*_, ttl) in zip(entries, feed)
            ]
            ops.append(p.Request(topic=topic, messages=messages, id=msgspec.Raw(b"11")))
        for taker, count, bad in takes:
            acks = data.draw(st.none() | st.lists(st.sampled_from(pool), max_size=3))
            sub = "s2" if bad == "Subscriber" else PULL_SUB  # s2 is pushed to, on each of w's topics
            req = p.Request(
                topic=topic, subscriber=sub, command="TAKE", count=0 if bad == "Count" else count, acks=acks, id=msgspec.Raw(b"10")
            )
            ops.append(Take(taker, req))

        def apply(replies: list) -> None:
            if feed:
                trial = copy.deepcopy(self.model[topic])
                full_at = trial.publish_all(entries)
                reply = replies.pop(0)
                if full_at is None:
                    assert (reply.status, reply.accepted) == (200, len(feed)), reply
                    self.model[topic] = trial
                else:
                    assert reply.status == 507 and reply.error.startswith(f"Messages[{full_at}]: "), reply
            tm = self.model[topic]
            for (taker, count, bad), op, reply in zip(takes, ops[bool(feed) :], replies):
                if bad is not None:
                    assert reply.status == 400 and reply.error.startswith(bad), reply
                    continue
                acked = self._each_in_flight(tm, PULL_SUB, op.request.acks, lambda i: tm.finish(PULL_SUB, i))
                taken = tm.take(PULL_SUB, taker, count, self.now)
                got = [msgspec.json.decode(bytes(m)) for m in reply.body["Messages"]]
                assert (reply.status, reply.accepted) == (200, acked), reply
                assert [dict(m, Key=None) for m in got] == [self._as_delivered(msg) for _, msg in taken]
                for (ident, msg), m in zip(taken, got):
                    assert m["Key"] == msg.key == self.keys.setdefault((topic, ident), msg.key)

        self.step(ops, subs, apply)

    @precondition(lambda self: any(tm.inflight.get(PULL_SUB) for tm in self.model.values()))
    @rule(data=st.data(), subs=OPEN)
    def a_taker_goes_away(self, data, subs: set[str]) -> None:
        """What the taker holds goes back to its place at once, a delivery counted
        (MaxAttempts may give it up); what other takers hold stays theirs. (None
        of w's topics keeps dead letters for `attempts`: in which order one
        taker's messages are given up on is not the contract's.)"""
        holding = {tm.taker[PULL_SUB, i] for tm in self.model.values() if PULL_SUB in tm.config.subscribers for i in tm.inflight[PULL_SUB]}
        taker = data.draw(st.sampled_from(sorted(holding) * 3 + [1, 2, 3]))

        def apply(replies: list) -> None:
            assert replies == [None]
            for tm in self.model.values():
                if PULL_SUB in tm.config.subscribers:
                    for ident in tm.held_by_taker(PULL_SUB, taker):
                        self.give_back(tm, PULL_SUB, ident)

        self.step([Abandoned(taker)], subs, apply)

    @precondition(lambda self: self.written)
    @rule(data=st.data())
    def a_write_fails(self, data) -> None:
        d, order = data.draw(st.sampled_from(self.written))
        self.unconfirmed = [u for u in self.unconfirmed if u[0] is not d]
        self.step([Unwritten(d.subscriber, d.topic, d.msgs)])
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
        """Acks of what was written; one purged meanwhile counts as an ignored ack."""
        ops = [Written(d.subscriber, d.topic, d.msgs) for d, _ in self.unconfirmed]
        self.step(ops)
        for d, order in self.unconfirmed:
            tm = self.model[d.topic]
            for ident in order:
                if ident in tm.inflight[d.subscriber]:
                    tm.finish(d.subscriber, ident)
                else:
                    tm.counters[d.subscriber].ignored += 1
        self.unconfirmed = []

    @rule(data=st.data(), topic=st.sampled_from(["plain", "dd", "dm", "dead"]), sub=st.sampled_from(EVERYONE), lanes=st.none() | LANES)
    def ack(self, data, topic: str, sub: str, lanes: tuple | None) -> None:
        """Acks of in-flight keys apply; unknown, ready-only and repeated keys are
        ignored. Acks of taken messages need no taker (PROTOCOL §9: any connection);
        acks of L's free room on the lanes that carried them, for a batch in the
        same step."""
        tm = self.model[topic]
        if sub not in tm.config.subscribers:
            return
        inflight_keys = {self.keys[(topic, i)]: i for i in tm.inflight[sub]}
        chosen = data.draw(st.lists(st.sampled_from(sorted(inflight_keys)), unique=True)) if inflight_keys else []
        ready_keys = [self.keys[(topic, i)] for i in tm.ready[sub] if (topic, i) in self.keys]
        strays = [k for k in ["999999", "zzz", *ready_keys, *chosen[:1]] if k not in inflight_keys or k in chosen]
        stray = data.draw(st.sampled_from(strays))
        (reply,) = self.step([p.Request(topic=topic, subscriber=sub, acks=[*chosen, stray], id=msgspec.Raw(b"2"))], lanes=lanes)
        assert (reply.status, reply.accepted) == (200, len(chosen))
        for key in chosen:
            tm.finish(sub, inflight_keys[key])
        tm.counters[sub].ignored += 1

    @rule(sub=st.sampled_from(EVERYONE), topic=st.none() | st.sampled_from(["plain", "dd"]))
    def reconnect(self, sub: str, topic: str | None) -> None:
        if topic is not None and sub not in self.model[topic].config.subscribers:
            return
        (reply,) = self.step([p.Request(subscriber=sub, topic=topic, command="RECONNECT", id=msgspec.Raw(b"3"))])
        assert reply.status == 200
        for tm in self.model.values():
            if sub in tm.config.subscribers and topic in (None, tm.config.name):
                for ident in sorted(tm.inflight[sub], key=lambda i: tm.msgs[i].m):
                    self.give_back(tm, sub, ident)
        self.unconfirmed = [u for u in self.unconfirmed if u[0].subscriber != sub]

    @rule(seconds=st.sampled_from([0.5, 1, 3, 5, 7]))
    def time_passes(self, seconds: float) -> None:
        self.now += int(seconds * NS)
        self.step([])

    # --- delivery control and operator commands (PROTOCOL §8) ----------------------------

    @precondition(lambda self: any(any(tm.inflight.values()) for tm in self.model.values()))
    @rule(
        data=st.data(),
        delay=st.sampled_from([None, 0, 1.5, 4]),
        bad=st.sampled_from([None, None, None, "Command", "Delay"]),
        subs=OPEN,
    )
    def settle(self, data, delay: float | None, bad: str | None, subs: set[str]) -> None:
        """Acks, Nacks (with or without a Delay), Rejects and Touch of one subscriber
        in one request, applied in that order: a key not in flight (any more) is an
        ignored ack. A bad Delay or Command undoes the whole request."""
        topic, sub = self._busy(data, ["plain", "dd", "dm", "dead", "bulk"])
        tm = self.model[topic]
        in_flight = sorted(tm.msgs[i].key for i in tm.inflight[sub])
        pool = in_flight * 3 + sorted(msg.key for msg in tm.msgs.values())[:3] + self._strays(tm)
        acks, nacks, rejects, touch = [data.draw(st.none() | st.lists(st.sampled_from(pool), max_size=4)) for _ in range(4)]
        delay = delay if nacks is not None else None
        if bad == "Delay":  # Delay without Nacks, or a negative one
            delay = 1 if nacks is None else -1
        command = "BOGUS" if bad == "Command" else None
        req = p.Request(
            topic=topic,
            subscriber=sub,
            acks=acks,
            nacks=nacks,
            rejects=rejects,
            touch=touch,
            delay=delay,
            command=command,
            id=msgspec.Raw(b"4"),
        )

        def apply(replies: list) -> None:
            (reply,) = replies
            if bad is not None:
                assert reply.status == 400, reply
                return
            due_ns = self.now + int(delay * NS) if delay else 0
            applied = sum(
                self._each_in_flight(tm, sub, keys, action)
                for keys, action in (
                    (acks, lambda i: tm.finish(sub, i)),
                    (nacks, lambda i: self.give_back(tm, sub, i, due_ns)),
                    (rejects, lambda i: self.dead_letter(tm, sub, tm.give_up(sub, i), "rejected")),
                    (touch, lambda i: tm.touch(sub, i, self.now)),
                )
            )
            assert (reply.status, reply.accepted) == (200, applied), reply

        self.step([req], subs, apply)

    def _busy(self, data, topics: list[str]) -> tuple[str, str]:
        """A subscription of one of topics with something in flight, if there is
        one (one of another topic may be), where settling keys does something."""
        pairs = [(t, s) for t in topics for s in self.model[t].config.subscribers]
        busy = [(t, s) for t, s in pairs if self.model[t].inflight[s]]
        return data.draw(st.sampled_from(busy or pairs))

    def _each_in_flight(self, tm: TopicModel, sub: str, keys: list[str] | None, action) -> int:
        """action() on the message each key names in flight to sub, in order; a key
        naming nothing in flight, or named before in the list (a second Touch too),
        is counted as an ignored ack."""
        applied = 0
        for i, key in enumerate(keys or ()):
            ident = tm.in_flight_as(sub, key) if key not in keys[:i] else None
            if ident is None:
                tm.counters[sub].ignored += 1
            else:
                action(ident)
                applied += 1
        return applied

    def _strays(self, tm: TopicModel) -> list[str]:
        """Keys that name no message, or none that may be seen yet (on `bulk`)."""
        return STRAYS + (self._hidden() if tm.config.name == "bulk" else [])

    def _hidden(self) -> list[str]:
        """The keys of the first and the last message stored so far by the publish
        being staged, if any: they name no message anyone may see."""
        job = self.jobs[0] if self.jobs else None
        return [str(job.first), str(job.first + job.done - 1)] if job is not None and job.reserved else []

    @precondition(lambda self: any(tm.msgs for tm in self.model.values()))
    @rule(data=st.data(), sub=st.none() | st.sampled_from(EVERYONE), subs=OPEN)
    def purge(self, data, sub: str | None, subs: set[str]) -> None:
        """PURGE of a topic that holds messages, or of one subscriber's copies there,
        of all or of some keys."""
        topic = data.draw(st.sampled_from([name for name, tm in self.model.items() if tm.msgs]))
        tm = self.model[topic]
        pool = sorted(msg.key for msg in tm.msgs.values()) + self._strays(tm)
        keys = data.draw(st.none() | st.lists(st.sampled_from(pool), max_size=3))
        req = p.Request(topic=topic, subscriber=sub, command="PURGE", keys=keys, id=msgspec.Raw(b"5"))

        def apply(replies: list) -> None:
            (reply,) = replies
            if sub is not None and sub not in tm.config.subscribers:
                assert reply.status == 404, reply
                return
            only = tm.config.subscribers if sub is None else [sub]
            by_key = {msg.key: ident for ident, msg in tm.msgs.items()}
            idents = tm.held_by(only) if keys is None else list(dict.fromkeys(by_key[k] for k in keys if k in by_key))
            assert (reply.status, reply.body) == (200, {"Purged": tm.purge(only, idents)}), reply

        self.step([req], subs, apply)

    @precondition(lambda self: self.jobs and self.jobs[0].reserved)
    @rule(sub=st.none() | st.sampled_from(sorted(SUBS)))
    def purge_what_is_being_staged(self, sub: str | None) -> None:
        """A publish still being staged is not there yet (PROTOCOL §3: a publish is
        seen whole or not at all): a PURGE naming one of its ids finds nothing."""
        req = p.Request(topic="bulk", subscriber=sub, command="PURGE", keys=self._hidden(), id=msgspec.Raw(b"8"))
        (reply,) = self.step([req])
        assert (reply.status, reply.body) == (200, {"Purged": 0}), reply

    @precondition(lambda self: self.model["dead"].msgs)
    @rule(data=st.data(), topic=st.sampled_from(["dead"] * 3 + ["plain"]), subs=OPEN)
    def redrive(self, data, topic: str, subs: set[str]) -> None:
        """REDRIVE of the dead letters, all or some, back to where they came from;
        a topic that is nobody's DeadLetter is a bad request."""
        pool = sorted(msg.key for msg in self.model["dead"].msgs.values()) + STRAYS
        keys = data.draw(st.none() | st.lists(st.sampled_from(pool), max_size=3))
        req = p.Request(topic=topic, command="REDRIVE", keys=keys, id=msgspec.Raw(b"6"))

        def apply(replies: list) -> None:
            (reply,) = replies
            if topic != "dead":
                assert reply.status == 400 and "DeadLetter" in reply.error, reply
                return
            trial = copy.deepcopy(self.model)
            counts = self._redrive(trial, keys)
            if counts is None:  # an origin topic is full: nothing happened
                assert reply.status == 507, reply
                return
            assert (reply.status, reply.body) == (200, {"Redriven": counts[0], "Skipped": counts[1]}), reply
            self.model = trial

        self.step([req], subs, apply)

    def _redrive(self, model: dict[str, TopicModel], keys: list[str] | None) -> tuple[int, int] | None:
        """The model of REDRIVE on `dead`: (redriven, skipped), or None if an origin
        topic refused one. Keys the broker could have written are looked up (and
        skipped when they name nothing), others are not."""
        dead = model["dead"]
        by_key = {msg.key: ident for ident, msg in dead.msgs.items()}
        if keys is None:
            named = sorted(dead.msgs, key=lambda i: dead.msgs[i].m)
        else:
            named = [by_key.get(k) for k in dict.fromkeys(keys) if k.isdigit() and k[0] != "0"]
        redriven = skipped = 0
        for ident in named:
            msg = dead.msgs.get(ident)
            origin = msgspec.json.decode(msg.origin) if msg is not None and msg.origin is not None else None
            target = model[origin["Topic"]] if origin is not None else None
            key = origin["Key"] if target is not None and target.config.dedupe else None
            if target is None or key in target.msgs:  # gone, not a dead letter, or a newer version waits there
                skipped += 1
                continue
            prio = min(origin["Priority"], target.config.priorities - 1)  # its own, which `dead` may hold lower
            new = Msg(msg.payload, prio, 0, published_ns=self.now)
            if not target.publish(("redriven", next(self.serial)) if key is None else key, new, subs=[origin["Subscriber"]]):
                return None
            dead.purge(dead.config.subscribers, [ident])
            redriven += 1
        return redriven, skipped

    @rule(
        sub=st.sampled_from(EVERYONE),
        topic=st.none() | st.sampled_from([t.name for t in TOPICS]),
        pause=st.booleans(),
        subs=OPEN,
    )
    def pause(self, sub: str, topic: str | None, pause: bool, subs: set[str]) -> None:
        """PAUSE or RESUME of a subscriber, on one topic or on all of its topics."""
        req = p.Request(subscriber=sub, topic=topic, command="PAUSE" if pause else "RESUME", id=msgspec.Raw(b"7"))

        def apply(replies: list) -> None:
            (reply,) = replies
            if topic is not None and sub not in self.model[topic].config.subscribers:
                assert reply.status == 404, reply
                return
            assert reply.status == 200, reply
            for tm in self.model.values():
                if sub in tm.config.subscribers and topic in (None, tm.config.name):
                    (tm.paused.add if pause else tm.paused.discard)(sub)

        self.step([req], subs, apply)

    @rule()
    def restart(self) -> None:
        """What was pushed on an AckRequired: false topic, unconfirmed, comes back;
        so does everything taken and not acked (PROTOCOL §9: no taker outlives
        the run), a delivery counted."""
        self.store.close()
        self._open()
        if self.jobs and self.jobs[0].reserved:  # the staged rows of a publish never answered
            self.orphan = self.jobs[0].done
        self.jobs = []
        self.written = []
        for tm in self.model.values():
            tm.restarted()
            for s in tm.config.subscribers:
                if not tm.config.ack_required or s in PULL:
                    for ident in sorted(tm.inflight[s], key=lambda i: tm.msgs[i].m):
                        self.give_back(tm, s, ident)
        self.unconfirmed = []

    # --- invariants ---------------------------------------------------------------------

    @invariant()
    def each_lane_carries_what_the_model_says(self) -> None:
        """Booked from the batches and from what each step reported gone from flight
        (the ack of any connection, a nack, AckRetry, RECONNECT...), each of L's
        lanes carries, per topic, the messages in flight to L that the model says
        its last batch carried."""
        for name, tm in self.model.items():
            if LANED_SUB in tm.config.subscribers:
                carried = [self.ledger.carried[lane][name] for lane in range(CONNECTIONS)]
                assert carried == [tm.carried(LANED_SUB, lane) for lane in range(CONNECTIONS)], name

    @invariant()
    def status_counters_agree_with_the_model(self) -> None:
        """STATUS in a step of its own, which also stages a chunk (after STATUS has
        read the counters); the batches it would push wait for the next step.
        STATUS also has the broker forget taken messages that left flight
        without an ack: the takers it then knows hold w's messages are the
        model's, as of before the step's timers ran."""
        written, holders = self.written, {}

        def apply(replies: list) -> None:
            self.compare(replies[0])
            for name, tm in self.model.items():
                if PULL_SUB in tm.config.subscribers:
                    holders[name] = {tm.taker[PULL_SUB, i] for i in tm.inflight[PULL_SUB]}

        self.step([p.Request(command="STATUS", id=msgspec.Raw(b"9"))], set(), apply)
        self.written = written
        assert {name: self.broker.holders(name, PULL_SUB) for name in holders} == holders

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
                assert (sub["InFlight"], sub["Delayed"], sub["Paused"]) == (len(tm.inflight[s]), len(tm.delayed[s]), s in tm.paused), (
                    name,
                    s,
                )
                counts = (sub["Delivered"], sub["Acked"], sub["Redelivered"], sub["Expired"], sub["IgnoredAcks"], sub["DeadLettered"])
                assert counts == (c.delivered, c.acked, c.redelivered, c.expired, c.ignored, c.dead_lettered), (name, s)


BrokerMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("PPMQ_MODEL_EXAMPLES", "200")), stateful_step_count=60, deadline=None
)
test_broker_agrees_with_the_reference_model = BrokerMachine.TestCase


def test_a_publish_over_max_bytes_after_restarts_keeps_what_the_model_keeps() -> None:
    # Given a refused publish (more than MaxMessages), time passing, and ten restarts
    machine = BrokerMachine()
    machine.start(journaled=False)
    try:
        machine.publish(lanes=None, bad_at=None, spec=[(0, "a", None)] * 10, subs=set(), topic="plain", waits=None)
        for _ in range(3):
            machine.time_passes(seconds=0.5)
        for _ in range(10):
            machine.restart()
        # When three messages come that pass MaxBytes together, two of them with a TTL
        machine.publish(lanes=None, bad_at=None, spec=[(0, "a", None), (1, "a", 2), (0, "a", 30)], subs=set(), topic="plain", waits=None)
        # Then STATUS counts what the model keeps
        machine.status_counters_agree_with_the_model()
    finally:
        machine.teardown()
