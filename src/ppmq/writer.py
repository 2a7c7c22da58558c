"""Group commit: the one thread that writes, fed by the event loop.

Requests from every connection queue up while a transaction is being committed;
the next step takes all of them into one transaction, so one fsync serves them
all, and replies leave only after that commit. The broker runs on a single
worker thread: LMDB releases the GIL while it writes and syncs, so the event
loop keeps reading sockets while the disk works.

A step's work is bounded, so that no request makes the others wait long: at most
MAX_OPS_PER_STEP requests, and about CHUNK_MESSAGES messages beside one chunk of
a large publish, which the broker stages over several steps (staging.py) and
answers in a later step than the one it arrived in. Until then the writer keeps
its reply sink, and holds back what its connection sent after it, so that a
connection's requests still apply, and are answered, in the order it sent them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from msgspec import UNSET

from . import protocol as p
from . import staging
from .broker import Broker
from .events import Event
from .ops import Delivery, Op, Returned, Written, request_of
from .staging import Answer

ReplySink = Callable[[p.Reply], None]
EventSink = Callable[[list[Event]], None]  # must not block: it runs on the event loop
MAX_OPS_PER_STEP = 2000  # bounds one transaction's size and the latency of the first reply
MAX_MESSAGES_PER_STEP = staging.CHUNK_MESSAGES  # requests beyond this many messages wait for the next step
# Acks that owe no reply wait this long for company: with Sync each commit costs an
# fsync, and the next publish usually arrives right behind the acks of the last one.
ACK_GATHER_S = 0.002


class Outlet(Protocol):
    """Where a subscriber's batches go: its delivery task."""

    def push(self, delivery: Delivery) -> None: ...


class Writer:
    """Runs the broker's steps on its own thread, one after another, each with
    everything that was queued while the previous one committed."""

    def __init__(self, broker: Broker, journal: EventSink | None = None, on_step: Callable[[float], None] | None = None) -> None:
        """`on_step` is told each step's seconds, commit included (on the event loop)."""
        self.broker = broker
        self._journal = journal
        self._on_step = on_step
        self._pending: list[tuple[Op, ReplySink | None]] = []
        self._later: dict[int, tuple[Op, ReplySink]] = {}  # id(op) -> a staged publish and its sink
        self._open: dict[str, Outlet] = {}  # subscribers able to take a batch now
        self._wake = asyncio.Event()
        self._stopping = False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ppmq-writer")
        self._heartbeat = time.monotonic()  # last time the loop below went round
        self._busy_since: float | None = None  # a step is running on the thread since then
        self._stepped = asyncio.Event()  # set after each step, then replaced

    def healthy(self, max_age_s: float) -> bool:
        """Committing or idling normally: no step stuck (on a lock or a dead disk)
        and the loop going round; what the systemd watchdog vouches for."""
        since = self._busy_since if self._busy_since is not None else self._heartbeat
        return time.monotonic() - since < max_age_s

    @property
    def busy(self) -> bool:
        """A step is running: the broker's state belongs to the writer thread."""
        return self._busy_since is not None

    async def wanted(self, subscriber: str) -> None:
        """Return once the broker holds something for subscriber."""
        while not self.broker.has_pending(subscriber):
            await self._stepped.wait()

    async def call(self, op: Op) -> p.Reply:
        """Submit `op` and wait for its reply."""
        done: asyncio.Future[p.Reply] = asyncio.get_running_loop().create_future()
        self.submit(op, done.set_result)
        return await done

    def submit(self, op: Op, sink: ReplySink | None = None) -> None:
        """Queue an op for the next transaction; `sink` receives its reply after commit."""
        self._pending.append((op, sink))
        self._wake.set()

    def open(self, subscriber: str, outlet: Outlet) -> None:
        """The subscriber is connected and idle: it may be given batches."""
        self._open[subscriber] = outlet
        self._wake.set()

    def close(self, subscriber: str) -> None:
        self._open.pop(subscriber, None)

    def stop(self) -> None:
        """Finish what is queued, then return from run()."""
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._heartbeat = time.monotonic()
                if not self._pending:
                    if self._stopping and not self.broker.staging:  # a large publish is finished first
                        return
                    now_ns = time.time_ns()
                    if not self.broker.wants_step(set(self._open), now_ns):
                        await self._sleep((self.broker.next_tick_ns - now_ns) / 1e9)
                        continue
                else:
                    await self._gather_acks()
                batch = self._take_batch()
                open_subs = set() if self._stopping else set(self._open)
                ops = [op for op, _ in batch]
                started = self._busy_since = time.monotonic()
                try:
                    step = await loop.run_in_executor(self._executor, self.broker.step, ops, open_subs, time.time_ns())
                finally:
                    self._busy_since = None
                if self._on_step is not None:
                    self._on_step(time.monotonic() - started)
                self._answer(batch, step.replies)
                self._answer_later(step.finished)
                self._dispatch(step.deliveries)
                self._stepped.set()
                self._stepped = asyncio.Event()
                if step.events and self._journal is not None:
                    self._journal(step.events)
        finally:
            self._executor.shutdown(wait=True)

    async def _gather_acks(self) -> None:
        """While only one-way acks wait, give whatever comes next up to
        ACK_GATHER_S to join them, so that one commit serves both."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ACK_GATHER_S
        while not self._stopping and self._pending and all(_quiet(op) for op, _ in self._pending):
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=remaining)
            except TimeoutError:
                return

    async def _sleep(self, timeout_s: float) -> None:
        """Until something is submitted or a subscriber opens, or the next timer."""
        self._wake.clear()
        try:
            await asyncio.wait_for(self._wake.wait(), timeout=min(1.0, max(0.0, timeout_s)))
        except TimeoutError:
            pass

    def _take_batch(self) -> list[tuple[Op, ReplySink | None]]:
        """The next step's ops, in order of arrival, up to MAX_OPS_PER_STEP ops and
        MAX_MESSAGES_PER_STEP messages (a large publish counts one chunk), leaving
        out the ops of connections whose staged publish is not answered yet, or
        that come after a publish large enough to be staged."""
        waiting = {sink for _, sink in self._later.values()}
        batch, kept, messages = [], [], 0
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
        return batch

    def _answer(self, batch: list[tuple[Op, ReplySink | None]], replies: list[p.Reply | None]) -> None:
        for (op, sink), reply in zip(batch, replies):
            if sink is None:
                continue
            req = request_of(op)
            if reply is not None:
                sink(reply)
            elif req is not None:  # staged: answered in a later step
                self._later[id(req)] = (req, sink)

    def _answer_later(self, finished: list[Answer]) -> None:
        for op, reply in finished:
            _, sink = self._later.pop(id(op), (op, None))
            if sink is not None:
                sink(reply)

    def _dispatch(self, deliveries: list[Delivery]) -> None:
        outlets: dict[str, Outlet | None] = {}
        for delivery in deliveries:
            if delivery.subscriber not in outlets:
                outlets[delivery.subscriber] = self._open.pop(delivery.subscriber, None)
            outlet = outlets[delivery.subscriber]
            if outlet is None:  # the connection went away while the step ran
                self.submit(Returned(delivery.subscriber, delivery.topic, delivery.msgs))
            else:
                outlet.push(delivery)


def _quiet(op: Op) -> bool:
    """Acks that nobody waits for: applying them a moment later changes nothing
    anyone can see but the counters (and they are at least once anyway)."""
    if isinstance(op, Written):
        return True
    op = request_of(op)
    return isinstance(op, p.Request) and op.id is UNSET and op.messages is None and op.command is None and op.acks is not None
