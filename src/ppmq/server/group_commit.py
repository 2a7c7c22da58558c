"""Group commit: the one thread that writes, fed by the event loop.

Requests from every connection queue up while a transaction is being committed;
the next step takes all of them into one transaction, so one fsync serves them
all, and replies leave only after that commit. With Sync the broker runs on a
single worker thread: LMDB releases the GIL while it writes and syncs, so the
event loop keeps reading sockets, and pushes the step's batches, while the disk
works. Without Sync a commit does not wait for the disk, and the step runs on
the event loop itself, which costs less than the hand-off to a thread. Either
way a step's batches leave before its commit, and its replies after.

A step's work is bounded, so that no request makes the others wait long: at most
MAX_OPS_PER_STEP requests, and about CHUNK_MESSAGES messages beside one chunk of
a large publish, which the broker stages over several steps (core/staging.py) and
answers in a later step than the one it arrived in. Until then the writer keeps
its reply sink, and holds back what its connection sent after it, so that a
connection's requests still apply, and are answered, in the order it sent them.
"""

from __future__ import annotations

import asyncio
import operator
import queue
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from ppmq.core import staging
from ppmq.core.broker import Broker
from ppmq.core.events import Event
from ppmq.core.lanes import Lanes
from ppmq.core.ops import Delivery, Guarded, Op, Unwritten, request_of
from ppmq.core.staging import Answer
from ppmq.protocol import messages as p
from ppmq.server.gathering import Gathering
from ppmq.server.waiters import Waiters

ReplySink = Callable[[p.Reply], None]
EventSink = Callable[[list[Event]], None]  # must not block: it runs on the event loop
MAX_OPS_PER_STEP = 2000  # bounds one transaction's size and the latency of the first reply
MAX_MESSAGES_PER_STEP = staging.CHUNK_MESSAGES  # requests beyond this many messages wait for the next step
# Acks that owe no reply wait this long for company: with Sync each commit costs an
# fsync, and the next publish usually arrives right behind the acks of the last one.
# Not those of a subscriber with messages ready, which its next batch waits for.
# A publish whose subscribers' acks are on their way waits for them as long (gathering.py).
ACK_GATHER_S = 0.002
# uvloop's timers and loop.time() count whole milliseconds: a timer due in less
# fires on the next turn of the loop, whose clock has not moved yet, so a wait
# shorter than this would spin until the clock's next millisecond.
LOOP_TICK_S = 0.001


class Follower(Protocol):
    """What follows the writer's steps (server/take_waits.py), on the event loop."""

    def join(self, ops: list[Op]) -> list[tuple[Op, ReplySink]]:
        """Before a step, shown its ops: the ops (with their reply sinks) to run in it after them."""
        ...

    def stepped(self) -> None:
        """After a step, before the next one starts: the broker's counters are as it left them."""
        ...


class Outlet(Protocol):
    """Where a subscriber's batches go: its delivery task."""

    def push(self, delivery: Delivery) -> bool:
        """Take a batch; True if it may be given another at once, as if opened
        again (GroupCommit.open), which it is told otherwise when it may."""
        ...


class LanedOutlet(Outlet, Protocol):
    """The outlet of a subscriber with Connections > 1 (core/lanes.py)."""

    def lanes(self) -> Lanes:
        """What each lane carries now; None for a lane that cannot take a batch."""
        ...

    def left(self, topic: str, msgs: list[int]) -> None:
        """msgs of topic left flight (Step.left)."""
        ...


class GroupCommit:
    """Runs the broker's steps on its own thread, one after another, each with
    everything that was queued while the previous one committed."""

    def __init__(
        self, broker: Broker, journal: EventSink | None = None, *, durable: bool = True, on_step: Callable[[float], None] | None = None
    ) -> None:
        """`on_step` is told each step's seconds, commit included (on the event loop)."""
        self.broker = broker
        # With fsync, steps run on a thread of their own, so the loop goes on while
        # the disk syncs, and batches leave before the sync ends (Broker.step's
        # `early`). Without, a step costs less than handing it to a thread would.
        self._durable = durable
        self._journal = journal
        # The last step's events, written while the next step commits (_early), or
        # before the writer waits: not between two steps, with the step thread idle.
        self._unjournaled: list[Event] = []
        self._on_step = on_step
        self._pending: list[tuple[Op, ReplySink | None]] = []
        self._pending_messages = 0  # the messages of the requests pending
        self._later: dict[int, tuple[Op, ReplySink]] = {}  # id(op) -> a staged publish and its sink
        self._open: dict[str, Outlet] = {}  # subscribers able to take a batch now
        self._laned: dict[str, LanedOutlet] = {}  # subscribers with Connections > 1, open or not
        self._waiter: asyncio.Future[None] | None = None  # run() waits on it for work or a timer
        # run()'s loop, kept: asyncio.get_running_loop() makes a getpid() system
        # call each time, and the writer waits a few times for every step. Set
        # when run() starts; what uses it (waits and gathering) happens only after.
        self._loop: asyncio.AbstractEventLoop
        self._stopping = False
        self._gather_until: float | None = None  # loop time the one-way acks pending wait for company until
        self._timer: asyncio.TimerHandle | None = None  # ends run()'s wait for company
        # Ends run()'s idle wait (_sleep), and is kept from one idle wait to the
        # next until it fires, when it falls within the next one: at a paced rate
        # the writer waits idle after every step, and a timer armed and cancelled
        # for each wait cost more than a wake-up a second sooner than needed.
        self._tick: asyncio.TimerHandle | None = None
        self._tick_at = 0.0  # loop time _tick fires at
        self._heartbeat = time.monotonic()  # last time run() ended a step or went round idle
        self._busy_since: float | None = None  # a step is running on the thread since then
        self._stepped = Waiters()  # woken after each step
        self._followers: list[Follower] = []  # shown each step (follow); none most of the time
        self._gathering = Gathering(broker)  # whether the ops pending may wait for company

    def healthy(self, max_age_s: float) -> bool:
        """Committing or idling normally: no step stuck (on a lock or a dead disk)
        and the loop going round; what the systemd watchdog vouches for. A
        writer waiting for work or its next tick (up to a second) is idle, not
        stuck, however long ago it last went round."""
        if self._busy_since is not None:
            return time.monotonic() - self._busy_since < max_age_s
        return self._waiter is not None or time.monotonic() - self._heartbeat < max_age_s

    @property
    def busy(self) -> bool:
        """A step is running: the broker's state belongs to the writer thread."""
        return self._busy_since is not None

    async def wanted(self, subscriber: str) -> None:
        """Return once the broker holds something for subscriber."""
        await self.until(lambda: self.broker.has_pending(subscriber))

    async def until(self, predicate: Callable[[], bool]) -> None:
        """Return once predicate, asked at once and after every step, holds."""
        while not predicate():
            await self._stepped.wait()

    def follow(self, follower: Follower) -> None:
        """Until `unfollow`, show `follower` every step: its ops before it, so
        that the ops it returns run in the same step after them, and its end,
        before the next one starts, so that it reads the broker's counters as
        that step left them. How a waiting TAKE (server/take_waits.py) is served
        by the step of the publish that brings its messages, not by one more
        step of its own, and learns that messages may be there; a writer with
        no TAKE waiting shows its steps to nobody."""
        self._followers.append(follower)

    def unfollow(self, follower: Follower) -> None:
        self._followers.remove(follower)

    async def call(self, op: Op) -> p.Reply:
        """Submit `op` and wait for its reply."""
        done: asyncio.Future[p.Reply] = asyncio.get_running_loop().create_future()
        self.submit(op, partial(_resolve, done))  # the caller may be cancelled before the reply
        return await done

    def submit(self, op: Op, sink: ReplySink | None = None) -> None:
        """Queue an op for the next transaction; `sink` receives its reply after commit.

        The writer is not woken while every op queued may wait for company
        (gathering.py): one more ack while acks gather changes nothing for it, and
        the first to come while it waits idle only brings its timer forward to
        the end of the gathering (every subscriber sends one per batch, and at
        a paced rate the wake-up cost as much as the rest of the ack's way in).
        It is woken by the op that ends the wait: the acks a publish waits for."""
        self._pending.append((op, sink))
        req = op.request if type(op) is Guarded else request_of(op)  # a connection's request, mostly
        if req is not None and req.messages is not None:
            self._pending_messages += len(req.messages)
        if self._gather_until is None:  # the company of what is queued is known while ops gather
            # What is counted no longer holds: a step runs, or the writer is woken
            # already, and takes op anyway (not counted); or the writer waits idle,
            # for nothing queued, and op is the first counted (the state is the loop's to read).
            self._gathering.stale = True
            if self._waiter is None:
                return
        if not self._gathering.add(op, req):
            self._wake()
        elif self._gather_until is None:  # acks begin to gather while the writer waits idle: its wait ends with them
            loop = self._loop
            self._gather_until = until = loop.time() + ACK_GATHER_S
            if self._tick_at > until:  # the idle wait's end (_sleep), which the gathering's comes before
                self._timer = loop.call_at(until, self._wake)

    def open(self, subscriber: str, outlet: Outlet) -> None:
        """The subscriber is connected and idle: it may be given batches.

        A subscriber opens again after every batch it takes, and mostly nothing
        more is ready for it yet: the writer is woken only when a step would
        fill it. While the writer waits, no step runs, so the broker's state is
        the event loop's to read; while a step runs, the writer looks at every
        open subscriber once it is done anyway.
        """
        self._open[subscriber] = outlet
        if self._waiter is not None and self.broker.wants_step((subscriber,), time.time_ns(), self._lanes() if self._laned else None):
            self._wake()

    def close(self, subscriber: str) -> None:
        self._open.pop(subscriber, None)

    def track(self, subscriber: str, outlet: LanedOutlet | None) -> None:
        """subscriber has lanes (None: no longer): each step asks it what they
        carry and tells it what left flight."""
        if outlet is None:
            self._laned.pop(subscriber, None)
        else:
            self._laned[subscriber] = outlet

    def _lanes(self) -> dict[str, Lanes]:
        """What the lanes of open subscribers carry; asked only when some subscriber has lanes."""
        return {name: outlet.lanes() for name, outlet in self._laned.items() if name in self._open}

    def stop(self) -> None:
        """Finish what is queued, then return from run()."""
        self._stopping = True
        self._wake()

    def _wake(self) -> None:
        """Let run() look again, if it waits; when it does not, it looks anyway
        before it next waits. A waiter is woken once: from then on it is no
        longer the writer's (`_waiter` is None). The timer of a wait for company
        goes with it; an idle wait's stays for the next idle wait (_sleep)."""
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if self._timer is not None:  # let go of it; harmless when it is what calls
                self._timer.cancel()
                self._timer = None
            try:
                waiter.set_result(None)
            except asyncio.InvalidStateError:  # cancelled: run() is being cancelled
                pass

    async def run(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        thread = _StepThread(loop) if self._durable else None
        stepped = False  # the last round ran a step, whose end was the heartbeat
        try:
            while True:
                if not self._pending:
                    if not stepped:
                        self._heartbeat = time.monotonic()
                    stepped = False
                    if self._stopping and not self.broker.staging:  # a large publish is finished first
                        return
                    now_ns = time.time_ns()
                    if not self.broker.wants_step(self._open.keys(), now_ns, self._lanes() if self._laned else None):
                        self._write_journal()
                        await self._sleep((self.broker.next_tick_ns - now_ns) / 1e9)  # as the step or wants_step left it
                        continue
                else:
                    company = self._gathering
                    if company.stale:
                        company.recount(map(_op_of, self._pending))
                    if company.may_wait and not self._stopping:
                        await self._gather_acks()
                    self._gather_until = None  # what is queued goes now: what comes next is counted anew
                batch = self._take_batch()
                ops = list(map(_op_of, batch))
                for follower in self._followers:
                    joined = follower.join(ops)
                    if joined:
                        batch += joined
                        ops += map(_op_of, joined)
                open_subs = set() if self._stopping else set(self._open)
                lanes = self._lanes() if self._laned else None
                started = self._busy_since = time.monotonic()
                try:
                    if thread is not None:
                        step = await thread.call(self.broker.step, ops, open_subs, time.time_ns(), self._early_from_thread, lanes)
                    else:
                        step = self.broker.step(ops, open_subs, time.time_ns(), self._dispatch, lanes)
                finally:
                    self._busy_since = None
                self._heartbeat = ended = time.monotonic()
                stepped = True
                if self._on_step is not None:
                    self._on_step(ended - started)
                self._gathering.stale = True  # counted against the state before the step
                for (op, sink), reply in zip(batch, step.replies):
                    if sink is None:
                        continue
                    if reply is not None:
                        sink(reply)
                    elif (req := request_of(op)) is not None:  # staged: answered in a later step
                        self._later[id(req)] = (req, sink)
                if step.finished:
                    self._answer_later(step.finished)
                if step.left:
                    self._free(step.left)
                if self._stepped.futures:
                    self._stepped.wake()
                for follower in self._followers:
                    follower.stepped()
                if self._unjournaled:  # the step before's, unless this one's batches took them
                    self._write_journal()
                self._unjournaled = step.events
        finally:
            self._wake()  # a wait cut short (run() cancelled) lets go of its timers
            if self._tick is not None:
                self._tick.cancel()
                self._tick = None
            if thread is not None:
                thread.stop()
            self._write_journal()

    async def _gather_acks(self) -> None:
        """While every op queued may wait for company, give whatever comes next
        until ACK_GATHER_S after the first of them to join them, so that one
        commit serves both."""
        loop, company = self._loop, self._gathering
        until = self._gather_until
        if until is None:  # they begin to gather now
            self._gather_until = until = loop.time() + ACK_GATHER_S
        while not self._stopping and self._pending and company.may_wait:
            remaining = until - loop.time()
            if remaining < LOOP_TICK_S / 2:  # the rest of a millisecond the loop's clock has not counted
                company.ran_out()
                return
            await self._sleep(remaining)

    def _sleep(self, timeout_s: float) -> asyncio.Future[None]:
        """What run() awaits until something is submitted or a subscriber opens, or
        timeout_s: the end of a wait for company, or with nothing to do the
        next timer (at most a second away); at least the loop's tick, so that
        an end due within the tick is waited for rather than spun for. A bare
        future and a timer handle: this runs a few times for every step, and
        wait_for would add a task each time. `_wake` ends it and lets go of the
        timer of a wait for company; an idle wait's timer is kept for the next
        idle wait when it fires no later (run() woken early looks again and
        finds nothing to do, as after every wake-up)."""
        loop = self._loop
        self._waiter = waiter = loop.create_future()
        delay = 1.0 if timeout_s > 1.0 else timeout_s if timeout_s > LOOP_TICK_S else LOOP_TICK_S
        if self._gather_until is not None:  # ops wait for company
            self._timer = loop.call_later(delay, self._wake)
            return waiter
        at = loop.time() + delay
        tick = self._tick
        if tick is None or self._tick_at > at:
            if tick is not None:
                tick.cancel()
            self._tick_at = at
            self._tick = loop.call_at(at, self._ticked)
        return waiter

    def _ticked(self) -> None:
        """The idle wait's timer fired: the next idle wait arms another."""
        self._tick = None
        self._wake()

    def _take_batch(self) -> list[tuple[Op, ReplySink | None]]:
        """The next step's ops, in order of arrival, up to MAX_OPS_PER_STEP ops and
        MAX_MESSAGES_PER_STEP messages (a large publish counts one chunk), leaving
        out the ops of connections whose staged publish is not answered yet, or
        that come after a publish large enough to be staged. Mostly that is all
        of them: too few messages for a step, none large, no publish staged."""
        pending, messages = self._pending, self._pending_messages
        if messages < MAX_MESSAGES_PER_STEP and messages <= staging.CHUNK_MESSAGES and len(pending) <= MAX_OPS_PER_STEP and not self._later:
            self._pending, self._pending_messages = [], 0
            return pending
        waiting: set[ReplySink | None] = {sink for _, sink in self._later.values()} if self._later else set()
        batch: list[tuple[Op, ReplySink | None]] = []
        kept: list[tuple[Op, ReplySink | None]] = []
        messages = 0
        for i, (op, sink) in enumerate(self._pending):
            if len(batch) >= MAX_OPS_PER_STEP or (batch and messages >= MAX_MESSAGES_PER_STEP):
                kept += self._pending[i:]
                break
            if sink is not None and sink in waiting:
                kept.append((op, sink))
                continue
            batch.append((op, sink))
            req = request_of(op)
            if req is not None and req.messages:
                messages += min(len(req.messages), staging.CHUNK_MESSAGES)
                if len(req.messages) > staging.CHUNK_MESSAGES:  # may be staged: what follows it waits
                    waiting.add(sink)
        self._pending = kept
        self._pending_messages = sum(len(req.messages) for req in map(request_of, map(_op_of, kept)) if req is not None and req.messages)
        return batch

    def _answer_later(self, finished: list[Answer]) -> None:
        for op, reply in finished:
            _, sink = self._later.pop(id(op), (op, None))
            if sink is not None:
                sink(reply)

    def _early(self, deliveries: list[Delivery]) -> None:
        """A step's batches, handed over just before its commit: they go out while
        the disk syncs, and so do the step before's journal events, encoded while
        the step thread waits for the disk without the interpreter lock. Encoded
        between two steps, they would hold the next step back."""
        self._dispatch(deliveries)
        if self._unjournaled:
            self._write_journal()

    def _early_from_thread(self, deliveries: list[Delivery]) -> None:
        """`_early`, called by the step thread: run on the event loop."""
        self._loop.call_soon_threadsafe(self._early, deliveries)

    def _write_journal(self) -> None:
        if self._unjournaled:
            events, self._unjournaled = self._unjournaled, []
            if self._journal is not None:
                self._journal(events)

    def _dispatch(self, deliveries: list[Delivery]) -> None:
        """Each batch to its subscriber's outlet, which is no longer open once
        given one, unless it says that it may take another at once."""
        opened = self._open
        outlets: dict[str, Outlet | None] = {}
        for delivery in deliveries:
            sub = delivery.subscriber
            if sub in outlets:
                outlet = outlets[sub]
            elif sub in opened:
                outlet = outlets[sub] = opened[sub]
                del opened[sub]
            else:
                outlet = outlets[sub] = None
            if outlet is None:  # the connection went away while the step ran
                self.submit(Unwritten(sub, delivery.topic, delivery.msgs))
            elif outlet.push(delivery):
                opened[sub] = outlet

    def _free(self, left: dict[str, dict[str, list[int]]]) -> None:
        """Room again on the lanes that carried what left flight in the step; after
        the step's batches went out, since those were booked on their lanes then."""
        for name, topics in left.items():
            outlet = self._laned.get(name)
            if outlet is not None:
                for topic, msgs in topics.items():
                    outlet.left(topic, msgs)


class _StepThread:
    """The writer's thread: runs one call at a time and hands its result back to
    the event loop with one call_soon_threadsafe, without the executor's work
    items, locks and chained futures, which cost the loop more than the hand-off."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._calls: queue.SimpleQueue[tuple[asyncio.Future[Any], Callable[..., Any], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="ppmq-writer", daemon=True)
        self._thread.start()

    def call(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """fn(*args) on the thread; the future has its result or its exception."""
        done = self._loop.create_future()
        self._calls.put((done, fn, args))
        return done

    def stop(self) -> None:
        """Return once the call in progress, if any, has finished and the thread is gone."""
        self._calls.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            done, fn, args = call
            try:
                result = fn(*args)
            except BaseException as exc:  # whatever it is, run() hears it as run_in_executor told it
                self._loop.call_soon_threadsafe(_fail, done, exc)
            else:
                self._loop.call_soon_threadsafe(_resolve, done, result)


_op_of = operator.itemgetter(0)  # of an (op, sink) pair


def _resolve(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
