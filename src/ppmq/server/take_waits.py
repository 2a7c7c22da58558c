"""TAKE on the event loop (PROTOCOL §9): waiting for messages costs the writer nothing.

A TAKE goes to the writer as a `Take` op, and the step that applies it answers
with what can be taken now, possibly nothing. One that got nothing and may wait
(`Wait` > 0) waits here, on the event loop: a future and a timer, no step. While
any TAKE waits, this follows the writer's steps (`GroupCommit.follow`): after
every step the waiting TAKEs of each subscription are looked at, and as many as the messages now takeable can serve are sent again,
oldest first (a step that published to the topic, acked, nacked or gave back is
what makes messages takeable). One that again finds nothing, because a
competing worker was faster, waits again until its Wait runs out. A step that
publishes to the topic does not wait for that: the waiting TAKEs its messages
could serve join it, are applied after the publish, and
are answered with its commit, one step and one fsync instead of two.

A taker is one connection of a listener, numbered by `new_taker`, so that every
listener that takes on behalf of its connections (ServerSocket, and any other
protocol's) can share this and the broker's record of who holds what. When a
connection closes, `gone` sends its `Abandoned` op: what it took and did not
ack goes back to ready at once.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from functools import partial

import msgspec

from ppmq.core import staging
from ppmq.core.ops import Abandoned, Op, Take, request_of
from ppmq.core.pull import MAX_COUNT, MAX_WAIT_S
from ppmq.core.taker_holdings import Key
from ppmq.protocol import messages as p
from ppmq.server.group_commit import GroupCommit


class _Waiter:
    """One TAKE waiting for messages: resolved True when woken, False when it
    should give up (its Wait passed, its taker went away, the broker stops).
    Woken by joining a step (`joined`), its reply comes from that step; else
    it sends `again` to the writer."""

    __slots__ = ("taker", "count", "future", "woken", "again", "joined")

    def __init__(self, taker: int, count: int, future: asyncio.Future[bool], again: Take) -> None:
        self.taker = taker
        self.count = count  # messages it asks for
        self.future = future
        self.woken = False
        self.again = again
        self.joined: asyncio.Future[p.Reply] | None = None


class TakeWaits:
    """The TAKEs of every connection: sent to the writer, waiting, woken."""

    def __init__(self, writer: GroupCommit) -> None:
        self._writer = writer
        self._ids = itertools.count(1)
        self._waiting: dict[Key, dict[_Waiter, None]] = {}  # per subscription, oldest first
        self._woken: dict[Key, int] = {}  # messages asked for by woken TAKEs not answered yet
        self._took: set[int] = set()  # takers that sent a TAKE: Abandoned when they go
        self._stopped = False

    def new_taker(self) -> int:
        return next(self._ids)

    @property
    def stopped(self) -> bool:
        """The broker stops: a TAKE no longer waits, so a taker that keeps
        taking (PHPMQ's consumers) must stop, or it would spin."""
        return self._stopped

    async def take(
        self, taker: int, request: p.Request, check: Callable[[p.Request], None] | None = None, closed: asyncio.Future[bytes] | None = None
    ) -> p.Reply:
        """The reply to a TAKE: at once when it gets messages or may not wait;
        else when messages came for it, its Wait ran out, the broker stops, or
        `closed` (the connection's next read) says that the peer went away."""
        self._took.add(taker)
        reply = await self._writer.call(Take(taker, request, check))
        if not _empty(reply) or not request.wait:
            return reply
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.wait
        # Sent again without what the first one carried besides the TAKE (Acks...): that is applied.
        again = Take(
            taker, p.Request(topic=request.topic, subscriber=request.subscriber, count=request.count, command="TAKE", id=request.id), check
        )
        topic, sub = request.topic, request.subscriber
        assert topic is not None and sub is not None, "a TAKE answered 200 names both (core/pull.py)"
        key = (topic, sub)
        while (left_s := deadline - loop.time()) > 0:
            waiter = _Waiter(taker, request.count or 1, loop.create_future(), again)
            try:
                if not await self._wait(key, waiter, left_s, closed):
                    break
                later = await (waiter.joined if waiter.joined is not None else self._writer.call(again))
            finally:
                self._answered(key, waiter)
            if not _empty(later):
                return msgspec.structs.replace(later, accepted=reply.accepted)
        return reply

    def gone(self, taker: int) -> None:
        """The taker's connection closed: what it holds goes back to ready."""
        if taker in self._took:
            self._took.discard(taker)
            self._writer.submit(Abandoned(taker))

    def stop(self) -> None:
        """The broker stops: every waiting TAKE is answered now, with nothing."""
        self._stopped = True
        for waiters in list(self._waiting.values()):
            for waiter in list(waiters):
                _resolve(waiter.future, False)

    def complete_status(self, body: dict) -> None:
        """PROTOCOL §9: each Pull subscriber's STATUS entry gains `Takers` (the
        takers holding its messages or waiting in a TAKE) and `WaitingTakes`;
        it is `Connected` while it has a taker (PROTOCOL §10).
        Runs on the writer thread, in the STATUS step, so the broker's record
        is the step's; what the event loop changes meanwhile is copied first
        (a dict copy is one call that no other thread interrupts)."""
        broker = self._writer.broker
        waiting = {key: [w.taker for w in dict(ws)] for key, ws in dict(self._waiting).items()}
        for topic, entry in body["Topics"].items():
            for name, sub in entry["Subscribers"].items():
                if broker.sub_configs[name].pull:
                    takers = waiting.get((topic, name), [])
                    sub["Takers"] = len(broker.holders(topic, name).union(takers))
                    sub["WaitingTakes"] = len(takers)
                    sub["Connected"] = sub["Takers"] > 0

    async def _wait(self, key: Key, waiter: _Waiter, timeout_s: float, closed: asyncio.Future[bytes] | None) -> bool:
        """Whether the waiter was woken, rather than given up."""
        if self._stopped:
            return False
        loop = asyncio.get_running_loop()
        if not self._waiting:  # the first TAKE waiting: steps concern us
            self._writer.follow(self)
        self._waiting.setdefault(key, {})[waiter] = None
        timer = loop.call_later(timeout_s, _resolve, waiter.future, False)
        on_read = partial(_on_read, waiter.future)
        if closed is not None:
            closed.add_done_callback(on_read)
        self._wake(key)  # a step may have ended between the first reply and now
        try:
            return await waiter.future
        finally:
            timer.cancel()
            if closed is not None:
                closed.remove_done_callback(on_read)
            waiters = self._waiting.get(key)
            if waiters is not None:
                waiters.pop(waiter, None)
                if not waiters:
                    del self._waiting[key]
                    if not self._waiting:  # the last TAKE waiting: steps no longer concern us
                        self._writer.unfollow(self)

    def stepped(self) -> None:
        """After a step: wake the waiting TAKEs that what it left takeable can serve."""
        for key in list(self._waiting):
            self._wake(key)

    def _wake(self, key: Key) -> None:
        """Wake the oldest waiters of a subscription, as many as the messages it
        has takeable now could serve, less what woken ones will take already."""
        waiters = self._waiting.get(key)
        if not waiters:
            return
        self._woken_oldest(key, self._writer.broker.takeable(*key) - self._woken.get(key, 0))

    def _woken_oldest(self, key: Key, room: int, joined: bool = False) -> list[_Waiter]:
        """Wake the oldest waiters of a subscription while `room` messages are
        left for them, each taking its Count of them; the ones woken. `joined`:
        to wait for the reply of the step they join rather than send again."""
        waiters = self._waiting.get(key, {})
        woken = []
        for waiter in list(waiters):
            if room <= 0:
                break
            del waiters[waiter]
            waiter.woken = True
            self._woken[key] = self._woken.get(key, 0) + waiter.count
            room -= waiter.count
            if joined:
                waiter.joined = waiter.future.get_loop().create_future()
            _resolve(waiter.future, True)
            woken.append(waiter)
        return woken

    def join(self, ops: list[Op]) -> list[tuple[Op, Callable[[p.Reply], None]]]:
        """The waiting TAKEs that join a step publishing to their topic, oldest
        first, as many as the messages published and their Window's room could
        serve (less what woken ones will take already): taken after the
        publish, in its step, with its commit, instead of in a step of their
        own after it. One that gets nothing (a competing TAKE, or a dedupe
        replacement, took the place) waits again, as a woken one would."""
        if not self._waiting:
            return []
        published: dict[str, int] = {}
        for op in ops:
            req = request_of(op)
            if req is not None and req.messages and req.topic is not None and len(req.messages) <= staging.CHUNK_MESSAGES:
                published[req.topic] = published.get(req.topic, 0) + len(req.messages)
        joining: list[tuple[Op, Callable[[p.Reply], None]]] = []
        for key in [key for key in self._waiting if key[0] in published]:
            room = min(published[key[0]], self._writer.broker.take_room(*key)) - self._woken.get(key, 0)
            for waiter in self._woken_oldest(key, room, joined=True):
                joining.append((waiter.again, partial(self._joined_reply, key, waiter)))
        return joining

    def _joined_reply(self, key: Key, waiter: _Waiter, reply: p.Reply) -> None:
        """A joined TAKE's reply, given to it right after its step: its messages
        no longer count as spoken for when the step's waiters are woken."""
        self._answered(key, waiter)
        if waiter.joined is not None and not waiter.joined.done():
            waiter.joined.set_result(reply)

    def _answered(self, key: Key, waiter: _Waiter) -> None:
        """A woken waiter's TAKE has its reply (or never will): its messages no
        longer count as spoken for."""
        if waiter.woken:
            waiter.woken = False
            left = self._woken[key] - waiter.count
            if left:
                self._woken[key] = left
            else:
                del self._woken[key]


def _empty(reply: p.Reply) -> bool:
    """A TAKE answered with no messages, which may wait for some."""
    return reply.status == 200 and not reply.body["Messages"]


def _on_read(future: asyncio.Future[bool], read: asyncio.Future[bytes]) -> None:
    """The connection's next read ended: EOF or an error means the peer went away."""
    if read.cancelled() or read.exception() is not None or not read.result():
        _resolve(future, False)


def _resolve(future: asyncio.Future[bool], result: bool) -> None:
    if not future.done():
        future.set_result(result)


_TAKE_ID = msgspec.Raw(b"0")  # TAKE needs an Id for its reply to carry messages; nobody else sees it


def longest_take(topic: str, subscriber: str, count: int) -> p.Request:
    """The TAKE a connection of another protocol (PHPMQ, zbus) makes for its
    client: up to `count` messages, as many as a TAKE may ask for, waiting as
    long as a TAKE may."""
    return p.Request(topic=topic, subscriber=subscriber, command="TAKE", count=min(count, MAX_COUNT), wait=MAX_WAIT_S, id=_TAKE_ID)
