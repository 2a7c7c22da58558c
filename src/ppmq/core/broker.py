"""The broker's state machine (PROTOCOL §3), sans-IO.

`Broker.step` takes every request that arrived since the last commit, the
subscribers that can take a batch now, and the time; it applies them all in one
LMDB write transaction (group commit) and returns the replies, the batches to
push and when it next needs to run. It never touches a socket or reads a clock,
and it runs on one thread: the writer thread of the server, or a test.

This module is the step and the dispatch of requests (PROTOCOL §2), read top
down. What a request does to messages is in the parts the Broker is composed
of, each holding the few shared objects it reads (the counters in `State`, the
config in force in `Topology`, the step's journal `StepEvents`) and the parts
it calls: `Publisher` (publish.py), `Settlement` (settlement.py), `Dispatcher`
(dispatch.py), `Pull` (pull.py), `Admin` (core/admin.py), with `Queues` (core/queues.py)
and `LaneRouter` (core/laning.py) under them. The values a step takes and returns
are in core/ops.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from functools import partial
from typing import TypeVar

from msgspec import UNSET

from ppmq.config import Config, SubscriberConfig, TopicConfig
from ppmq.core import staging
from ppmq.core.access import Policy
from ppmq.core.admin import Admin
from ppmq.core.dispatch import Dispatcher
from ppmq.core.events import StepEvents
from ppmq.core.lanes import Lanes
from ppmq.core.laning import LaneRouter
from ppmq.core.ops import Abandoned, Delivery, Guarded, Invalid, Op, Reconfigure, Requeue, Step, Take, Unwritten, Written, request_id
from ppmq.core.publish import Publisher
from ppmq.core.pull import ABANDONED, Pull
from ppmq.core.queues import Queues
from ppmq.core.settlement import TICK_NS, Settlement
from ppmq.core.staging import Answer, Staging, is_large
from ppmq.core.taker_holdings import TakerHoldings
from ppmq.core.topology import Snapshot, Topology
from ppmq.core.validate import delay_ns, prepare
from ppmq.errors import BadRequest, ConfigError, Forbidden, Internal, RequestError, StoreError, StoreFull, StoreFullError
from ppmq.protocol import messages as p
from ppmq.store.counters import Ledger, load_state
from ppmq.store.state import NS, refused_changes, status_body
from ppmq.store.store import Store, Txn

log = logging.getLogger("ppmq.broker")
T = TypeVar("T")

COMMANDS = ("RECONNECT", "CONNECT", "STATUS", "TAKE", "PEEK", "PURGE", "REDRIVE", "PAUSE", "RESUME", "PING")
FIRST_RETRY_NS = NS // 10  # after a failed commit, steps without requests wait this long, doubling
MAX_RETRY_NS = 5 * NS
NO_TIMER_NS = 1 << 64  # _due_ns while no timer waits: later than any time a step is given


class _Replay(Exception):
    """Control flow of the step, not an error: a request failed in a step applied
    without savepoints, so the step is rolled back, to run again with them
    (Broker._transact). Private to this module, and kept out of ppmq.errors."""


class Broker:
    """One store's state machine; run `step` from one thread only."""

    def __init__(self, config: Config, store: Store, now_ns: int, complete_status: Callable[[dict], None] | None = None) -> None:
        """Open the broker on a store; ConfigError if the config would drop messages.

        `complete_status` adds to each STATUS body, on the writer thread, what
        only the process running the broker knows (connections, commit times)."""
        self.store = store
        self._complete_status = complete_status
        self.policy = Policy()  # connections check their requests against it, in the step
        self._topology = topology = Topology()
        self._takers = takers = TakerHoldings()  # who took what (PROTOCOL §9); no taker outlives the process
        self._events = events = StepEvents(config.journaled, now_ns)
        self._carried: list[Op] = []  # internal ops of a step whose commit failed, tried again
        self._failures = 0  # commits failed in a row
        self._retry_at_ns = 0  # after a failed commit, no step without requests before this
        # Topic -> the last id its sequence handed out in a step whose batches
        # left but whose commit failed: no rollback takes the sequence below it.
        self._let_out: dict[str, int] = {}
        self._topology_before: Snapshot | None = None  # the config in force before the step's first reload, once it has one
        with store.write() as txn:
            self.state = state = load_state(txn)
            self._ledger = ledger = Ledger(state)  # the counters' records, and their undo
            self._staging = Staging(txn.staged())  # a record left by a crash: its rows go
            self._queues = queues = Queues(state, topology)
            self._router = router = LaneRouter(state, topology)
            self._publisher = publisher = Publisher(state, topology, events, queues, self._staging)
            self._settlement = settlement = Settlement(state, topology, events, queues, takers, publisher)
            publisher.discard = settlement.discard
            self._dispatcher = dispatcher = Dispatcher(state, topology, events, ledger, queues, settlement, router)
            self._pull = Pull(state, topology, takers, dispatcher, settlement)
            self._admin = Admin(state, topology, events, queues, publisher, settlement, now_ns)
            self._switch(txn, config)
            self.state.resume_sequences()
            self._give_back_unconfirmed(txn, now_ns)
            self._queues.settle_all(txn)  # dead letters of what it gave up on, fresh for a Pull subscriber of theirs
            self._ledger.save(txn, everything=True)
        self._ledger.take_touched()
        self._dispatcher.index_backlog()
        self.next_tick_ns = now_ns  # when the server next asks wants_step without requests; read by it between steps
        # When a step without requests next has work: a timer due (expiry, AckRetry,
        # a delay), or a failed commit's retry. The timers are known exactly
        # (store/timers.py), so a broker with none due runs no step of its own.
        self._due_ns = now_ns
        # The push subscribers of a topic whose acks a publish to it is worth
        # waiting for (Dispatcher.awaiting_acks), asked by the server between steps.
        self.awaiting_acks: Callable[[str], list[str]] = self._dispatcher.awaiting_acks
        # Subscriber -> the topics where it has messages ready that wait for room in
        # its Window, as the last step left them (Dispatcher.backlog): the same
        # mapping for the broker's life, read by the server between steps.
        self.backlog: Mapping[str, Collection[str]] = self._dispatcher.backlog

    # --- what the server reads between steps, from the counters alone ------------------

    @property
    def config(self) -> Config:
        """The config in force."""
        return self._topology.config

    @property
    def topics(self) -> dict[str, TopicConfig]:
        return self._topology.topics

    @property
    def sub_configs(self) -> dict[str, SubscriberConfig]:
        return self._topology.sub_configs

    @property
    def sub_topics(self) -> dict[str, list[TopicConfig]]:
        return self._topology.sub_topics

    @property
    def staging(self) -> bool:
        """A large publish is in progress (or its rows are being deleted): step
        again even without requests."""
        return self._staging.busy

    def has_backlog(self, sub: str) -> bool:
        """sub has messages ready that wait for room in its Window, as the last
        step left them (read from the event loop like has_pending)."""
        return sub in self._dispatcher.backlog

    def ready_topics(self, sub: str) -> list[str]:
        return self._router.ready_topics(sub)

    def takeable(self, topic: str, sub: str) -> int:
        return self._pull.takeable(topic, sub)

    def take_room(self, topic: str, sub: str) -> int:
        return self._pull.take_room(topic, sub)

    def holders(self, topic: str, sub: str) -> set[int]:
        return self._pull.holders(topic, sub)

    def has_pending(self, sub: str) -> bool:
        """sub has messages ready or unacknowledged: worth connecting to (and
        starting) it; it will RECONNECT to get what it left unacknowledged.

        Read from the event loop while a step may run: it only looks values up,
        and a stale answer costs one step's delay.
        """
        subs = self.state.subs
        for t in self._topology.sub_topics.get(sub, ()):
            stats = subs.peek(t.name, {}).get(sub)
            if stats is not None and (stats.inflight or any(stats.ready)):
                return True
        return False

    # --- the step ---------------------------------------------------------------------

    def wants_step(self, open_subs: Collection[str], now_ns: int, lanes: dict[str, Lanes] | None = None) -> bool:
        """Whether a step with no requests would do anything now; `lanes` as for step.
        Asked at or past `next_tick_ns` with nothing due, it moves `next_tick_ns`
        on to when it is next worth asking. `open_subs` is made a set only when
        some subscriber has messages ready: the server passes its own view."""
        if now_ns < self._retry_at_ns:
            return False
        if now_ns >= self._due_ns or self._staging.busy:  # a large publish goes on (or its rows go), one chunk a step
            return True
        if now_ns >= self.next_tick_ns:  # the server's look with nothing due
            self._look_again(now_ns)
        dispatcher, router = self._dispatcher, self._router
        if not dispatcher.backlog and not self._ledger.touched:  # between steps: nobody has messages ready
            return False
        for sub, _, topic, stats in dispatcher.pending(set(open_subs)):
            if dispatcher.space(sub, topic, stats, router.lanes_of(sub, lanes) if lanes else None) > 0:
                return True
        return False

    def _look_again(self, now_ns: int) -> None:
        """When the server next asks wants_step without requests: when a timer is
        due (at once if one is due already), and at least once a TICK_NS, as the
        timers go by the wall clock and its waits by the loop's."""
        due = self._due_ns
        self.next_tick_ns = now_ns + TICK_NS if due >= now_ns + TICK_NS else due if due > now_ns else now_ns

    def step(
        self,
        ops: list[Op],
        open_subs: set[str],
        now_ns: int,
        early: Callable[[list[Delivery]], None] | None = None,
        lanes: dict[str, Lanes] | None = None,
    ) -> Step:
        """Apply ops, run due timers, fill open subscribers: one transaction, one commit.

        `early`, if given, is handed the step's batches just before the commit,
        so that they travel while the disk syncs: the ack that made room for a
        batch does not make it wait for an fsync. A crash or a failed commit can
        only deliver them again, which at-least-once allows; replies still wait
        for the commit. A step that handed out ids beyond the reservation of
        its topic's sequence (state.TopicStats.reserve) hands its batches to
        `early` after its commit instead: a key that left is never handed out
        again, whatever the crash. A step that runs out of room looks again for
        reader slots of dead processes (which pin pages) and, if that freed
        any, tries once more before answering 507. `lanes`: what each lane of the open
        subscribers with Connections > 1 carries (core/laning.py)."""
        self._router.lanes = lanes or {}
        carried = self._carried
        if carried:  # mostly none: no list made
            self._carried, ops = [], carried + ops
        # A reader killed inside a snapshot (a report, fsck) pins the pages it
        # could see until its slot is freed, so every commit would grow the file:
        # look for such slots at every step (a look at LMDB's reader table, well
        # under a microsecond).
        cleared = self.store.clear_stale_readers()
        if cleared:
            _freed_readers(cleared)
        ended: list[Answer] = []  # a staged publish the failed first try ended
        try:
            try:
                replies, deliveries, due, finished = self._transact(ops, open_subs, now_ns, early)
            except StoreFullError as exc:
                ended = self._staging.rolled_back(_reply_error(exc))
                cleared = self.store.clear_stale_readers()
                if not cleared:
                    raise
                _freed_readers(cleared)
                replies, deliveries, due, finished = self._transact(ops, open_subs, now_ns, early)
        except StoreError as exc:
            return self._failed(ops, len(carried), exc, now_ns, ended)
        if self._failures:
            log.warning("commits succeed again after %d failed", self._failures)
            self._failures = 0
        self._due_ns = NO_TIMER_NS if due is None else due
        self._look_again(now_ns)
        left = self._router.left_flight() if self._router.watch is not None else {}
        return Step(replies[len(carried) :] if carried else replies, deliveries, self._events.take(), ended + finished, left)

    def _transact(
        self, ops: list[Op], open_subs: set[str], now_ns: int, early: Callable[[list[Delivery]], None] | None, guarded: bool = False
    ) -> tuple[list, list[Delivery], int | None, list[Answer]]:
        """The step's one transaction; if it fails, the broker is left exactly as
        it was before (counters, config, access rules), and the error raised.

        The step's requests are applied as if none will fail (`_apply`): a
        request that does fail (rare: most are refused before they change
        anything) rolls the whole step back, and it runs again `guarded`, with
        a savepoint around each request (`_apply_guarded`), so that the failed
        one alone is undone and answered with its error. A savepoint and the
        undo levels of the counters would otherwise be the fixed cost of every
        request."""
        self._topology_before = None  # the config in force before the step's first reload
        self._queues.start(open_subs)
        self._events.now_ns = now_ns
        self._ledger.step()
        self._router.watch = None
        sent = False  # the step's batches left before its commit
        try:
            with self.store.write() as txn:
                if self._topology.laned:
                    self._router.watch_flights(txn)
                apply = self._apply_guarded if guarded else self._apply
                replies = []
                for op in ops:
                    replies.append(apply(txn, op, now_ns))
                staged = self._staging.busy  # a large publish goes on, or an ended one's rows go (core/staging.py)
                finished = self._staging.step(txn, partial(self._apply_guarded, txn, now_ns=now_ns)) if staged else []
                if now_ns >= self._due_ns:
                    self._settlement.tick(txn, now_ns)
                deliveries = self._dispatcher.fill(txn, open_subs, now_ns)
                if self._queues.fresh:  # what no batch took
                    self._queues.settle_all(txn)
                self.state.commits += 1
                held = self._ledger.end_step(txn)
                due = txn.next_timer_ns()  # when a timer is next due (expiry, AckRetry, a delay)
                if early is not None and deliveries and not held:
                    early(deliveries)
                    sent = True
        except _Replay:
            self._roll_back(sent)
            self._staging.forget_new()
            return self._transact(ops, open_subs, now_ns, early, guarded=True)
        except BaseException:
            self._roll_back(sent)
            raise
        touched = self._ledger.stepped()
        if staged:
            self._staging.committed()
        self._dispatcher.note_backlog(touched, self._dispatcher.emptied)
        if self._takers.log:
            self._takers.commit()
        if early is not None and deliveries and held:
            early(deliveries)
        return replies, deliveries, due, finished

    def _roll_back(self, sent: bool) -> None:
        """The step's transaction is aborted: the broker as the last commit left it;
        `sent`: the step's batches left before."""
        if sent:
            self._note_let_out()
        self._ledger.rollback(self.store.committed_meta)
        self._keep_let_out()
        if self._topology_before is not None:
            self._restore_topology(self._topology_before)
        self._queues.forget()  # they may hold counters the rollback replaced
        self._dispatcher.note_backlog(self._ledger.take_touched())
        self._events.clear()
        self._queues.fresh = {}
        self._takers.undo()

    def _note_let_out(self) -> None:
        """The batches of a step that is being rolled back left: the ids its
        topics' sequences handed out may have gone with them (PROTOCOL §3 Keys)."""
        topics = self.state.topics
        self._let_out.update((name, stats.seq) for name in self._ledger.touched if (stats := topics.peek(name)) is not None)

    def _keep_let_out(self) -> None:
        """After a rollback, which puts back the sequences as the last commit
        left them: none goes below an id that left (a restart goes on above
        the reservation instead, TopicStats.resume)."""
        for name, seq in self._let_out.items():
            stats = self.state.topics.peek(name)
            if stats is not None and stats.seq < seq:
                stats.seq = seq

    def _failed(self, ops: list[Op], carried: int, exc: StoreError, now_ns: int, ended: list[Answer]) -> Step:
        """Nothing of the step happened: every request is answered with the error
        (507 when out of room), and steps that no request asks for back off, so
        that a full store is not retried thousands of times a second."""
        self._failures += 1
        if self._failures == 1:
            log.error("commit failed: %s; retrying with backoff, and logging again once commits succeed", exc)
        delay_ns = min(MAX_RETRY_NS, FIRST_RETRY_NS << min(self._failures - 1, 16))
        self._retry_at_ns = self.next_tick_ns = self._due_ns = now_ns + delay_ns
        # Nobody resends an unwritten or a written batch, nor a gone taker: keep them for the next step.
        self._carried = [op for op in ops if isinstance(op, (Unwritten, Written, Abandoned))]
        err = _reply_error(exc)
        replies = [None if isinstance(op, (Unwritten, Written, Abandoned)) else p.error_reply(err, request_id(op)) for op in ops]
        return Step(replies[carried:], [], finished=ended + self._staging.rolled_back(err))

    # --- one op -----------------------------------------------------------------------

    def _apply(self, txn: Txn, op: Op, now_ns: int, guarded: bool = False) -> p.Reply | None:
        """One op's effect and reply, applied as if it will not fail: a request
        that fails raises _Replay, and the step runs again guarded, in which
        it raises its error (_apply_guarded).

        A request (PROTOCOL §2, §8): messages, acks, nacks, rejects, touches,
        then the command (a TAKE's on behalf of its taker); all or nothing.
        None: a large publish, answered in a later step (core/staging.py)."""
        taker = None
        if type(op) is not p.Request:  # a bare request, or one with its connection's access check
            if type(op) is Take:
                taker = op.taker
            elif type(op) is not Guarded:
                return self._apply_internal(txn, op, now_ns, False)
            try:
                if op.check is not None:
                    op.check(op.request)
            except Forbidden as exc:
                return self._apply_internal(txn, Invalid(exc, op.request.id), now_ns, False)
            except Exception as exc:  # a bug in the check: answered (and logged) once, in the guarded run
                raise _Replay from exc
            op = op.request
        events = self._events  # its batches are the request's (StepEvents)
        events.numbered = events.request = events.numbered + 1
        events.collecting = events.requests
        accepted, body = 0, None
        topics = self._topology.topics
        try:
            if op.messages is not None:
                try:
                    topic = topics[op.topic or ""]
                except KeyError:
                    topic = self._topology.topic_for(op, "Messages")  # which raises the error
                accepted = len(op.messages)
                if accepted > staging.CHUNK_MESSAGES and is_large(topic, op.messages):  # the module's, which tests shrink
                    if not self._publisher.publish_staged(txn, topic, op, now_ns):
                        return None
                else:
                    prepared = prepare(topic, op.messages, self._topology.config.max_message_bytes, now_ns)
                    txn.refuse_when_full(now_ns)
                    self._publisher.publish(txn, topic, prepared, now_ns)
            if op.acks is not None:
                try:
                    topic = topics[op.topic or ""]
                except KeyError:
                    topic = self._topology.topic_for(op, "Acks")  # which raises the error
                sub = op.subscriber if op.subscriber in topic.subscribers else self._topology.subscriber_of(op.subscriber, topic, "Acks")
                accepted += self._settlement.ack(txn, topic, sub, op.acks)
            if op.nacks is not None or op.rejects is not None or op.touch is not None or op.delay is not None:
                accepted += self._control(txn, op)
            if op.command is not None:
                body = self._command(txn, op, now_ns, taker)
        except Exception as exc:
            if guarded:
                raise
            raise _Replay from exc
        finally:
            events.collecting, events.request = events.own, 0
        return p.Reply(200, op.id, accepted, None, body)  # status, id, accepted, error, body: by position, built for less

    def _apply_guarded(self, txn: Txn, op: Op, now_ns: int) -> p.Reply | None:
        """One op's effect and reply, a request in a savepoint: one that fails is
        undone alone (its writes, counters, config and batches) and answered
        with its error."""
        if type(op) is not p.Request and type(op) is not Guarded and type(op) is not Take:
            return self._apply_internal(txn, op, now_ns, True)
        number = self._events.numbered + 1  # the request's: its batches go if it fails
        try:
            return self._undoable(txn, lambda: self._apply(txn, op, now_ns, True))
        except _Replay as replay:  # a bug in its access check, which wrote nothing
            return self._apply_internal(txn, Invalid(_error_of(replay.__cause__), request_id(op)), now_ns, True)  # type: ignore[arg-type]  # raised from an Exception
        except Exception as exc:  # a bug must cost one request, not the broker
            self._events.forget_from(number)
            error = _error_of(exc)
        req = op if type(op) is p.Request else op.request  # type: ignore[union-attr]  # a Guarded or a Take
        self.state.rejected += 1
        return self._rejected(p.error_reply(error, req.id), req.topic, len(req.messages or ()))

    def _apply_internal(self, txn: Txn, op: Op, now_ns: int, guarded: bool) -> p.Reply | None:
        """An op that is not a ppmq request: one the broker or its server made, or PHPMQ's re-queue."""
        if isinstance(op, Abandoned):
            self._pull.abandon(txn, op.taker, now_ns)
            return None
        if isinstance(op, (Unwritten, Written)):
            if op.subscriber not in self.state.subs.get(op.topic, {}):
                return None  # the subscription was dropped by a reload meanwhile
            if isinstance(op, Unwritten):
                self._settlement.give_back_unwritten(txn, op)
            else:
                self._settlement.ack(txn, self._topology.topics[op.topic], op.subscriber, None, op.msgs, "AutoAck")
            return None
        if isinstance(op, Invalid):
            self.state.rejected += 1
            self.state.forbidden += op.error.status == Forbidden.status
            return self._rejected(p.error_reply(op.error, op.id), None, 0)
        if isinstance(op, Reconfigure):
            return self._reconfigure(txn, op.config)
        if isinstance(op, Requeue):
            return self._apply_requeue(txn, op, now_ns, guarded)
        log.error("internal error: not an op: %r", op)  # a bug must cost one request, not the broker
        return p.error_reply(Internal(f"internal error: not an op: {type(op).__name__}"))

    def _apply_requeue(self, txn: Txn, op: Requeue, now_ns: int, guarded: bool) -> p.Reply | None:
        """PHPMQ's re-queue, all or nothing as a request is (see _apply); refused,
        it is counted and journaled as any refused request."""
        if not guarded:
            try:
                return self._events.of_request(self._settlement.give_back_to_end, txn, op, now_ns)
            except Exception as exc:
                raise _Replay from exc
        try:
            return self._events.of_request(lambda: self._undoable(txn, lambda: self._settlement.give_back_to_end(txn, op, now_ns)))
        except Exception as exc:  # a bug must cost one request, not the broker
            return self._apply_internal(txn, Invalid(_error_of(exc), UNSET), now_ns, True)

    def _undoable(self, txn: Txn, apply: Callable[[], T]) -> T:
        """apply(), whose writes, counters, config and fresh messages all vanish if
        it raises. The step's fresh lists are kept by value: a STATUS or a reload
        moves them into the queues (and empties the dict) inside it."""
        topology, owners = self._topology.snapshot(), self._takers.mark()
        fresh_before = {key: (fresh, len(fresh)) for key, fresh in self._queues.fresh.items()}
        self._ledger.begin()
        try:
            with txn.savepoint():
                result = apply()
        except BaseException:
            self._takers.undo(owners)
            self._ledger.undo()
            self._restore_topology(topology)
            self._queues.fresh = {key: fresh[:n] for key, (fresh, n) in fresh_before.items() if n}
            raise
        self._ledger.end()
        return result

    def _rejected(self, reply: p.Reply, topic: str | None, count: int) -> p.Reply:
        self._events.reject(topic, reply.status, reply.error, count)
        return reply

    def _control(self, txn: Txn, req: p.Request) -> int:
        """PROTOCOL §8: Nacks, Rejects and Touch, in this order; how many keys applied."""
        if req.delay is not None and req.nacks is None:
            raise BadRequest("Delay: only with Nacks (a message waits with its own Delay or NotBefore)")
        if req.nacks is None and req.rejects is None and req.touch is None:  # a publish or an ack: the usual
            return 0
        applied = 0
        for field, keys in (("Nacks", req.nacks), ("Rejects", req.rejects), ("Touch", req.touch)):
            if keys is None:
                continue
            topic = self._topology.topic_for(req, field)
            sub = self._topology.subscriber_of(req.subscriber, topic, field)
            if field == "Nacks":
                applied += self._settlement.nack_keys(txn, topic, sub, keys, delay_ns(req.delay or 0, "Delay"))
            elif field == "Rejects":
                applied += self._settlement.reject_keys(txn, topic, sub, keys)
            else:
                applied += self._settlement.touch_keys(txn, topic, sub, keys)
        return applied

    def _command(self, txn: Txn, req: p.Request, now_ns: int, taker: int | None) -> dict | None:
        """The Body of the request's Command (PROTOCOL §2, §8, §9), None if it has none."""
        match (req.command or "").upper():  # set: the caller asks only then
            case "TAKE":
                return self._pull.take(txn, req, taker, now_ns)
            case "RECONNECT" | "CONNECT":
                topics = self._topology.topics_of_subscriber(req, "RECONNECT")  # which refuses a request without Subscriber
                self._settlement.reconnect(txn, req.subscriber or "", topics, now_ns)
                return None
            case "STATUS":
                return self._status(txn, req, now_ns)
            case "PING":
                return self._admin.ping(now_ns)
            case "PAUSE":
                self._admin.pause(req, True)
                return None
            case "RESUME":
                self._admin.pause(req, False)
                return None
            case "PEEK":
                return self._admin.peek(txn, req)
            case "PURGE":
                return self._admin.purge(txn, req)
            case "REDRIVE":
                return self._admin.redrive(txn, req, now_ns)
            case _:
                raise BadRequest(f"Command: unknown command {req.command!r} (expected {', '.join(COMMANDS)})")

    def _status(self, txn: Txn, req: p.Request, now_ns: int) -> dict:
        """PROTOCOL §2 STATUS: the counters of every topic, or of the request's Topic."""
        self._queues.settle_all(txn)  # so that OldestReadyAge sees them
        if req.topic is not None:
            self._topology.topic_for(req, "STATUS")
        self._pull.prune_takers(txn)  # so that the takers counted hold messages in flight
        body = status_body(self._topology.config, self.state, txn, now_ns, req.topic)
        if self._complete_status is not None:
            self._complete_status(body)
        return body

    # --- the config in force: one value, switched whole ---------------------------------

    def _reconfigure(self, txn: Txn, config: Config) -> p.Reply:
        """All of the new config, or none of it (the old one keeps running); the
        reload is always answered, so whoever asked for it never waits for ever."""
        if self._topology_before is None:  # a failed step puts it back
            self._topology_before = self._topology.snapshot()
        try:
            self._undoable(txn, lambda: self._switch(txn, config))
        except ConfigError as exc:
            return p.error_reply(BadRequest(str(exc)))
        except StoreFullError as exc:
            return p.error_reply(StoreFull(f"store full: {exc}"))
        except Exception as exc:
            log.exception("reload failed")
            return p.error_reply(Internal(f"reload failed: {type(exc).__name__}: {exc}"))
        return p.Reply(status=200)

    def _switch(self, txn: Txn, config: Config) -> None:
        """Make `config` the broker's, dropping what it says goes (PROTOCOL §6 DropTopics)."""
        errors = refused_changes(self.state, self._topology.topics, config)
        if errors:
            raise ConfigError(errors)
        self._queues.settle_all(txn)  # a subscription dropped below must find its messages in the store
        for topic, subs in list(self.state.subs.items()):
            tc = next((t for t in config.topics if t.name == topic), None)
            for sub in [s for s in subs if tc is None or s not in tc.subscribers]:
                self._drop_subscription(txn, topic, sub)
            if tc is None:
                log.warning("topic %s removed from the config: forgotten", topic)
                self.state.forget(topic)
        self.state.register(config)
        self._topology.install(config, self.state)
        self._queues.forget()
        self.policy.rules = self._topology.rules
        self._topology.rules.warn_unknown()
        self._dispatcher.index_backlog()

    def _restore_topology(self, snapshot: Snapshot) -> None:
        """The config in force as `snapshot` held it, access rules included."""
        self._topology.restore(snapshot)
        self._queues.forget()
        self.policy.rules = self._topology.rules

    def _drop_subscription(self, txn: Txn, topic: str, sub: str) -> None:
        """sub no longer takes topic: what it still had there is released, and
        messages nobody else holds are deleted (like deleting a bound queue)."""
        msgs = self._queues.of(txn, topic, sub).drop_all()
        t, s = self.state.topic_ids[topic], self.state.sub_ids[sub]
        self._settlement.release(txn, topic, t, s, msgs)
        del self.state.subs[topic][sub]
        log.warning("subscriber %s removed from topic %s: %d pending messages dropped for it", sub, topic, len(msgs))

    def _give_back_unconfirmed(self, txn: Txn, now_ns: int) -> None:
        """Deliver again (at least once) what nothing will ever ack: on an
        `AckRequired: false` topic, what a previous run pushed without seeing the
        write finish; for a Pull subscriber, what the takers of that run, all
        gone with it, took (PROTOCOL §9 Competing consumers)."""
        for tc in self._topology.config.topics:
            t = self.state.topic_ids[tc.name]
            for name in tc.subscribers:
                if tc.ack_required and not self._topology.sub_configs[name].pull:
                    continue
                s = self.state.sub_ids[name]
                for flight in txn.inflight_of(t, s):
                    self._settlement.give_back(txn, t, s, flight.m, now_ns, ABANDONED if tc.ack_required else "Unconfirmed")


def _freed_readers(cleared: int) -> None:
    log.warning("freed %d reader slots of processes that died inside a read", cleared)


def _error_of(exc: Exception) -> RequestError:
    """What a request that raised exc is answered: its own error, 507 for a full
    store, and 500 for anything else, a bug, whose traceback is logged."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, StoreFullError):
        return StoreFull(f"store full: {exc}")
    log.error("internal error on a request", exc_info=exc)
    return Internal(f"internal error: {type(exc).__name__}: {exc}")


def _reply_error(exc: StoreError) -> RequestError:
    """What a request in a step that could not commit is answered."""
    return StoreFull(f"store full: {exc}") if isinstance(exc, StoreFullError) else Internal(str(exc))
