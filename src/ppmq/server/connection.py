"""A connection as the broker sees it: bytes in, replies out in order, with flow control (PROTOCOL §1, §4).

Every connection, on ServerSocket or a subscriber's delivery connection, is a
`Connection`, an asyncio.Protocol: what arrives goes to its `Requests`
(server/requests.py), straight from the loop's read callback, and the replies go out
through its `ReplyChannel` in the order the requests arrived. The channel also
keeps the budget that bounds what a connection may have waiting, so that what
a client sends cannot grow the broker's memory without bound.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from msgspec import UNSET

from ppmq.protocol import messages as p
from ppmq.server.group_commit import ReplySink
from ppmq.server.waiters import Waiters


class Requests(Protocol):
    """What a connection hands its bytes to (requests.Requests): it frames and
    queues them; `end` says the peer is gone, with the error if one ended it."""

    def feed(self, data: bytes) -> None: ...

    def end(self, exc: BaseException | None) -> None: ...


log = logging.getLogger("ppmq.connection")

# A connection's requests waiting for their commit, by count and by frame bytes;
# a frame larger than MAX_OUTSTANDING_BYTES is taken alone. 1 MiB is several
# batches of 100 messages of 1 KiB (110 KB each), so a pipelining producer still
# fills every commit; the count bounds what each request costs beyond its bytes
# (a thousand tiny acks are few bytes but many objects).
MAX_OUTSTANDING_REQUESTS = 1000
MAX_OUTSTANDING_BYTES = 1 << 20
# Replies written but not yet taken by the peer, above which its next request
# waits (asyncio's own default): a peer that reads keeps it near empty, and a
# larger buffer would only hold more for one that does not.
MAX_UNSENT_BYTES = 1 << 16


class Connection(asyncio.Protocol):
    """A socket as the broker sees it: what arrives goes to its `Requests`, and
    what it writes has flow control (`drain`), as a StreamWriter's has."""

    def __init__(self, on_connect: Callable[[Connection], Coroutine[Any, Any, None]] | None = None) -> None:
        """`on_connect` runs as the connection's task once it is made (a server's
        connections; a connection the broker makes is served by its caller)."""
        self._on_connect = on_connect
        self._task: asyncio.Task[None] | None = None
        self._requests: Requests | None = None
        self._early: list[bytes] = []  # arrived before a Requests listened
        self._early_end: tuple[BaseException | None] | None = None
        self._lost = False
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        # The transport, and its own methods bound, once it is made (connection_made)
        self.transport: asyncio.Transport
        self.write: Callable[[bytes], None]
        self.is_closing: Callable[[], bool]
        self.unsent: Callable[[], int]

    # --- asyncio's callbacks ------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        # The transport's own methods, bound: called for every request, reply and
        # batch, they cost no call of ours on the way.
        self.write = transport.write  # type: ignore[attr-defined]
        self.is_closing = transport.is_closing
        self.unsent = transport.get_write_buffer_size  # type: ignore[attr-defined]  # bytes not yet taken by the kernel
        if self._on_connect is not None:  # kept: the loop holds its tasks only weakly
            self._task = asyncio.get_running_loop().create_task(self._on_connect(self))

    def data_received(self, data: bytes) -> None:
        if self._requests is None:  # kept for it, and nothing more read until it listens
            self._early.append(data)
            self.transport.pause_reading()
        else:
            self._requests.feed(data)

    def eof_received(self) -> bool:
        self._end(None)
        return True  # the replies still owed go out; the task closes once they have

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._end(exc)
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_exception(ConnectionResetError("Connection lost") if exc is None else exc)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)

    # --- the broker's side ------------------------------------------------------------
    def listen(self, requests: Requests) -> None:
        """From now on what arrives goes to `requests`, beginning with what came
        already: the transport hands each read to `requests.feed` itself (it
        keeps the protocol's data_received bound when the protocol is set, and
        looks it up again when it is set again), one call fewer every read."""
        self._requests = requests
        for data in self._early:
            requests.feed(data)
        self._early.clear()
        if self._early_end is not None:
            requests.end(*self._early_end)
        self.data_received = requests.feed  # type: ignore[method-assign]
        if not self.transport.is_closing():
            self.transport.set_protocol(self)

    def _end(self, exc: BaseException | None) -> None:
        if self._requests is None:
            self._early_end = (exc,)
        else:
            self._requests.end(exc)

    def get_extra_info(self, name: str) -> Any:
        return self.transport.get_extra_info(name)

    def flush_before_drain(self) -> None:
        """Make `drain()` return only once every byte written is the kernel's.

        asyncio has no call that waits for that. With the high-water mark at 0
        (and so the low one too), the transport calls pause_writing as soon as
        write() leaves any byte in its buffer (_maybe_pause_protocol: size >
        high) and resume_writing only when a send empties it
        (_maybe_resume_protocol: size <= low), and drain() waits exactly while
        paused. So do both loops the broker may run on: uvloop's transports
        (basetransport.pyx, the same two rules, with libuv's write queue counted
        in the size) and asyncio's selector transport, as checked in CPython
        3.11 to 3.13 (transports.py, selector_events.py). A write the kernel
        takes at once never pauses, so a peer that keeps up costs no extra wait.
        The one way drain() returns with bytes unsent is transport.abort(),
        never used here: errors close the transport with the error, and close()
        flushes first.
        """
        self.transport.set_write_buffer_limits(high=0)

    async def drain(self) -> None:
        """Wait until writing may go on (see `flush_before_drain`); raises
        ConnectionResetError once the connection is lost."""
        if self._lost:
            raise ConnectionResetError("Connection lost")
        if not self._write_paused:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        try:
            await waiter
        finally:
            self._drain_waiters.remove(waiter)

    def close(self) -> None:
        self.transport.close()


class ReplyChannel:
    """Replies of one connection, and the budget that bounds what it may hold.

    A request is handed to the writer only while the connection has room for
    it (`admit_now`, `admit`): at most MAX_OUTSTANDING_REQUESTS and MAX_OUTSTANDING_BYTES
    waiting for their commit, and no more than MAX_UNSENT_BYTES of replies
    unsent in the transport. A peer that does not read its replies is therefore
    no longer read either: it slows only itself, and none of its replies is
    dropped.
    """

    def __init__(self, out: Connection, peer: str) -> None:
        self.out = out
        self.peer = peer
        self.outstanding = 0
        self.outstanding_bytes = 0  # frame bytes of the requests waiting for their commit
        # The frame bytes of each of them, for its reply to take off again: the newest
        # one's, and the older ones' oldest first, which stay empty while a
        # client waits for each reply before its next request.
        self._newest_bytes = 0
        self._older_bytes: deque[int] = deque()
        self._replied = Waiters()  # woken by every reply: admit and settled look again
        self._last_log = 0.0
        self._unlogged = 0

    def admit_now(self, frame_bytes: int, alone: bool) -> ReplySink | None:
        """If a request of `frame_bytes` fits now, count it (`expect`) and return
        where its reply goes; None if it must wait (`admit`). One that must go
        `alone` (see `_answers_with_state`) fits only once every earlier one is answered."""
        outstanding = self.outstanding
        if outstanding and not self._fits(frame_bytes, alone):  # none outstanding: it fits, the usual
            return None
        if self.out.unsent() > MAX_UNSENT_BYTES:
            return None
        if outstanding:
            self._older_bytes.append(self._newest_bytes)
        self._newest_bytes = frame_bytes
        self.outstanding = outstanding + 1
        self.outstanding_bytes += frame_bytes
        return self._reply

    async def admit(self, frame_bytes: int, alone: bool) -> None:
        """Wait until a request of `frame_bytes` fits; then `expect` counts it."""
        while self.outstanding and not self._fits(frame_bytes, alone):
            await self._replied.wait()
        # Not drain() alone: a delivery connection drains only when its buffer is
        # empty (see delivery), and its acks must not wait for a batch in transit.
        while self.out.unsent() > MAX_UNSENT_BYTES:
            await self.out.drain()

    def _fits(self, frame_bytes: int, alone: bool) -> bool:
        """Beside requests outstanding: one that goes alone does not fit, another within the budget does."""
        if alone:
            return False
        return self.outstanding < MAX_OUTSTANDING_REQUESTS and self.outstanding_bytes + frame_bytes <= MAX_OUTSTANDING_BYTES

    def expect(self, frame_bytes: int) -> ReplySink:
        """Count a request handed to the writer; returns where its reply goes: one
        sink for every request of the connection, which is how the writer tells a
        connection's requests apart (and keeps them, and their replies, in order)."""
        if self.outstanding:
            self._older_bytes.append(self._newest_bytes)
        self._newest_bytes = frame_bytes
        self.outstanding += 1
        self.outstanding_bytes += frame_bytes
        return self._reply

    def _reply(self, reply: p.Reply) -> None:
        self.outstanding -= 1
        if self.outstanding:  # replies come in the order of the requests: this one is the oldest
            self.outstanding_bytes -= self._older_bytes.popleft()
        else:
            self.outstanding_bytes = 0
        if self._replied.futures:
            self._replied.wake()
        if reply.id is not UNSET:
            if not self.out.is_closing():  # as send() does
                self.out.write(p.encode_reply(reply))
        elif reply.status != 200:
            self._log_one_way_error(reply)

    def send(self, reply: p.Reply) -> None:
        if not self.out.is_closing():
            self.out.write(p.encode_reply(reply))

    async def settled(self) -> None:
        """Wait until every request of this connection has had its reply."""
        while self.outstanding:
            await self._replied.wait()

    def _log_one_way_error(self, reply: p.Reply) -> None:
        """ppMQ's one-way mode has nobody to tell: log, at most once a second per connection."""
        now = time.monotonic()
        if now - self._last_log < 1.0:
            self._unlogged += 1
            return
        more = f" (and {self._unlogged} more)" if self._unlogged else ""
        log.warning("%s: request without Id rejected (%d): %s%s", self.peer, reply.status, reply.error, more)
        self._last_log, self._unlogged = now, 0
