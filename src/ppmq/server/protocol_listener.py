"""What every listener of another protocol shares (PhpmqSocket, ZbusSocket,
ZbusListen): binding a Unix socket as ServerSocket is bound, or a TCP address;
MaxConnections counted with the other listeners; one task per connection that
nothing a client sends can take down with it; the reads that ReadTimeout bounds.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

from msgspec import UNSET

from ppmq import sockets
from ppmq.config import Config
from ppmq.core.access import Peer, Policy
from ppmq.core.ops import Invalid
from ppmq.errors import Internal
from ppmq.server.connection_limit import ConnectionLimit
from ppmq.server.group_commit import GroupCommit
from ppmq.server.listener import LISTEN_BACKLOG
from ppmq.server.take_waits import TakeWaits
from ppmq.sockets import peer_credentials

READ_CHUNK = 1 << 16


class ProtocolListener:
    """Listens on a Unix socket for `PROTOCOL`; a subclass serves each
    connection (`serve`). `config` is replaced whole at every reload."""

    LISTENER = ""  # its name in the connection counts (STATUS Listeners), as in the config
    PROTOCOL = ""  # its name in the log
    log = logging.getLogger("ppmq")

    def __init__(
        self,
        path: str,
        writer: GroupCommit,
        takes: TakeWaits,
        config: Config,
        connections: ConnectionLimit,
        policy: Policy | None = None,
    ) -> None:
        self.path = path
        self.writer = writer
        self.takes = takes  # consuming is TAKE on behalf of each connection (PROTOCOL §9)
        self.config = config
        self.connections = connections  # MaxConnections, shared with the other listeners
        connections.listener(self.LISTENER)
        self.policy = policy
        self._server: asyncio.AbstractServer | None = None
        self._bound: sockets.SocketFile | None = None  # the socket's file once bound: removed at stop
        self._tasks: set[asyncio.Task] = set()
        self._count = 0

    async def start(self, mode: int | None = None, group: str | None = None) -> None:
        """Bind the socket as ServerSocket is bound (mode and group before it listens)."""
        sock, self._bound = sockets.listen(self.path, LISTEN_BACKLOG, mode, group)
        self._server = await asyncio.start_unix_server(self._handle, sock=sock, backlog=LISTEN_BACKLOG)
        self.log.info("speaking %s on %s", self.PROTOCOL, self.path)

    async def start_tcp(self, host: str, port: int) -> None:
        """Listen on a TCP address instead: its peers have no credentials."""
        self._server = await asyncio.start_server(self._handle, host, port, backlog=LISTEN_BACKLOG)
        self.log.info("speaking %s on %s:%d", self.PROTOCOL, host, port)

    async def serve(self, peer: Peer | None, reader: asyncio.StreamReader, out: asyncio.StreamWriter, where: str) -> None:
        """One admitted connection, until it ends; `peer` is None on TCP."""
        raise NotImplementedError

    async def _handle(self, reader: asyncio.StreamReader, out: asyncio.StreamWriter) -> None:
        """One connection, if MaxConnections lets it in (one over it is closed at
        once, before a byte is read). Whatever its bytes do, nothing leaves this
        handler: an error the serving did not foresee is a bug, logged with its
        traceback and counted in Rejected, and it costs this connection only."""
        self._count += 1
        where = f"{self.PROTOCOL.lower()}#{self._count}"
        if self.connections.admit(self.LISTENER, where) is not None:
            out.close()
            return
        task = asyncio.current_task()
        assert task is not None, "a connection is served by a task of its own (asyncio.start_unix_server)"
        self._tasks.add(task)
        try:
            sock = out.get_extra_info("socket")
            peer = Peer(*peer_credentials(sock)) if sock.family == socket.AF_UNIX else None
            await self.serve(peer, reader, out, f"{where} ({peer if peer is not None else _address(out.get_extra_info('peername'))})")
        except (ConnectionError, OSError) as exc:
            self.log.debug("%s: connection error: %s", where, exc)
        except Exception as exc:
            self.log.exception("%s: internal error; closing the connection", where)
            self.writer.submit(Invalid(Internal(f"{self.PROTOCOL}: internal error: {exc}"), UNSET))
        finally:
            self._tasks.discard(task)
            self.connections.leave(self.LISTENER)
            out.close()

    async def stop(self) -> None:
        """Stop accepting, and remove the socket file it bound."""
        if self._server is not None:
            self._server.close()
        if self._bound is not None:
            self._bound.remove()

    async def close_connections(self) -> None:
        """Once the writer is done: close every connection (a request waiting for
        its commit has had it, or never will)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def read_within(reader: asyncio.StreamReader, deadline: float | None) -> bytes | None:
    """The next chunk; None if the monotonic `deadline` passes first."""
    chunk = reader.read(READ_CHUNK)
    if not deadline:
        return await chunk
    try:
        return await asyncio.wait_for(chunk, max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        return None


def _address(peername: tuple | None) -> str:
    """A TCP peer's address as HOST:PORT."""
    return f"{peername[0]}:{peername[1]}" if peername else "unknown address"
