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
import os
import socket
import time

from msgspec import UNSET

from . import protocol as p
from .broker import Invalid
from .framing import Framer
from .writer import Writer

log = logging.getLogger(__name__)

READ_CHUNK = 1 << 16
LISTEN_BACKLOG = 1024
MAX_OUTSTANDING = 1000  # requests of one connection waiting for commit before it is paused


class ListenError(Exception):
    """ServerSocket cannot be listened on (a live broker holds it, or the OS says no)."""


class ReplyChannel:
    """Replies of one connection; counts what is still waiting for a commit."""

    def __init__(self, out: asyncio.StreamWriter, peer: str) -> None:
        self.out = out
        self.peer = peer
        self.outstanding = 0
        self._room = asyncio.Event()
        self._room.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._last_log = 0.0
        self._unlogged = 0

    def expect(self) -> None:
        self.outstanding += 1
        self._idle.clear()
        if self.outstanding >= MAX_OUTSTANDING:
            self._room.clear()

    def reply(self, reply: p.Reply) -> None:
        self.outstanding -= 1
        if self.outstanding <= MAX_OUTSTANDING // 2:
            self._room.set()
        if not self.outstanding:
            self._idle.set()
        if reply.id is not UNSET:
            self.send(reply)
        elif reply.status != 200:
            self._log_one_way_error(reply)

    def send(self, reply: p.Reply) -> None:
        if not self.out.is_closing():
            self.out.write(p.encode_reply(reply))

    async def room(self) -> None:
        """Wait while too many requests are outstanding or the peer does not read."""
        await self._room.wait()
        await self.out.drain()

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


async def serve_requests(
    reader: asyncio.StreamReader,
    channel: ReplyChannel,
    writer: Writer,
    max_frame_bytes: int,
    stopping: asyncio.Event | None = None,
) -> None:
    """Read frames until EOF; each becomes an op for the writer, replied to in order."""
    framer = Framer(max_frame_bytes)
    peer = channel.peer
    try:
        while True:
            data = await reader.read(READ_CHUNK)
            if not data:
                break
            frames = framer.feed(data)
            if stopping is not None and stopping.is_set():
                await channel.settled()
                for frame in frames:
                    request_id = p.find_request_id(frame)
                    if request_id is not UNSET:
                        channel.send(p.error_reply(p.ShuttingDown("shutting down"), request_id))
                return
            for frame in frames:
                try:
                    op = p.decode_request(frame)
                except p.BadRequest as exc:
                    op = Invalid(exc, getattr(exc, "request_id", UNSET))
                channel.expect()
                writer.submit(op, channel.reply)
            if framer.too_large is not None:
                await channel.settled()
                channel.send(p.error_reply(framer.too_large))
                log.warning("%s: %s; closing the connection", peer, framer.too_large)
                return
            await channel.room()
        if framer.pending:
            log.info("%s: closed in the middle of a frame; the partial frame is dropped", peer)
        await channel.settled()
    except (ConnectionError, OSError) as exc:
        log.debug("%s: connection error: %s", peer, exc)
    finally:
        channel.out.close()


class Server:
    """Listens on ServerSocket and serves every connection with serve_requests."""

    def __init__(self, path: str, writer: Writer, max_frame_bytes: int) -> None:
        self.path = path
        self.writer = writer
        self.max_frame_bytes = max_frame_bytes
        self.stopping = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None
        self._channels: dict[asyncio.Task, ReplyChannel] = {}
        self._count = 0
        self._owns_path = False  # we bound ServerSocket, so we remove it

    async def start(self, inherited: socket.socket | None = None) -> None:
        """Listen on ServerSocket, or on the socket systemd passed (never unlinked:
        it is systemd's, and producers may already be waiting in its backlog)."""
        try:
            if inherited is not None:
                self._server = await asyncio.start_unix_server(self._handle, sock=inherited, backlog=LISTEN_BACKLOG)
                self._check_inherited_path(inherited)
                return
            _claim_socket_path(self.path)
            self._server = await asyncio.start_unix_server(self._handle, path=self.path, backlog=LISTEN_BACKLOG)
            self._owns_path = True
        except OSError as exc:
            raise ListenError(f"cannot listen on {self.path}: {exc.strerror or exc}") from None

    def _check_inherited_path(self, sock: socket.socket) -> None:
        bound = sock.getsockname()
        if bound != self.path:
            log.warning("listening on %s from systemd, but ServerSocket says %s", bound or "an unnamed socket", self.path)

    async def _handle(self, reader: asyncio.StreamReader, out: asyncio.StreamWriter) -> None:
        self._count += 1
        task = asyncio.current_task()
        channel = self._channels[task] = ReplyChannel(out, f"client#{self._count}")
        try:
            await serve_requests(reader, channel, self.writer, self.max_frame_bytes, self.stopping)
        finally:
            del self._channels[task]

    async def stop(self) -> None:
        """Stop accepting; connections answer 503 to anything new and close."""
        self.stopping.set()
        if self._server is not None:
            self._server.close()
        if not self._owns_path:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

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


def _claim_socket_path(path: str) -> None:
    """Remove a stale socket file, but refuse to steal one a live broker listens on."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
    else:
        raise ListenError(f"another process is already listening on {path}")
    finally:
        probe.close()
