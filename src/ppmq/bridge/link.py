"""A bridge's connection to one side (NATS or the broker), reopened with backoff.

Both directions of `ppmq bridge` (PROTOCOL §10) hold what they took from one side
until the other confirms it, retrying for as long as it takes. A Link makes that
one call, `await link.attempt(op)`, and says what is going on once per change of
state (up or down) rather than once per retry, so a bridge left pointing at a
dead URL writes two lines, not thousands.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from ppmq.client.library import AsyncClient
from ppmq.errors import ClientError

log = logging.getLogger("ppmq.bridge")
T = TypeVar("T")
R = TypeVar("R")
FIRST_RETRY_S = 0.1  # the wait after the first failure, doubled after each next one
RETRY_MAX_S = 5.0  # the longest wait between two tries: a restarted peer is found this soon


class Backoff:
    """Waits that double from FIRST_RETRY_S up to RETRY_MAX_S, until reset."""

    def __init__(self) -> None:
        self._next_s = FIRST_RETRY_S

    def reset(self) -> None:
        self._next_s = FIRST_RETRY_S

    async def wait(self) -> None:
        delay_s, self._next_s = self._next_s, min(self._next_s * 2, RETRY_MAX_S)
        await asyncio.sleep(delay_s)


class Link(Generic[T]):
    """One connection, opened on first use and again after it broke.

    `errors` are the exceptions that mean "try again later". `broken` tells
    whether one left the connection unusable (it is then closed and reopened)
    or only the operation failed (a JetStream without the stream, a broker
    answering 507): then only the operation is retried, on the same
    connection. Any other exception is unexpected: logged with its traceback,
    the connection reopened, and the operation retried all the same. A bridge
    runs unattended, and an exit would only have systemd restart it into the
    same failure, with what it holds given back and taken again each time.
    """

    def __init__(
        self,
        name: str,
        opener: Callable[[], Awaitable[T]],
        closer: Callable[[T], Awaitable[None]],
        broken: Callable[[T, Exception], bool],
        errors: tuple[type[Exception], ...],
    ) -> None:
        self.name = name
        self._opener, self._closer, self._broken, self._errors = opener, closer, broken, errors
        self._conn: T | None = None
        self._up: bool | None = None  # None until the first attempt: the first state is always logged
        self._backoff = Backoff()
        self._lock = asyncio.Lock()  # one opening at a time when several tasks share the link

    async def attempt(self, op: Callable[[T], Awaitable[R]]) -> R:
        """op(connection), retried with backoff until it succeeds."""
        while True:
            conn = await self._connection()
            try:
                result = await op(conn)
            except Exception as exc:
                await self._failed(conn, exc)
                continue
            self._state(True, "")
            return result

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await self._close_quietly(conn)

    async def _connection(self) -> T:
        async with self._lock:
            while self._conn is None:
                try:
                    self._conn = await self._opener()
                except Exception as exc:
                    self._state(False, f"unreachable ({_describe(exc)})", self._unexpected(exc))
                    await self._backoff.wait()
            return self._conn

    async def _failed(self, conn: T, exc: Exception) -> None:
        unexpected = self._unexpected(exc)
        if unexpected is not None or self._broken(conn, exc):
            self._state(False, f"connection lost ({_describe(exc)})", unexpected)
            if conn is self._conn:
                self._conn = None
                await self._close_quietly(conn)
        else:
            self._state(False, f"failing ({_describe(exc)})")
        await self._backoff.wait()

    async def _close_quietly(self, conn: T) -> None:
        try:
            await self._closer(conn)
        except Exception:
            pass  # it is broken already; closing is only to free it

    def _unexpected(self, exc: Exception) -> Exception | None:
        """`exc` if it is none of the errors that mean "try again later"."""
        return None if isinstance(exc, self._errors) else exc

    def _state(self, up: bool, why: str, unexpected: Exception | None = None) -> None:
        """Log a change of state, once; an unexpected error with its traceback."""
        if up:
            self._backoff.reset()
        if up == self._up:
            return
        self._up = up
        if up:
            log.info("%s: connected", self.name)
        elif unexpected is not None:
            log.error("%s: %s; retrying with backoff up to %gs", self.name, why, RETRY_MAX_S, exc_info=unexpected)
        else:
            log.warning("%s: %s; retrying with backoff up to %gs", self.name, why, RETRY_MAX_S)


def _describe(exc: Exception) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --- the two sides ---------------------------------------------------------------------

NATS_TIMEOUT_S = 5.0  # a PubAck, a connect or an ack not back by then: try again
NATS_PING_S = 2  # a silent server is found dead after about two of these


class Nats:
    """A NATS connection and its JetStream context, with what a direction binds on it."""

    def __init__(self, nc: Any, js: Any, sub: Any = None) -> None:  # nats-py's types: the bridge extra may be absent at import
        self.nc, self.js, self.sub = nc, js, sub


def nats_link(url: str, bind: Callable[[Nats], Awaitable[None]] | None = None) -> Link[Nats]:
    """NATS at `url`, reconnected by the Link rather than by nats-py, so that a
    lost connection fails the operation at once and is logged as a state change."""
    import nats
    import nats.errors

    async def opener() -> Nats:
        nc = await nats.connect(
            url,
            allow_reconnect=False,
            max_reconnect_attempts=1,
            reconnect_time_wait=0,  # else it retries forever itself
            connect_timeout=NATS_TIMEOUT_S,
            ping_interval=NATS_PING_S,
            error_cb=_ignore,
            closed_cb=_ignore,
            disconnected_cb=_ignore,
        )
        conn = Nats(nc, nc.jetstream(timeout=NATS_TIMEOUT_S))
        if bind is not None:
            await bind(conn)
        return conn

    async def closer(conn: Nats) -> None:
        await conn.nc.close()

    return Link(f"NATS {url}", opener, closer, lambda conn, exc: not conn.nc.is_connected, (nats.errors.Error, OSError, TimeoutError))


def ppmq_link(path: str, timeout_s: float) -> Link[AsyncClient]:
    """The broker's ServerSocket; an error status leaves the connection usable."""

    async def closer(client: AsyncClient) -> None:
        await client.close()

    def broken(client: AsyncClient, exc: Exception) -> bool:
        return not isinstance(exc, ClientError) or exc.status == 0

    return Link(f"ppmq {path}", lambda: AsyncClient.connect(path, timeout_s), closer, broken, (ClientError, OSError))


async def _ignore(*args: object) -> None:
    """nats-py logs every error through these callbacks by default; the Link says it once."""
