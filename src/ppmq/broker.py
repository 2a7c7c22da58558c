"""The broker's state machine (PROTOCOL §3), sans-IO.

`Broker.step` takes every request that arrived since the last commit, the
subscribers that can take a batch now, and the time; it applies them all in one
LMDB write transaction (group commit) and returns the replies, the batches to
push and when it next needs to run. It never touches a socket or reads a clock,
and it runs on one thread: the writer thread of the server, or a test.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from . import events as ev
from . import protocol as p
from .access import Policy, Rules
from .config import Config, ConfigError, SubscriberConfig, TopicConfig
from .events import StepEvents
from .ops import Delivery, Guarded, Invalid, Op, Reconfigure, Returned, Step, Written, request_id
from .staging import Answer, Staging, is_large
from .state import NS, State, SubStats, refused_changes, restore, snapshot, status_body
from .queues import Fresh, Queue, space
from .store import Body, Store, StoreError, StoreFullError, Txn
from .validate import MAX_KEY_BYTES, Prepared, prepare

log = logging.getLogger(__name__)
T = TypeVar("T")

TICK_NS = NS  # expiry and redelivery run at least this often
PER_TICK = 10_000  # expiries or redeliveries in one transaction; the rest go in the next tick
FIRST_RETRY_NS = NS // 10  # after a failed commit, steps without requests wait this long, doubling
MAX_RETRY_NS = 5 * NS


class Wiring(NamedTuple):
    """What the broker derives from its config: switched as one value by a reload,
    and switched back whole if that reload's commit fails."""

    config: Config
    topics: dict[str, TopicConfig]
    sub_configs: dict[str, SubscriberConfig]
    sub_topics: dict[str, list[TopicConfig]]  # subscriber -> the topics it takes
    topic_by_id: dict[int, str]
    sub_by_id: dict[int, str]
    rules: Rules | None  # the access rules of config

    @classmethod
    def of(cls, config: Config, state: State) -> Wiring:
        return cls(
            config,
            {t.name: t for t in config.topics},
            {s.name: s for s in config.subscribers},
            {s.name: [t for t in config.topics if s.name in t.subscribers] for s in config.subscribers},
            {i: n for n, i in state.topic_ids.items()},
            {i: n for n, i in state.sub_ids.items()},
            Rules(config),
        )


class Broker:
    def __init__(self, config: Config, store: Store, now_ns: int) -> None:
        """Open the broker on a store; ConfigError if the config would drop messages."""
        self.store = store
        self.policy = Policy()  # connections check their requests against it, in the step
        self._wiring: Wiring | None = None
        # Messages published in the current step for open subscribers with nothing
        # older queued: if a batch takes them in the same step they skip the ready
        # queue (no put, no walk, no re-read); what is left goes there at the end.
        self._fresh: dict[tuple[str, str], list[Fresh]] = {}
        self._open: set[str] = set()
        self._events = StepEvents(config.journaled, now_ns)
        self._carried: list[Op] = []  # internal ops of a step whose commit failed, tried again
        self._failures = 0  # commits failed in a row
        self._retry_at_ns = 0  # after a failed commit, no step without requests before this
        with store.write() as txn:
            raw = txn.get_meta(b"state")
            self.state = restore(raw) if raw else State()
            self._staging = Staging(txn.staged())  # a record left by a crash: its rows go
            self._switch(txn, config)
            self._requeue_unconfirmed(txn, now_ns)
            self._save(txn)
        self._next_tick_ns = now_ns

    # --- the config in force: one value, switched whole ---------------------------------

    @property
    def config(self) -> Config:
        return self._wiring.config

    @property
    def topics(self) -> dict[str, TopicConfig]:
        return self._wiring.topics if self._wiring is not None else {}

    @property
    def sub_configs(self) -> dict[str, SubscriberConfig]:
        return self._wiring.sub_configs

    @property
    def sub_topics(self) -> dict[str, list[TopicConfig]]:
        return self._wiring.sub_topics

    @property
    def _topic_by_id(self) -> dict[int, str]:
        return self._wiring.topic_by_id

    @property
    def _sub_by_id(self) -> dict[int, str]:
        return self._wiring.sub_by_id

    def _rewire(self, wiring: Wiring | None) -> None:
        self._wiring = wiring
        self.policy.rules = wiring.rules if wiring is not None else None

    def _switch(self, txn: Txn, config: Config) -> None:
        """Make `config` the broker's, dropping what it says goes (PROTOCOL §6 DropTopics)."""
        errors = refused_changes(self.state, self.topics, config)
        if errors:
            raise ConfigError(errors)
        self._queue_fresh(txn)  # a subscription dropped below must find its messages in the store
        for topic, subs in list(self.state.subs.items()):
            tc = next((t for t in config.topics if t.name == topic), None)
            for sub in [s for s in subs if tc is None or s not in tc.subscribers]:
                self._drop_subscription(txn, topic, sub)
            if tc is None:
                log.warning("topic %s removed from the config: forgotten", topic)
                self.state.forget(topic)
        self.state.register(config)
        self._rewire(Wiring.of(config, self.state))
        self._wiring.rules.warn_unknown()

    def _drop_subscription(self, txn: Txn, topic: str, sub: str) -> None:
        """sub no longer takes topic: what it still had there is released, and
        messages nobody else holds are deleted (like deleting a bound queue)."""
        msgs = self._queue_of(txn, topic, sub).drop_all()
        t, s = self.state.topic_ids[topic], self.state.sub_ids[sub]
        self._release(txn, topic, t, s, msgs)
        del self.state.subs[topic][sub]
        log.warning("subscriber %s removed from topic %s: %d pending messages dropped for it", sub, topic, len(msgs))

    def _queue_of(self, txn: Txn, topic: str, sub: str, *, fresh: bool = False) -> Queue:
        """sub's queue on topic; with `fresh`, one that new messages may stay fresh in."""
        fresh_list = self._fresh.setdefault((topic, sub), []) if fresh else None
        return Queue(txn, self.state.topic_ids[topic], self.state.sub_ids[sub], self.state.subs[topic][sub], fresh_list)

    def _requeue_unconfirmed(self, txn: Txn, now_ns: int) -> None:
        """On an `AckRequired: false` topic nothing will ever ack what a previous run
        pushed without seeing the write finish: deliver it again (at least once)."""
        for tc in self.config.topics:
            if not tc.ack_required:
                t = self.state.topic_ids[tc.name]
                for name in tc.subscribers:
                    s = self.state.sub_ids[name]
                    for m, _ in txn.inflight_of(t, s):
                        self._requeue(txn, t, s, m, now_ns, "Unconfirmed")

    def _save(self, txn: Txn) -> None:
        txn.put_meta(b"state", snapshot(self.state))

    @property
    def next_tick_ns(self) -> int:
        return self._next_tick_ns

    @property
    def staging(self) -> bool:
        """A large publish is in progress (or its rows are being deleted): step
        again even without requests."""
        return self._staging.busy

    # --- the step ---------------------------------------------------------------------

    def has_pending(self, sub: str) -> bool:
        """sub has messages ready or unacknowledged: worth connecting to (and
        starting) it; it will RECONNECT to get what it left unacknowledged.

        Read from the event loop while a step may run: it only looks values up,
        and a stale answer costs one step's delay.
        """
        subs = self.state.subs
        for t in self.sub_topics.get(sub, ()):
            stats = subs.get(t.name, {}).get(sub)
            if stats is not None and (stats.inflight or any(stats.ready)):
                return True
        return False

    def wants_step(self, open_subs: set[str], now_ns: int) -> bool:
        """Whether a step with no requests would do anything now."""
        if now_ns < self._retry_at_ns:
            return False
        if self._staging.busy:  # a large publish goes on (or its rows go), one chunk a step
            return True
        return now_ns >= self._next_tick_ns or any(self._space(s, t) > 0 for s in open_subs for t in self.sub_topics.get(s, ()))

    def step(self, ops: list[Op], open_subs: set[str], now_ns: int) -> Step:
        """Apply ops, run due timers, fill open subscribers: one transaction, one commit.

        A step that runs out of room looks again for reader slots of dead
        processes (which pin pages) and, if that freed any, tries once more
        before answering 507."""
        carried, self._carried = self._carried, []
        ops = carried + ops
        self._clear_stale_readers()
        ended: list[Answer] = []  # a staged publish the failed first try ended
        try:
            try:
                replies, deliveries, next_tick, finished = self._commit(ops, open_subs, now_ns)
            except StoreFullError as exc:
                ended = self._staging.rolled_back(_reply_error(exc))
                if not self._clear_stale_readers():
                    raise
                replies, deliveries, next_tick, finished = self._commit(ops, open_subs, now_ns)
        except StoreError as exc:
            return self._failed(ops, len(carried), exc, now_ns, ended)
        self._staging.committed()
        if self._failures:
            log.warning("commits succeed again after %d failed", self._failures)
            self._failures = 0
        self._next_tick_ns = next_tick
        return Step(replies[len(carried) :], deliveries, next_tick, self._events.take(), ended + finished)

    def _clear_stale_readers(self) -> int:
        """A reader killed inside a snapshot (a report, fsck) pins the pages it
        could see until its slot is freed, so every commit would grow the file:
        look for such slots at every step (a look at LMDB's reader table, well
        under a microsecond)."""
        cleared = self.store.clear_stale_readers()
        if cleared:
            log.warning("freed %d reader slots of processes that died inside a read", cleared)
        return cleared

    def _commit(self, ops: list[Op], open_subs: set[str], now_ns: int) -> tuple[list, list[Delivery], int, list[Answer]]:
        """The step's one transaction; if it fails, the broker is left exactly as
        it was before (counters, config, access rules), and the error raised."""
        before, wiring = snapshot(self.state), self._wiring
        self._open, self._fresh, self._events.now_ns = open_subs, {}, now_ns
        try:
            with self.store.write() as txn:
                replies = [self._apply(txn, op, now_ns) for op in ops]
                finished = self._staging.step(txn, lambda req: self._apply(txn, req, now_ns))
                if now_ns >= self._next_tick_ns:
                    self._tick(txn, now_ns)
                deliveries = self._fill(txn, open_subs, now_ns)
                self._queue_fresh(txn)
                self.state.commits += 1
                self._save(txn)
                next_tick = self._next_tick(txn, now_ns)
        except BaseException:
            self.state = restore(before)
            self._rewire(wiring)
            self._events.clear()
            self._fresh = {}
            raise
        return replies, deliveries, next_tick, finished

    def _failed(self, ops: list[Op], carried: int, exc: StoreError, now_ns: int, ended: list[Answer]) -> Step:
        """Nothing of the step happened: every request is answered with the error
        (507 when out of room), and steps that no request asks for back off, so
        that a full store is not retried thousands of times a second."""
        self._failures += 1
        if self._failures == 1:
            log.error("commit failed: %s; retrying with backoff, and logging again once commits succeed", exc)
        delay_ns = min(MAX_RETRY_NS, FIRST_RETRY_NS << min(self._failures - 1, 16))
        self._retry_at_ns = self._next_tick_ns = now_ns + delay_ns
        # Nobody resends a returned or written batch: keep it for the next step.
        self._carried = [op for op in ops if isinstance(op, (Returned, Written))]
        err = _reply_error(exc)
        replies = [None if isinstance(op, (Returned, Written)) else p.error_reply(err, request_id(op)) for op in ops]
        return Step(replies[carried:], [], self._retry_at_ns, finished=ended + self._staging.rolled_back(err))

    def _apply(self, txn: Txn, op: Op, now_ns: int) -> p.Reply | None:
        if isinstance(op, Guarded):
            try:
                op.check(op.request)
            except p.Forbidden as exc:
                return self._apply(txn, Invalid(exc, op.request.id), now_ns)
            op = op.request
        if isinstance(op, (Returned, Written)):
            if op.subscriber not in self.state.subs.get(op.topic, {}):
                return None  # the subscription was dropped by a reload meanwhile
            if isinstance(op, Returned):
                self._return(txn, op)
            else:
                self._ack_msgs(txn, op.topic, op.subscriber, op.msgs, "AutoAck")
            return None
        if isinstance(op, Invalid):
            self.state.rejected += 1
            self.state.forbidden += op.error.status == p.Forbidden.status
            return self._rejected(p.error_reply(op.error, op.id), None, 0)
        if isinstance(op, Reconfigure):
            return self._reconfigure(txn, op.config)
        try:
            return self._events.of_request(lambda: self._undoable(txn, lambda: self._request(txn, op, now_ns)))
        except p.RequestError as exc:
            error = exc
        except StoreFullError as exc:
            error = p.StoreFull(f"store full: {exc}")
        except Exception as exc:  # a bug must cost one request, not the broker
            log.exception("internal error on a request")
            error = p.RequestError(f"internal error: {type(exc).__name__}: {exc}")
        self.state.rejected += 1
        return self._rejected(p.error_reply(error, op.id), op.topic, len(op.messages or ()))

    def _undoable(self, txn: Txn, apply: Callable[[], T]) -> T:
        """apply(), whose writes, counters, config and fresh messages all vanish if
        it raises. The step's fresh lists are kept by value: a STATUS or a reload
        moves them into the queues (and empties the dict) inside it."""
        before, wiring = snapshot(self.state), self._wiring
        fresh_before = {key: (fresh, len(fresh)) for key, fresh in self._fresh.items()}
        try:
            with txn.savepoint():
                return apply()
        except BaseException:
            self.state = restore(before)
            self._rewire(wiring)
            self._fresh = {key: fresh[:n] for key, (fresh, n) in fresh_before.items() if n}
            raise

    def _rejected(self, reply: p.Reply, topic: str | None, count: int) -> p.Reply:
        self._events.reject(topic, reply.status, reply.error, count)
        return reply

    def _reconfigure(self, txn: Txn, config: Config) -> p.Reply:
        """All of the new config, or none of it (the old one keeps running); the
        reload is always answered, so whoever asked for it never waits for ever."""
        try:
            self._undoable(txn, lambda: self._switch(txn, config))
        except ConfigError as exc:
            return p.error_reply(p.BadRequest(str(exc)))
        except StoreFullError as exc:
            return p.error_reply(p.StoreFull(f"store full: {exc}"))
        except Exception as exc:
            log.exception("reload failed")
            return p.error_reply(p.RequestError(f"reload failed: {type(exc).__name__}: {exc}"))
        return p.Reply(status=200)

    def _request(self, txn: Txn, req: p.Request, now_ns: int) -> p.Reply | None:
        """PROTOCOL §2: messages, then acks, then the command; all or nothing.
        None: a large publish, answered in a later step (staging.py)."""
        accepted, body = 0, None
        if req.messages is not None:
            topic = self._topic_for(req, "Messages")
            if is_large(topic, req.messages):
                if not self._publish_staged(txn, topic, req, now_ns):
                    return None
            else:
                prepared = prepare(topic, req.messages, self.config.max_message_bytes, now_ns)
                if txn.used_bytes() >= self.store.max_bytes:
                    raise p.StoreFull(f"store full: MaxStoreBytes ({self.store.max_bytes}) reached")
                self._publish(txn, topic, prepared, now_ns)
            accepted += len(req.messages)
        if req.acks is not None:
            topic = self._topic_for(req, "Acks")
            sub = self._subscriber_of(req.subscriber, topic, "Acks")
            accepted += self._ack_keys(txn, topic, sub, req.acks)
        if req.command is not None:
            command = req.command.upper()
            if command in ("RECONNECT", "CONNECT"):
                self._reconnect(txn, req, now_ns)
            elif command == "STATUS":
                self._queue_fresh(txn)  # so that OldestReadyAge sees them
                body = status_body(self.config, self.state, txn, now_ns)
            else:
                raise p.BadRequest(f"Command: unknown command {req.command!r} (expected RECONNECT, CONNECT or STATUS)")
        return p.Reply(status=200, id=req.id, accepted=accepted, body=body)

    def _topic_for(self, req: p.Request, field: str) -> TopicConfig:
        if req.topic is None:
            raise p.BadRequest(f"Topic: required with {field}")
        topic = self.topics.get(req.topic)
        if topic is None:
            raise p.NotFound(f"Topic: unknown topic {req.topic!r}")
        return topic

    def _subscriber_of(self, name: str | None, topic: TopicConfig, field: str) -> str:
        if name is None:
            raise p.BadRequest(f"Subscriber: required with {field}")
        if name not in self.sub_topics:
            raise p.NotFound(f"Subscriber: unknown subscriber {name!r}")
        if name not in topic.subscribers:
            raise p.NotFound(f"Subscriber: {name!r} is not subscribed to topic {topic.name!r}")
        return name

    # --- publish (PROTOCOL §3 Fan-out, Dedupe, Keys, Expiry) -----------------------------

    def _publish(self, txn: Txn, topic: TopicConfig, prepared: list[Prepared], now_ns: int) -> None:
        """Counted as published once stored: a refused dead-letter copy is not."""
        t = self.state.topic_ids[topic.name]
        if not topic.subscribers:
            pass  # nobody to deliver to, like a fanout exchange without queues
        elif not topic.dedupe and not topic.limited:
            stored = self._store_new(txn, topic, t, prepared, now_ns)  # the whole batch at once
            if self._events.journaled:
                for (m, size), msg in zip(stored, prepared):
                    self._events.publish(topic.name, m, msg.prio, size, msg.expires_ns, False)
        else:
            for i, msg in enumerate(prepared):  # one by one: a key may come twice, a limit may drop
                old = txn.get_dedupe(t, msg.key) if msg.key is not None else None
                if old is not None:
                    m, size = old, self._replace(txn, topic, t, old, msg, now_ns)
                else:
                    try:
                        [(m, size)] = self._store_new(txn, topic, t, [msg], now_ns)
                    except p.StoreFull as exc:
                        raise p.StoreFull(f"Messages[{i}]: {exc}") from None
                if self._events.journaled:
                    self._events.publish(topic.name, m, msg.prio, size, msg.expires_ns, old is not None)
        self.state.topics[topic.name].published += len(prepared)

    def _publish_staged(self, txn: Txn, topic: TopicConfig, req: p.Request, now_ns: int) -> bool:
        """A publish too large for one step: queued on arrival, then one chunk per
        step stored unseen; True in the step that makes it whole, and visible:
        counted here, journaled with this request, in this transaction."""
        job = self._staging.job_of(req)
        if job is None:
            self._staging.queue(req, topic, now_ns, self._events.journaled)
            return False
        t = self.state.topic_ids[topic.name]
        stats = self.state.topics[topic.name]
        subs = [self.state.sub_ids[name] for name in topic.subscribers]
        if not self._staging.store_chunk(txn, job, topic, t, subs, stats, self.config.max_message_bytes):
            return False
        stats.stored += sum(job.ready)
        stats.stored_bytes += job.stored_bytes
        stats.published += job.done
        for name in topic.subscribers:
            self._queue_of(txn, topic.name, name).reveal(job.ready)
        if job.event is not None:
            self._events.file(job.event)
        return True

    def _store_new(self, txn: Txn, topic: TopicConfig, t: int, batch: list[Prepared], now_ns: int) -> list[tuple[int, int]]:
        """Store messages with new ids, each store write once for the whole batch;
        return each one's id and the size of its JSON."""
        stats = self.state.topics[topic.name]
        bodies = []
        for msg in batch:
            m = stats.seq + 1
            if msg.key is None:
                msg = msg._replace(key=b"%d" % m)  # generated keys: the message id, unique per topic, never reused
            fragment = _fragment(msg)
            self._make_room(txn, topic, t, len(fragment))  # may refuse: nothing is changed before it
            stats.seq = m
            stats.stored += 1
            stats.stored_bytes += len(fragment)
            bodies.append((m, Body(msg.prio, now_ns, msg.expires_ns, msg.key, fragment)))
        txn.put_messages(t, bodies, dedupe=topic.dedupe, expire=topic.expire)
        # A dedupe replacement, an expiry or a drop in this step would look for it in the queue.
        may_stay_fresh = [not topic.dedupe and not topic.limited and not (topic.expire and 0 < msg.expires_ns <= now_ns) for msg in batch]
        new = [(m, body.priority, body.fragment) for m, body in bodies]
        for name in topic.subscribers:
            is_open = name in self._open
            self._queue_of(txn, topic.name, name, fresh=is_open).add_new(new, may_stay_fresh, is_open)
        txn.put_new_holders(t, [self.state.sub_ids[name] for name in topic.subscribers], [(m, body.priority) for m, body in bodies])
        return [(m, len(body.fragment)) for m, body in bodies]

    # --- per-topic limits: MaxMessages, MaxBytes, OverflowPolicy ---------------------------

    def _make_room(self, txn: Txn, topic: TopicConfig, t: int, size: int) -> None:
        """Room for one more message of `size` bytes, or StoreFull; under
        `drop-oldest` the oldest message of the lowest priority waiting in a
        queue goes first. Raises before any change if nothing can be dropped."""
        if not topic.limited:
            return
        stats = self.state.topics[topic.name]
        if topic.max_bytes and size > topic.max_bytes:
            raise p.StoreFull(f"{size} bytes exceeds MaxBytes ({topic.max_bytes}) of topic {topic.name!r}")
        while True:
            if topic.max_messages and stats.stored >= topic.max_messages:
                limit = f"MaxMessages ({topic.max_messages})"
            elif topic.max_bytes and stats.stored_bytes + size > topic.max_bytes:
                limit = f"MaxBytes ({topic.max_bytes})"
            else:
                return
            victim = self._oldest_lowest(txn, topic, t) if topic.overflow_policy == "drop-oldest" else None
            if victim is None:
                raise p.StoreFull(f"topic {topic.name!r} is full: {limit} reached")
            self._discard(txn, topic.name, t, victim, ev.OVERFLOW)
            stats.dropped += 1

    def _oldest_lowest(self, txn: Txn, topic: TopicConfig, t: int) -> int | None:
        """The message at the head of the lowest non-empty priority of any of the
        topic's queues (the smallest position among them); None if all are empty."""
        for prio in reversed(range(topic.priorities)):
            heads = [txn.first_ready(t, self.state.sub_ids[name], prio) for name in topic.subscribers]
            heads = [h for h in heads if h is not None]
            if heads:
                return min(heads, key=lambda h: h.pos).msg
        return None

    def _replace(self, txn: Txn, topic: TopicConfig, t: int, m: int, msg: Prepared, now_ns: int) -> int:
        """PROTOCOL §3 Dedupe: the newest version wins, and each subscriber's queue
        decides where it goes (Queue.requeue_version). Returns the size of the new
        version's JSON."""
        stats = self.state.topics[topic.name]
        stats.replaced += 1
        new_pos: list[int] = []

        def next_pos() -> int:  # one new place for every subscriber that moves it
            if not new_pos:
                stats.seq += 1
                new_pos.append(stats.seq)
            return new_pos[0]

        holders = txn.get_holders(t, m)
        for name in topic.subscribers:
            queue = self._queue_of(txn, topic.name, name)
            holders[queue.s] = queue.requeue_version(m, holders.get(queue.s), msg.prio, next_pos)
        txn.put_holders(t, m, holders)
        fragment = _fragment(msg)
        old = txn.replace_message(t, m, Body(msg.prio, now_ns, msg.expires_ns, msg.key, fragment), expire=topic.expire)
        if old is not None:
            stats.stored_bytes += len(fragment) - len(old.fragment)
        return len(fragment)

    # --- acks, completion -----------------------------------------------------------------

    def _ack_keys(self, txn: Txn, topic: TopicConfig, sub: str, keys: list[str]) -> int:
        t = self.state.topic_ids[topic.name]
        msgs = []
        for key in keys:
            if topic.dedupe:
                encoded = key.encode()
                m = txn.get_dedupe(t, encoded) if len(encoded) <= MAX_KEY_BYTES else None
            else:
                m = generated_id(key)
            msgs.append(m)
        return self._ack_msgs(txn, topic.name, sub, msgs)

    def _ack_msgs(self, txn: Txn, topic: str, sub: str, msgs: list[int | None], reason: str | None = None) -> int:
        queue = self._queue_of(txn, topic, sub)
        acked = queue.ack(msgs)
        ids = [m for m, _ in acked]
        if self._events.journaled and ids:
            event = self._events.batch(ev.ACK, topic, sub, reason)
            event.ids += ids
            event.pub_ns += txn.publish_ns_of(queue.t, ids)
            event.attempts += [n for _, n in acked]
        self._release(txn, topic, queue.t, queue.s, ids)
        return len(ids)

    def _release(self, txn: Txn, topic: str, t: int, s: int, ms: list[int]) -> None:
        """Subscriber s is done with ms; the last one out deletes a message."""
        done = txn.release_holders(t, s, ms)
        if done:
            self._delete_messages(txn, topic, t, done)

    def _delete_messages(self, txn: Txn, topic: str, t: int, ms: list[int]) -> None:
        tc = self.topics.get(topic)  # None: the topic is being dropped; remove any index entry
        gone = txn.delete_messages(t, ms, dedupe=tc is None or tc.dedupe)
        stats = self.state.topics[topic]
        stats.stored -= len(gone)
        # max(): a store written before this counter existed holds uncounted bytes
        stats.stored_bytes = max(0, stats.stored_bytes - sum(g.size for g in gone))

    # --- RECONNECT, redelivery, returned batches ----------------------------------------

    def _reconnect(self, txn: Txn, req: p.Request, now_ns: int) -> None:
        """PROTOCOL §3 RECONNECT: everything in flight to the subscriber goes back to its place."""
        if req.subscriber is None:
            raise p.BadRequest("Subscriber: required with RECONNECT")
        if req.subscriber not in self.sub_topics:
            raise p.NotFound(f"Subscriber: unknown subscriber {req.subscriber!r}")
        if req.topic is None:
            topics = self.sub_topics[req.subscriber]
        else:
            topics = [self._topic_for(req, "RECONNECT")]
            self._subscriber_of(req.subscriber, topics[0], "RECONNECT")
        for tc in topics:
            t, s = self.state.topic_ids[tc.name], self.state.sub_ids[req.subscriber]
            for m, _ in txn.inflight_of(t, s):
                self._requeue(txn, t, s, m, now_ns, "Reconnect")

    def _requeue(self, txn: Txn, t: int, s: int, m: int, now_ns: int, reason: str) -> None:
        """Back to its place in the queue, as if it had not been delivered yet;
        after MaxAttempts deliveries, to the dead-letter topic instead."""
        stats = self._stats(t, s)
        if stats is None:  # a subscription no config names: nothing counts it
            flight = txn.pop_inflight(t, s, m)
            if flight is not None:
                txn.push_ready(t, s, flight.prio, flight.pos, m, flight.attempts)
            return
        queue = Queue(txn, t, s, stats)
        flight = queue.unflight(m)
        if flight is None:
            return
        topic = self.topics[self._topic_by_id[t]]
        if topic.max_attempts and flight.attempts >= topic.max_attempts:
            stats.dead_lettered += 1
            reason = "MaxAttempts"  # given up on; a copy may go to the DeadLetter topic
            self._dead_letter(txn, topic, t, s, m, now_ns)
        else:
            queue.put_back(m, flight)
        if self._events.journaled:
            self._events.batch(ev.REQUEUE, topic.name, self._sub_by_id[s], reason).ids.append(m)

    def _dead_letter(self, txn: Txn, topic: TopicConfig, t: int, s: int, m: int, now_ns: int) -> None:
        """PROTOCOL §3 extension: subscriber s gives up on m; a copy goes to the
        topic's DeadLetter topic (with no expiry), or is dropped with a log record."""
        body = txn.get_body(t, m)
        sub = self._sub_by_id[s]
        self._release(txn, topic.name, t, s, [m])
        if body is None:
            return
        target = self.topics.get(topic.dead_letter) if topic.dead_letter else None
        if target is None:
            log.warning("topic %s: message %s dropped for subscriber %s after %d deliveries without an ack (no DeadLetter)",
                        topic.name, body.key.decode(errors="replace"), sub, topic.max_attempts)
            return
        copy = Prepared(body.key if target.dedupe else None, min(body.priority, target.priorities - 1), 0, p.fragment_payload(body.fragment))
        try:
            self._publish(txn, target, [copy], now_ns)
        except p.StoreFull as exc:
            log.warning("topic %s: message %s of subscriber %s dropped, DeadLetter refused it: %s",
                        topic.name, body.key.decode(errors="replace"), sub, exc)

    def _stats(self, t: int, s: int) -> SubStats | None:
        topic, sub = self._topic_by_id.get(t), self._sub_by_id.get(s)
        return self.state.subs.get(topic, {}).get(sub)

    def _return(self, txn: Txn, op: Returned) -> None:
        """A batch that never reached the subscriber: as if it had not been sent."""
        queue = self._queue_of(txn, op.topic, op.subscriber)
        event = self._events.batch(ev.RETURN, op.topic, op.subscriber) if self._events.journaled else None
        for m in op.msgs:
            if queue.give_back(m) and event is not None:
                event.ids.append(m)

    # --- timers: expiry and AckRetry ----------------------------------------------------------

    def _tick(self, txn: Txn, now_ns: int) -> None:
        for expires, t, m in txn.due_expiries(now_ns, PER_TICK):
            topic = self._topic_name(t)
            if topic is None:
                txn.remove_expiry(expires, t, m)
            else:
                self._expire(txn, topic, t, m)
        for t, s, m in txn.due_deadlines(now_ns, PER_TICK):
            self._requeue(txn, t, s, m, now_ns, "AckRetry")

    def _topic_name(self, t: int) -> str | None:
        name = self._topic_by_id.get(t)
        return name if name in self.topics else None

    def _expire(self, txn: Txn, topic: str, t: int, m: int) -> None:
        """PROTOCOL §3 Expiry: gone from every queue, also from in flight."""
        for stats in self._discard(txn, topic, t, m, ev.EXPIRE):
            stats.expired += 1
        self.state.topics[topic].expired += 1

    def _discard(self, txn: Txn, topic: str, t: int, m: int, kind: str) -> list[SubStats]:
        """Remove m from every queue and from in flight, and delete it; return the
        counters of the subscribers that still held it. `kind` is the journal's word
        for why (expire, overflow)."""
        holders = txn.get_holders(t, m)
        subs = self.state.subs[topic]
        publish_ns = txn.publish_ns(t, m) if self._events.journaled else 0
        held = []
        for s, (prio, pos) in holders.items():
            name = self._sub_by_id.get(s)
            if name not in subs:
                continue
            delivered = bool(Queue(txn, t, s, subs[name]).remove(m, prio, pos))
            held.append(subs[name])
            if self._events.journaled:
                event = self._events.batch(kind, topic, name)
                event.ids.append(m)
                event.pub_ns.append(publish_ns)
                event.delivered.append(delivered)
        txn.put_holders(t, m, {})
        self._delete_messages(txn, topic, t, [m])
        return held

    def _next_tick(self, txn: Txn, now_ns: int) -> int:
        candidates = [now_ns + TICK_NS, txn.next_expiry_ns(), txn.next_deadline_ns()]
        return max(now_ns, min(c for c in candidates if c is not None))

    # --- delivery ---------------------------------------------------------------------------

    def _space(self, sub: str, topic: TopicConfig) -> int:
        """How many messages of topic may be pushed to sub now."""
        sc = self.sub_configs[sub]
        return space(self.state.subs[topic.name][sub], sc.batch_size, self.config.window(sc))

    def _fill(self, txn: Txn, open_subs: set[str], now_ns: int) -> list[Delivery]:
        """Batches for every open subscriber, as many as its Window allows: one
        batch a step would leave a subscriber that fell one batch behind (say,
        connecting after the first publish) behind for good, taking every new
        message through the ready queue instead of straight into flight."""
        out = []
        for sub in sorted(open_subs):
            for topic in self.sub_topics.get(sub, ()):
                while (limit := self._space(sub, topic)) > 0:
                    delivery = self._pull(txn, sub, topic, limit, now_ns)
                    if delivery is None:
                        break
                    out.append(delivery)
        return out

    def _pull(self, txn: Txn, sub: str, topic: TopicConfig, limit: int, now_ns: int) -> Delivery | None:
        """The next batch for sub: its fresh messages when they are its whole queue,
        else from the ready rows; expired ones met on the way are expired."""
        t, s = self.state.topic_ids[topic.name], self.state.sub_ids[sub]
        queue = Queue(txn, t, s, self.state.subs[topic.name][sub], self._fresh.pop((topic.name, sub), None))
        deadline = now_ns + int(topic.ack_retry * NS) if topic.ack_retry and topic.ack_required else 0
        event = self._events.batch(ev.DELIVER, topic.name, sub) if self._events.journaled else None
        taken = queue.take_fresh(limit, deadline)
        if taken is not None:
            if event is not None:  # published in this very step
                event.ids += [f.m for f in taken]
                event.pub_ns += [now_ns] * len(taken)
                event.attempts += [1] * len(taken)
                event.bytes += [len(f.fragment) for f in taken]
            return Delivery(sub, topic.name, [f.m for f in taken], p.batch_frame(topic.name, sub, [f.fragment for f in taken]), auto_ack=not topic.ack_required)
        pulled = queue.pull(limit, deadline, lambda m: txn.get_body(t, m), lambda body: topic.expire and 0 < body.expires_ns <= now_ns)
        for m in pulled.expired:
            self._expire(txn, topic.name, t, m)
        if not pulled.entries:
            return None
        if event is not None:
            for entry, body in pulled.entries:
                event.ids.append(entry.msg)
                event.pub_ns.append(body.publish_ns)
                event.attempts.append(entry.attempts + 1)
                event.bytes.append(len(body.fragment))
        frame = p.batch_frame(topic.name, sub, [body.fragment for _, body in pulled.entries])
        return Delivery(sub, topic.name, [entry.msg for entry, _ in pulled.entries], frame, auto_ack=not topic.ack_required)

    def _queue_fresh(self, txn: Txn) -> None:
        """Fresh messages no batch took join the ready queues."""
        for (topic, sub), fresh in self._fresh.items():
            Queue(txn, self.state.topic_ids[topic], self.state.sub_ids[sub], self.state.subs[topic][sub], fresh).settle()
        self._fresh = {}

def generated_id(key: str) -> int | None:
    """The message id a generated key names (PROTOCOL §3 Keys), or None: only the
    canonical decimal the broker writes names one, so "0002" acks nothing."""
    if key.isascii() and key.isdigit() and key[0] != "0" and len(key) < 20:
        return int(key)
    return None


def _reply_error(exc: StoreError) -> p.RequestError:
    """What a request in a step that could not commit is answered."""
    return p.StoreFull(f"store full: {exc}") if isinstance(exc, StoreFullError) else p.RequestError(str(exc))


def _fragment(msg: Prepared) -> bytes:
    """A message's JSON as delivered (its key already assigned)."""
    return p.message_fragment(msg.key.decode(), msg.payload, msg.prio, msg.expires_ns)
