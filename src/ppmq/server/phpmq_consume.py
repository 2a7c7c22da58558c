"""PHPMQ consuming (PROTOCOL §9): one connection's 002, served as 003 dispatches.

A consume request (002) of N keeps up to N messages in flight to the connection:
a task takes them from the queue's PhpmqSubscriber through `TakeWaits`, exactly as a
ServerSocket connection's TAKE does, and writes each as a dispatch. An ack (004),
re-queue (005) or dead letter (006) of one of them frees its slot, and the task
takes again; a new 002 replaces the queue and N, and what is in flight still
counts until it leaves.

Refilling costs nothing while nothing is ready: the task's TAKE waits as long as
a TAKE may (`MAX_WAIT_S`), on the event loop, and is sent again only when that
wait runs out, when a slot frees while none was asked for, or when a new 002
interrupts it. The connection is the taker: when it closes, the task is
cancelled and `TakeWaits.gone` gives back what it took and was not acked, also
what was taken but never written.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable

import msgspec

from ppmq.protocol import messages as p
from ppmq.protocol import phpmq as wire
from ppmq.server.take_waits import TakeWaits, longest_take

log = logging.getLogger("ppmq.phpmq")

NS = 1_000_000_000


class _Taken(msgspec.Struct, rename="pascal"):
    """What a dispatch needs of a taken message (a push batch's message object)."""

    key: str
    payload: msgspec.Raw
    expires: dt.datetime | None = None


_taken = msgspec.json.Decoder(_Taken)


class Wanted(msgspec.Struct, frozen=True):
    """What the connection's last 002 asked for: up to `count` in flight, from
    `queue`, taken as its PhpmqSubscriber `subscriber`; dispatched with a TTL
    packet if `with_ttl` (the topic's PhpmqDispatchTTL, PROTOCOL §9)."""

    queue: str
    subscriber: str
    count: int
    with_ttl: bool


class Consumer:
    """One PHPMQ connection's consuming: a task that keeps what it Wanted in flight.

    `out` is the connection's writer: dispatches go there, and a TAKE the
    broker refuses (access, a subscriber a reload took away) closes it, which
    ends the connection as a refused frame does."""

    def __init__(self, takes: TakeWaits, out: asyncio.StreamWriter, check: Callable[[p.Request], None], where: str) -> None:
        self.takes = takes
        self.taker = takes.new_taker()
        self.out = out
        self.check = check
        self.where = where
        self._wanted: Wanted | None = None
        self._flight: set[tuple[str, str]] = set()  # (queue, ID) dispatched here and not settled
        self._task: asyncio.Task | None = None
        self._changed = asyncio.Event()  # room or N changed: the task looks again
        self._interrupt: asyncio.Future[bytes] | None = None  # ends the waiting TAKE

    def consume(self, wanted: Wanted) -> None:
        """A 002: from now on what it wants; what is in flight already stays and counts."""
        self._wanted = wanted
        self._look_again()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"{self.where} consuming")

    def settled(self, queue: str, message_id: str) -> None:
        """The connection acked, re-queued or dead-lettered a message: if it was
        dispatched here, its slot is free."""
        if (queue, message_id) in self._flight:
            self._flight.discard((queue, message_id))
            self._changed.set()

    async def close(self) -> None:
        """The connection is done: stop taking, and give back what it holds.
        Cancelling is safe at any point: a TAKE already sent is applied before
        the Abandoned sent after it, which gives its messages back too."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self.takes.gone(self.taker)

    def _look_again(self) -> None:
        """N or the queue changed: a waiting TAKE asks for the wrong count, so it ends."""
        self._changed.set()
        if self._interrupt is not None and not self._interrupt.done():
            self._interrupt.set_result(b"")

    async def _run(self) -> None:
        """Take while there is room, until the broker stops, the peer is gone or
        the broker refuses a TAKE."""
        try:
            while not self.takes.stopped:
                self._changed.clear()
                wanted = self._wanted
                assert wanted is not None, "started by consume()"
                room = wanted.count - len(self._flight)
                if room <= 0:
                    await self._changed.wait()
                    continue
                reply = await self._take(wanted, room)
                if reply.status != 200:
                    log.warning("%s: PHPMQ consume refused (%d): %s; closing the connection", self.where, reply.status, reply.error)
                    self.out.close()
                    return
                await self._dispatch(wanted, reply.body["Messages"])
        except (ConnectionError, OSError) as exc:
            log.debug("%s: connection error while dispatching: %s", self.where, exc)

    async def _take(self, wanted: Wanted, room: int) -> p.Reply:
        """A TAKE of what there is room for, waiting for it as long as a TAKE
        may, unless a new 002 ends the wait first."""
        self._interrupt = asyncio.get_running_loop().create_future()
        request = longest_take(wanted.queue, wanted.subscriber, room)
        return await self.takes.take(self.taker, request, self.check, self._interrupt)

    async def _dispatch(self, wanted: Wanted, messages: list[msgspec.Raw]) -> None:
        """Each taken message as a 003, now in this connection's flight."""
        now_ns = time.time_ns()
        for raw in messages:
            message = _taken.decode(raw)
            self._flight.add((wanted.queue, message.key))
            ttl_s = _ttl_s(message.expires, now_ns) if wanted.with_ttl else None
            self.out.write(wire.encode_dispatch(wanted.queue, _content(message.payload), message.key, ttl_s))
        await self.out.drain()


def _content(payload: msgspec.Raw) -> bytes:
    """A Payload that is a JSON string is the content; any other JSON, its text."""
    try:
        return msgspec.json.decode(payload, type=str).encode()
    except msgspec.ValidationError:
        return bytes(payload)


def _ttl_s(expires: dt.datetime | None, now_ns: int) -> int:
    """PROTOCOL §9: the whole seconds left until Expires, rounded down; 0 when
    the message has none (or less than a second is left)."""
    if expires is None:
        return 0
    return max(0, (p.expires_ns(expires) - now_ns) // NS)
