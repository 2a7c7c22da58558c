"""MaxConnections (PROTOCOL §9 Connection limits cover every listener): one count
of the connections open on every listener, against one limit.

ServerSocket, PhpmqSocket and any listener added later each ask `admit` for a
connection as soon as they accept it, before reading a byte of it, and `leave`
once it ends; a refused one is closed by its listener in its own protocol's
way (ServerSocket answers a 503 line first, PHPMQ has no replies). So N hostile
connections hold at most N times one connection's bound (docs/security.md),
whichever sockets they open, and the descriptors FD_RESERVE keeps are never
taken by clients.
"""

from __future__ import annotations

import logging
import resource
import time

from ppmq.errors import Unavailable

log = logging.getLogger("ppmq.server")

FD_RESERVE = 64  # descriptors kept for the store, subscribers and logs when MaxConnections is 0
REFUSAL_LOG_EVERY_S = 1.0  # a flood of refused connections logs one line a second


class ConnectionLimit:
    """The connections open on each listener, and whether one more may open."""

    def __init__(self, max_connections: int = 0) -> None:
        self.max_connections = max_connections  # MaxConnections, followed at reload; 0: from the open-file limit
        self.open: dict[str, int] = {}  # listener (its config key) -> connections open on it now
        self._last_refusal_log_s = 0.0  # monotonic

    def listener(self, name: str) -> None:
        """A listener that will admit connections: counted from now on, at 0."""
        self.open.setdefault(name, 0)

    @property
    def limit(self) -> int:
        return self.max_connections or max(1, _open_file_limit() - FD_RESERVE)

    def admit(self, listener: str, where: str) -> Unavailable | None:
        """Count a new connection of `listener`; or, with MaxConnections open on
        all listeners together, the error that refuses it (logged at most once
        a second, naming `where`), and it is not counted."""
        limit = self.limit
        if sum(self.open.values()) >= limit:
            error = Unavailable(f"too many connections: MaxConnections ({limit}) reached")
            now_s = time.monotonic()
            if now_s - self._last_refusal_log_s >= REFUSAL_LOG_EVERY_S:
                log.warning("%s: refused: %s", where, error)
                self._last_refusal_log_s = now_s
            return error
        self.open[listener] = self.open.get(listener, 0) + 1
        return None

    def leave(self, listener: str) -> None:
        """An admitted connection of `listener` has ended."""
        self.open[listener] -= 1


def _open_file_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20
