"""The server socket: listens on ServerSocket, and serves each connection it
accepts with `Requests` (server/requests.py), while MaxConnections, counted over every
listener (server/connection_limit.py), lets it in.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from ppmq import sockets
from ppmq.core.access import Peer, Policy
from ppmq.errors import ListenError, Unavailable
from ppmq.protocol import messages as p
from ppmq.server.connection import Connection, ReplyChannel
from ppmq.server.connection_limit import ConnectionLimit
from ppmq.server.group_commit import GroupCommit
from ppmq.server.requests import Requests, Shutdown
from ppmq.server.take_waits import TakeWaits
from ppmq.sockets import peer_credentials

log = logging.getLogger("ppmq.server")

LISTEN_BACKLOG = 1024
LISTENER = "ServerSocket"  # its name in the connection counts (STATUS Listeners)


class Server:
    """Listens on ServerSocket and serves every connection's Requests."""

    def __init__(
        self,
        path: str,
        writer: GroupCommit,
        max_frame_bytes: int,
        *,
        connections: ConnectionLimit,
        read_timeout_s: float = 0.0,
        policy: Policy | None = None,
        takes: TakeWaits | None = None,
    ) -> None:
        self.path = path
        self.takes = takes  # TAKE on this socket's connections (PROTOCOL §9)
        self.writer = writer
        self.max_frame_bytes = max_frame_bytes
        self.connections = connections  # MaxConnections, shared with the other listeners
        connections.listener(LISTENER)
        self.read_timeout_s = read_timeout_s
        self.policy = policy
        self.shutdown = Shutdown()
        self._server: asyncio.AbstractServer | None = None
        self._channels: dict[asyncio.Task, ReplyChannel] = {}
        self._count = 0
        self._bound: sockets.SocketFile | None = None  # ServerSocket's file when we bound it: removed at stop
        self._backlog: socket.socket | None = None  # the socket we bound, to take in its backlog at stop
        self._taking_in: list[asyncio.Task] = []

    async def start(self, inherited: socket.socket | None = None, mode: int | None = None, group: str | None = None) -> None:
        """Listen on ServerSocket, or on the socket systemd passed (never unlinked:
        it is systemd's, and producers may already be waiting in its backlog).
        A socket we bind ourselves gets `mode` (and `group`) before it listens."""
        try:
            if inherited is not None:
                self._server = await self._listen(inherited)
                self._check_inherited_path(inherited)
                return
            sock, self._bound = sockets.listen(self.path, LISTEN_BACKLOG, mode, group)
            self._backlog = sock.dup()
            self._server = await self._listen(sock)
        except OSError as exc:
            raise ListenError(f"cannot listen on {self.path}: {exc.strerror or exc}") from None

    async def _listen(self, sock: socket.socket) -> asyncio.AbstractServer:
        return await asyncio.get_running_loop().create_unix_server(self._connection, sock=sock, backlog=LISTEN_BACKLOG)

    def _connection(self) -> Connection:
        """The protocol of every connection accepted, served by _handle."""
        return Connection(self._handle)

    def _check_inherited_path(self, sock: socket.socket) -> None:
        bound = sock.getsockname()
        if bound != self.path:
            log.warning("listening on %s from systemd, but ServerSocket says %s", bound or "an unnamed socket", self.path)

    async def _handle(self, conn: Connection) -> None:
        self._count += 1
        refused = self.connections.admit(LISTENER, f"client#{self._count}")
        if refused is not None:
            await self._refuse(conn, refused)
            return
        task = asyncio.current_task()
        assert task is not None, "a connection is served by a task of its own (Connection's on_connect)"
        try:
            peer = Peer(*peer_credentials(conn.get_extra_info("socket")))
            channel = self._channels[task] = ReplyChannel(conn, f"client#{self._count} ({peer})")
            authorize = self.policy.guard(peer, channel.peer) if self.policy is not None else None
            await Requests(
                conn, channel, self.writer, self.max_frame_bytes, self.shutdown, self.read_timeout_s, authorize, self.takes
            ).serve()
        finally:
            self._channels.pop(task, None)
            self.connections.leave(LISTENER)

    async def _refuse(self, out: Connection, error: Unavailable) -> None:
        """Over MaxConnections: one 503 line, then close."""
        try:
            out.write(p.encode_reply(p.error_reply(error)))
            await asyncio.wait_for(out.drain(), 1.0)
        except (ConnectionError, OSError, TimeoutError):
            pass
        finally:
            out.close()

    async def stop(self) -> None:
        """Stop accepting; connections answer 503 to anything new and close."""
        self.shutdown.begun = True
        if self.takes is not None:
            self.takes.stop()
        if self._server is not None:
            self._take_in_backlog()
            self._server.close()
        if self._bound is not None:
            self._bound.remove()

    def _take_in_backlog(self) -> None:
        """Accept who still waits in the backlog of the socket we bound, so that
        they are closed (after a 503 for what they send) like every connection
        made before the stop, rather than reset: a Unix connection never accepted
        is reset when its listener closes, and the loop accepts only so many a
        round (uvloop one). systemd's socket keeps its backlog for our next start."""
        if self._backlog is None:
            return
        loop = asyncio.get_running_loop()
        self._backlog.setblocking(False)
        try:
            while True:
                conn, _ = self._backlog.accept()
                self._taking_in.append(loop.create_task(loop.connect_accepted_socket(self._connection, conn)))
        except OSError:  # BlockingIOError: the backlog is empty
            pass
        finally:
            self._backlog.close()
            self._backlog = None

    async def close_connections(self, timeout_s: float) -> None:
        """Once the writer is done: let every connection take its last replies
        (for at most timeout_s), then close them all."""
        await asyncio.gather(*self._taking_in, return_exceptions=True)
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
