"""The server socket: connections in, frames to requests, replies out (PROTOCOL §1, §4).

Every connection, on ServerSocket or a subscriber's delivery connection, is read
by `serve_requests`: frames are decoded and queued for the writer, and the
replies come back through a `ReplyChannel` in the order the requests arrived.
A connection that floods requests without reading replies is paused, so what a
client sends cannot grow the broker's memory without bound.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from msgspec import UNSET

from . import protocol as p
from . import sockets
from .access import Peer, Policy
from .framing import Framer
from .ops import Guarded, Invalid
from .takes import Takes
from .writer import ReplySink, Writer

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 16
LISTEN_BACKLOG = 1024
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
FD_RESERVE = 64  # descriptors kept for the store, subscribers and logs when MaxConnections is 0


class ReplyChannel:
    """Replies of one connection, and the budget that bounds what it may hold.

    A request is taken from the socket only while the connection has room for
    it (`admit`): at most MAX_OUTSTANDING_REQUESTS and MAX_OUTSTANDING_BYTES
    waiting for their commit, and no more than MAX_UNSENT_BYTES of replies
    unsent in the transport. A peer that does not read its replies is therefore
    no longer read either: it slows only itself, and none of its replies is
    dropped.
    """

    def __init__(self, out: asyncio.StreamWriter, peer: str) -> None:
        self.out = out
        self.peer = peer
        self.outstanding = 0
        self.outstanding_bytes = 0  # frame bytes of the requests waiting for their commit
        self._frame_bytes: deque[int] = deque()  # of each of them, oldest first
        self._answered = asyncio.Event()  # set by every reply: admit looks again
        self._idle = asyncio.Event()
        self._idle.set()
        self._last_log = 0.0
        self._unlogged = 0

    async def admit(self, frame_bytes: int, alone: bool) -> None:
        """Wait until a request of `frame_bytes` fits; one that must wait `alone`
        (see `_answers_with_state`) waits for every earlier one to be answered."""
        while not self._fits(frame_bytes, alone):
            self._answered.clear()
            await self._answered.wait()
        # Not drain() alone: a delivery connection drains only when its buffer is
        # empty (see delivery), and its acks must not wait for a batch in transit.
        while self.out.transport.get_write_buffer_size() > MAX_UNSENT_BYTES:
            await self.out.drain()

    def _fits(self, frame_bytes: int, alone: bool) -> bool:
        if not self.outstanding:
            return True
        if alone:
            return False
        return self.outstanding < MAX_OUTSTANDING_REQUESTS and self.outstanding_bytes + frame_bytes <= MAX_OUTSTANDING_BYTES

    def expect(self, frame_bytes: int) -> ReplySink:
        """Count a request handed to the writer; returns where its reply goes: one
        sink for every request of the connection, which is how the writer tells a
        connection's requests apart (and keeps them, and their replies, in order)."""
        self.outstanding += 1
        self.outstanding_bytes += frame_bytes
        self._frame_bytes.append(frame_bytes)
        self._idle.clear()
        return self._reply

    def _reply(self, reply: p.Reply) -> None:
        self.outstanding -= 1
        self.outstanding_bytes -= self._frame_bytes.popleft()  # replies come in the order of the requests
        self._answered.set()
        if not self.outstanding:
            self._idle.set()
        if reply.id is not UNSET:
            self.send(reply)
        elif reply.status != 200:
            self._log_one_way_error(reply)

    def send(self, reply: p.Reply) -> None:
        if not self.out.is_closing():
            self.out.write(p.encode_reply(reply))

    async def settled(self) -> None:
        """Wait until every request of this connection has had its reply."""
        await self._idle.wait()

    def _log_one_way_error(self, reply: p.Reply) -> None:
        """ppMQ's one-way mode has nobody to tell: log, at most once a second per connection."""
        now = time.monotonic()
        if now - self._last_log < 1.0:
            self._unlogged += 1
            return
        more = f" (and {self._unlogged} more)" if self._unlogged else ""
        log.warning("%s: request without Id rejected (%d): %s%s", self.peer, reply.status, reply.error, more)
        self._last_log, self._unlogged = now, 0


class _Reads:
    """A connection's reads, one at a time. While a TAKE waits, the next read is
    started early (`ahead`): that is how a peer that goes away is seen at once,
    and what it took given back; the data read is kept for the read after."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader
        self._ahead: asyncio.Task[bytes] | None = None

    def ahead(self) -> asyncio.Task[bytes]:
        if self._ahead is None:
            self._ahead = asyncio.ensure_future(self._reader.read(READ_CHUNK))
        return self._ahead

    async def next(self, deadline: float | None) -> bytes | None:
        """The next chunk; None if the monotonic `deadline` passes first."""
        ahead, self._ahead = self._ahead, None
        return await _read(self._reader, deadline, ahead)

    def cancel(self) -> None:
        """The connection is done: a read started early goes, its error unseen."""
        if self._ahead is not None:
            self._ahead.cancel()
            self._ahead.add_done_callback(lambda read: read.cancelled() or read.exception())


class _Taking(NamedTuple):
    """How one connection of ServerSocket takes (PROTOCOL §9): as which taker,
    and the read that says whether it is still there."""

    takes: Takes
    taker: int
    reads: _Reads


async def serve_requests(
    reader: asyncio.StreamReader,
    channel: ReplyChannel,
    writer: Writer,
    max_frame_bytes: int,
    stopping: asyncio.Event | None = None,
    read_timeout_s: float = 0.0,
    authorize: Callable[[p.Request], None] | None = None,
    takes: Takes | None = None,
) -> None:
    """Read frames until EOF; each becomes an op for the writer, replied to in order.

    A frame must arrive whole within `read_timeout_s` of its first byte (0: no
    limit), so a peer stalled in the middle of one is answered 408 and closed
    while an idle one between frames may wait for ever. `authorize` raises
    Forbidden for a request the peer may not make; it runs when the request is
    applied, under the access rules of that moment. With `takes`, the
    connection is a taker: its TAKEs go through it, and so does its closing.
    """
    framer = Framer(max_frame_bytes)
    peer = channel.peer
    frame_started = None  # monotonic time the pending partial frame began
    reads = _Reads(reader)
    taking = _Taking(takes, takes.new_taker(), reads) if takes is not None else None
    try:
        while True:
            data = await reads.next(frame_started and frame_started + read_timeout_s)
            if data is None:
                await channel.settled()
                channel.send(p.error_reply(p.ReadTimeout(f"frame not complete within ReadTimeout ({read_timeout_s:g}s)")))
                log.warning("%s: stalled in the middle of a frame for %gs; closing the connection", peer, read_timeout_s)
                return
            if not data:
                break
            frames = framer.feed(data)
            if not read_timeout_s or not framer.pending:
                frame_started = None
            elif frame_started is None or frames:
                frame_started = time.monotonic()
            if stopping is not None and stopping.is_set():
                await _turn_away(frames, channel)
                return
            paused_at = time.monotonic()
            if not await _submit(frames, channel, writer, authorize, stopping, taking):
                return
            if framer.too_large is not None:
                await channel.settled()
                channel.send(p.error_reply(framer.too_large))
                log.warning("%s: %s; closing the connection", peer, framer.too_large)
                return
            if frame_started is not None:  # time we did not read is not the peer's stall
                frame_started += time.monotonic() - paused_at
        if framer.pending:
            log.info("%s: closed in the middle of a frame; the partial frame is dropped", peer)
        await channel.settled()
    except (ConnectionError, OSError) as exc:
        log.debug("%s: connection error: %s", peer, exc)
    finally:
        reads.cancel()
        if taking is not None:
            taking.takes.gone(taking.taker)
        channel.out.close()


async def _submit(
    frames: list[bytes],
    channel: ReplyChannel,
    writer: Writer,
    authorize: Callable[[p.Request], None] | None,
    stopping: asyncio.Event | None,
    taking: _Taking | None,
) -> bool:
    """Hand each frame to the writer once the connection has room for it; the
    socket is not read meanwhile, so a peer that does not read is not read.
    A TAKE is answered before the next frame is taken (it may wait).
    False if the server began stopping meanwhile: the rest were turned away."""
    for i, frame in enumerate(frames):
        op = _decode(frame, authorize)
        await channel.admit(len(frame), _answers_with_state(op))
        if stopping is not None and stopping.is_set():  # the writer takes nothing new
            await _turn_away(frames[i:], channel)
            return False
        sink = channel.expect(len(frame))
        take = _take_of(op) if taking is not None else None
        if take is None:
            writer.submit(op, sink)
        else:
            sink(await taking.takes.take(taking.taker, *take, taking.reads.ahead()))
    return True


def _take_of(op: p.Request | Guarded | Invalid) -> tuple[p.Request, Callable[[p.Request], None] | None] | None:
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
            channel.send(p.error_reply(p.ShuttingDown("shutting down"), request_id))


def _decode(frame: bytes, authorize: Callable[[p.Request], None] | None) -> p.Request | Guarded | Invalid:
    """The op for a frame; its access check goes with it, to run when it is applied."""
    try:
        request = p.decode_request(frame)
    except p.BadRequest as exc:
        return Invalid(exc, getattr(exc, "request_id", UNSET))
    return Guarded(request, authorize) if authorize is not None else request


def _answers_with_state(op: p.Request | Guarded | Invalid) -> bool:
    """A command's reply (STATUS's Body grows with the topics and subscribers) is
    not bounded by its request's size, as every other reply is; such requests are
    taken one at a time, so a connection holds at most one such reply unsent."""
    if isinstance(op, Guarded):
        op = op.request
    return isinstance(op, p.Request) and op.command is not None and op.id is not UNSET


async def _read(reader: asyncio.StreamReader, deadline: float | None, started: Awaitable[bytes] | None = None) -> bytes | None:
    """The next chunk (that of a read `started` already, if given); None if the
    monotonic `deadline` passes first."""
    chunk = reader.read(READ_CHUNK) if started is None else started
    if not deadline:
        return await chunk
    try:
        return await asyncio.wait_for(chunk, max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        return None


class Server:
    """Listens on ServerSocket and serves every connection with serve_requests."""

    def __init__(
        self,
        path: str,
        writer: Writer,
        max_frame_bytes: int,
        *,
        max_connections: int = 0,
        read_timeout_s: float = 0.0,
        policy: Policy | None = None,
        takes: Takes | None = None,
    ) -> None:
        self.path = path
        self.takes = takes  # TAKE on this socket's connections (PROTOCOL §9)
        self.writer = writer
        self.max_frame_bytes = max_frame_bytes
        self.max_connections = max_connections  # 0: the open-file limit less FD_RESERVE
        self.read_timeout_s = read_timeout_s
        self.policy = policy
        self._last_refusal_log = 0.0
        self.stopping = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None
        self._channels: dict[asyncio.Task, ReplyChannel] = {}
        self._count = 0
        self._owns_path = False  # we bound ServerSocket, so we remove it

    async def start(self, inherited: socket.socket | None = None, mode: int | None = None, group: str | None = None) -> None:
        """Listen on ServerSocket, or on the socket systemd passed (never unlinked:
        it is systemd's, and producers may already be waiting in its backlog).
        A socket we bind ourselves gets `mode` (and `group`) before it listens."""
        try:
            if inherited is not None:
                self._server = await asyncio.start_unix_server(self._handle, sock=inherited, backlog=LISTEN_BACKLOG)
                self._check_inherited_path(inherited)
                return
            sock = sockets.listen(self.path, LISTEN_BACKLOG, mode, group)
            self._owns_path = True
            self._server = await asyncio.start_unix_server(self._handle, sock=sock, backlog=LISTEN_BACKLOG)
        except OSError as exc:
            raise sockets.ListenError(f"cannot listen on {self.path}: {exc.strerror or exc}") from None

    def _check_inherited_path(self, sock: socket.socket) -> None:
        bound = sock.getsockname()
        if bound != self.path:
            log.warning("listening on %s from systemd, but ServerSocket says %s", bound or "an unnamed socket", self.path)

    async def _handle(self, reader: asyncio.StreamReader, out: asyncio.StreamWriter) -> None:
        self._count += 1
        limit = self.max_connections or max(1, _open_file_limit() - FD_RESERVE)
        if len(self._channels) >= limit:
            await self._refuse(out, limit)
            return
        peer = Peer.of_socket(out.get_extra_info("socket"))
        task = asyncio.current_task()
        channel = self._channels[task] = ReplyChannel(out, f"client#{self._count} ({peer})")
        authorize = self.policy.guard(peer, channel.peer) if self.policy is not None else None
        try:
            await serve_requests(reader, channel, self.writer, self.max_frame_bytes, self.stopping, self.read_timeout_s, authorize, self.takes)
        finally:
            del self._channels[task]

    async def _refuse(self, out: asyncio.StreamWriter, limit: int) -> None:
        """Over MaxConnections: one 503 line, then close; logged at most once a second."""
        error = p.Unavailable(f"too many connections: MaxConnections ({limit}) reached")
        now = time.monotonic()
        if now - self._last_refusal_log >= 1.0:
            log.warning("client#%d: refused: %s", self._count, error)
            self._last_refusal_log = now
        try:
            out.write(p.encode_reply(p.error_reply(error)))
            await asyncio.wait_for(out.drain(), 1.0)
        except (ConnectionError, OSError, TimeoutError):
            pass
        finally:
            out.close()

    async def stop(self) -> None:
        """Stop accepting; connections answer 503 to anything new and close."""
        self.stopping.set()
        if self.takes is not None:
            self.takes.stop()
        if self._server is not None:
            self._server.close()
        if self._owns_path:
            sockets.remove(self.path)

    async def close_connections(self, timeout_s: float) -> None:
        """Once the writer is done: let every connection take its last replies
        (for at most timeout_s), then close them all."""
        channels = dict(self._channels)
        if not channels:
            return
        try:
            await asyncio.wait_for(asyncio.gather(*(c.settled() for c in channels.values())), timeout_s)
        except TimeoutError:
            log.warning("closing connections with replies still unsent")
        for task in channels:
            task.cancel()
        await asyncio.gather(*channels, return_exceptions=True)


def _open_file_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20
