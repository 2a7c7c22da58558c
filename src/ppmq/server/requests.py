"""A connection's requests: framed as they arrive, handed to the writer in order (PROTOCOL §1, §4).

The read callback of a `Connection` frames what arrives and hands each request
to the writer at once while the connection has room for it (`ReplyChannel`).
Whatever has to wait goes to the connection's task instead (`Requests.serve`),
and reading pauses until the task is done with it: a request over the
connection's budget, a TAKE, the server stopping, a frame too large or cut off
for too long, the end of the stream. So a connection that floods requests
without reading its replies is no longer read.

Framing in the callback spares the event loop a task wake-up for every read:
three a message at a paced rate, a publish and two acks (docs/performance.md,
"Design choices measured").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol, TypeAlias

from msgspec import UNSET

from ppmq.core.ops import Guarded, Invalid, Op
from ppmq.errors import BadRequest, ReadTimeout, ShuttingDown
from ppmq.protocol import messages as p
from ppmq.protocol.framing import Framer
from ppmq.server.connection import Connection, ReplyChannel
from ppmq.server.group_commit import ReplySink
from ppmq.server.take_waits import TakeWaits

log = logging.getLogger("ppmq.connection")

Decoded: TypeAlias = p.Request | Guarded | Invalid  # what a frame becomes


class Shutdown:
    """Whether the server is stopping: begun once, by its listener, and read by
    its connections for every request, as a plain attribute that costs no call."""

    def __init__(self) -> None:
        self.begun = False


class Writer(Protocol):
    """Where a connection's requests go, each with the sink for its reply: the
    writer (GroupCommit), or what stands in for it on one lane of a subscriber
    with Connections > 1 (parallel_push.py)."""

    def submit(self, op: Op, sink: ReplySink | None = None) -> None: ...


class Requests:
    """A connection's frames, decoded and handed to the writer in the order they came.

    The read callback (`feed`) hands each request over itself while nothing
    waits; the first one that must wait, and every one after it, is held for
    the task (`serve`), and reading pauses until the task has handed them over.
    A frame must arrive whole within `read_timeout_s` of its first byte (0: no
    limit), not counting time the connection was not read, so a peer stalled in
    the middle of one is answered 408 and closed while an idle one between
    frames may wait for ever. `authorize` raises Forbidden for a request the
    peer may not make; it runs when the request is applied, under the access
    rules of that moment. With `takes`, the connection is a taker: its TAKEs go
    through it, and so does its closing.
    """

    def __init__(
        self,
        conn: Connection,
        channel: ReplyChannel,
        writer: Writer,
        max_frame_bytes: int,
        shutdown: Shutdown | None = None,
        read_timeout_s: float = 0.0,
        authorize: Callable[[p.Request], None] | None = None,
        takes: TakeWaits | None = None,
    ) -> None:
        self.conn = conn
        self.channel = channel
        self.writer = writer
        self.framer = Framer(max_frame_bytes)
        self.shutdown = shutdown if shutdown is not None else Shutdown()  # none but the listener's begins
        self.read_timeout_s = read_timeout_s
        self.authorize = authorize
        self.takes = takes
        self.taker = takes.new_taker() if takes is not None else 0
        self._held: deque[tuple[bytes, Decoded | None]] = deque()  # frames for the task, in order (decoded or not yet)
        self._busy = False  # the task hands frames over: later ones queue behind them
        self._ended: tuple[BaseException | None] | None = None  # EOF (None), or the error the connection ended with
        self._timed_out = False
        self._frame_started: float | None = None  # monotonic time the partial frame buffered began
        self._timer: asyncio.TimerHandle | None = None
        self._wake: asyncio.Future[None] | None = None  # the task waits on it
        self._next_read: asyncio.Future[bytes] | None = None  # a waiting TAKE's watch on the peer

    # --- the read callback's side ----------------------------------------------------
    def feed(self, data: bytes) -> None:
        """What one read brought. The usual read is one request whole on a line of
        its own, as a client that waits for each reply sends it: it is decoded as
        it is, the frame the framer would cut from it. Any other read (part of a
        frame, several, or a line that is not one valid request, which may be
        several values) goes through the framer.

        Each request is handed to the writer at once, counted as outstanding,
        unless it waits for the task: a TAKE, one that must go alone
        (`_answers_with_state`) while others are outstanding, one the connection
        has no room for, any while the server is stopping, and all after it."""
        framer = self.framer
        op: Decoded | None = None  # the first frame's, when the read was decoded as it is
        if (
            not framer.buffer
            and framer.too_large is None
            and data[-2:] == b"}\n"
            and data[:1] == b"{"
            and type(data) is bytes
            and b"\n" not in (line := data[:-1])
            and (size := len(line)) <= framer.max_frame_bytes
        ):
            try:
                request = p.decode_request(data)
            except BadRequest:
                pass  # the framer's to cut, and decode_request's to name what is wrong
            else:
                op = request if self.authorize is None else Guarded(request, self.authorize)
        if op is not None:
            frames = [line]
        else:
            frames = framer.feed(data)
            if self.read_timeout_s and (framer.buffer or self._frame_started is not None or self._timer is not None):
                self._note_partial(bool(frames))
        if self._next_read is not None and not self._next_read.done():
            self._next_read.set_result(data)
        if self._busy or self._held:
            self._hold(frames, 0, op)
            return
        for i, frame in enumerate(frames):
            if op is None:
                op, size = _decode(frame, self.authorize), len(frame)
            req = op.request if type(op) is Guarded else op
            if self.shutdown.begun:
                sink = None
            elif type(req) is not p.Request or req.command is None:  # the usual request: no command
                sink = self.channel.admit_now(size, False)
            elif self.takes is not None and _take_of(op) is not None:
                sink = None
            else:
                sink = self.channel.admit_now(size, _answers_with_state(op))
            if sink is None:
                self._hold(frames, i, op)
                return
            self.writer.submit(op, sink)
            op = None
        if framer.too_large is not None:  # nothing after it is read
            self._pause()
            self._wake_task()

    def _hold(self, frames: list[bytes], first: int, op: Decoded | None) -> None:
        """frames[first:] wait for the task (the first one decoded as `op`); the
        socket is not read meanwhile, so a peer that does not read is not read."""
        if first >= len(frames):
            return
        self._held.append((frames[first], op))
        self._held.extend((frame, None) for frame in frames[first + 1 :])
        self._pause()
        self._wake_task()

    def end(self, exc: BaseException | None) -> None:
        """The peer closed its side (None), or the connection broke (exc)."""
        if self._ended is None:
            self._ended = (exc,)
        if self._next_read is not None and not self._next_read.done():
            self._next_read.set_result(b"")
        self._wake_task()

    # --- the read timeout ------------------------------------------------------------
    def _note_partial(self, completed: bool) -> None:
        """Time a partial frame from its first byte: after a read that left none,
        none; after one that completed frames and left a new one begun, anew."""
        if not self.framer.pending:
            self._frame_started = None
            self._disarm()
        elif self._frame_started is None or completed:
            self._frame_started = time.monotonic()
            self._arm()

    def _arm(self) -> None:
        self._disarm()
        if self._frame_started is not None and not self._busy and not self._held:
            deadline = self._frame_started + self.read_timeout_s
            self._timer = asyncio.get_running_loop().call_later(max(0.0, deadline - time.monotonic()), self._time_out)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _time_out(self) -> None:
        self._timer = None
        self._timed_out = True
        self._wake_task()

    # --- the task's side ----------------------------------------------------------------
    async def serve(self) -> None:
        """Hand over what the read callback held, until the stream ends or must be closed."""
        peer, channel = self.channel.peer, self.channel
        try:
            self.conn.listen(self)
            if not self._held:
                self._resume()
            while True:
                if self._held:
                    if not await self._hand_over_held():
                        return
                elif self.framer.too_large is not None:
                    await channel.settled()
                    channel.send(p.error_reply(self.framer.too_large))
                    log.warning("%s: %s; closing the connection", peer, self.framer.too_large)
                    return
                elif self._timed_out:
                    await channel.settled()
                    channel.send(p.error_reply(ReadTimeout(f"frame not complete within ReadTimeout ({self.read_timeout_s:g}s)")))
                    log.warning("%s: stalled in the middle of a frame for %gs; closing the connection", peer, self.read_timeout_s)
                    return
                elif self._ended is not None:
                    if self._ended[0] is not None:
                        log.debug("%s: connection error: %s", peer, self._ended[0])
                        return
                    if self.framer.pending:
                        log.info("%s: closed in the middle of a frame; the partial frame is dropped", peer)
                    await channel.settled()
                    return
                else:
                    await self._sleep()
        except (ConnectionError, OSError) as exc:
            log.debug("%s: connection error: %s", peer, exc)
        finally:
            self._disarm()
            if self.takes is not None:
                self.takes.gone(self.taker)
            self.conn.close()

    async def _hand_over_held(self) -> bool:
        """Each held frame once the connection has room for it; a TAKE answered
        before the next. False if the server began stopping: the rest were turned away."""
        paused_at = time.monotonic()
        self._busy = True
        try:
            while self._held:
                frame, op = self._held.popleft()
                if op is None:
                    op = _decode(frame, self.authorize)
                if not self.shutdown.begun:
                    await self.channel.admit(len(frame), _answers_with_state(op))
                if self.shutdown.begun:  # the writer takes nothing new
                    await _turn_away([frame, *(f for f, _ in self._held)], self.channel)
                    self._held.clear()
                    return False
                sink = self.channel.expect(len(frame))
                if self.takes is not None and (take := _take_of(op)) is not None:
                    sink(await self.takes.take(self.taker, *take, self._watch_peer()))
                else:
                    self.writer.submit(op, sink)
        finally:
            self._busy = False
            self._next_read = None
        if self._frame_started is not None:  # time we did not read is not the peer's stall
            self._frame_started += time.monotonic() - paused_at
            self._arm()
        self._resume()
        return True

    def _watch_peer(self) -> asyncio.Future[bytes]:
        """While a TAKE waits, read on: the future ends with b"" as soon as the
        peer goes away (and what it took goes back); what it sends meanwhile
        waits behind the TAKE."""
        self._next_read = watch = asyncio.get_running_loop().create_future()
        if self._ended is not None:
            watch.set_result(b"")
        elif not self._held:
            self._resume()
        return watch

    async def _sleep(self) -> None:
        self._wake = asyncio.get_running_loop().create_future()
        try:
            await self._wake
        finally:
            self._wake = None

    def _wake_task(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _pause(self) -> None:
        self._disarm()
        if not self.conn.is_closing():
            self.conn.transport.pause_reading()

    def _resume(self) -> None:
        """Read again, unless there is nothing more to read: the stream ended or
        cannot go on (a frame too large)."""
        if self._ended is None and self.framer.too_large is None and not self.conn.is_closing():
            self.conn.transport.resume_reading()


def _take_of(op: Decoded) -> tuple[p.Request, Callable[[p.Request], None] | None] | None:
    """A TAKE request and its access check; None for any other op."""
    request, check = (op.request, op.check) if isinstance(op, Guarded) else (op, None)
    if isinstance(request, p.Request) and (request.command or "").upper() == "TAKE":
        return request, check
    return None


async def _turn_away(frames: list[bytes], channel: ReplyChannel) -> None:
    """Answer 503 to every frame with an Id, after the replies of those before."""
    await channel.settled()
    for frame in frames:
        request_id = p.find_request_id(frame)
        if request_id is not UNSET:
            channel.send(p.error_reply(ShuttingDown("shutting down"), request_id))


def _decode(frame: bytes, authorize: Callable[[p.Request], None] | None) -> Decoded:
    """The op for a frame; its access check goes with it, to run when it is applied."""
    try:
        request = p.decode_request(frame)
    except BadRequest as exc:
        return Invalid(exc, getattr(exc, "request_id", UNSET))
    return Guarded(request, authorize) if authorize is not None else request


def _answers_with_state(op: Decoded) -> bool:
    """A command's reply (STATUS's Body grows with the topics and subscribers) is
    not bounded by its request's size, as every other reply is; such requests are
    taken one at a time, so a connection holds at most one such reply unsent."""
    if isinstance(op, Guarded):
        op = op.request
    return isinstance(op, p.Request) and op.command is not None and op.id is not UNSET
