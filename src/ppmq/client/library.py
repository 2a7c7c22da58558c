"""Client library: every request the broker answers, each with a typed result.

`Client` blocks, `AsyncClient` is for asyncio; both send one wrapper per call
with an `Id` and return once the broker has committed it (PROTOCOL §4). A
status other than 200 raises ClientError with the broker's status and message.
What each request sends and returns is defined once, in ppmq.client.calls;
the two classes only carry it over their connection.

    with Client("/run/ppmq/ppmq.sock") as c:
        c.publish("filescan", [{"Key": "k", "Payload": "hello", "Priority": 1}])
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from typing import Any, TypeVar

from msgspec import Raw

import ppmq.client.calls as calls
from ppmq.client.calls import Call, Exchange, Messages
from ppmq.client.results import Message, PeekResult, PingResult, PublishResult, PurgeResult, RedriveResult, SettleResult, Status
from ppmq.errors import ClientError
from ppmq.protocol.messages import Reply

__all__ = ["DEFAULT_TIMEOUT_S", "AsyncClient", "Client", "Messages"]

R = TypeVar("R")
DEFAULT_TIMEOUT_S = 30.0
# The longest reply line AsyncClient reads: more than any reply of a broker, whose
# largest (a TAKE) holds at most MaxFrameBytes of messages, or one message.
REPLY_LIMIT_BYTES = 1 << 30
NO_ID = Raw(b"0")  # no request has it: a reply with an Id is not a refusal of the connection


class Client:
    """Blocking client on the broker's server socket. A TAKE that waits may take
    `wait_s` longer than `timeout_s` to answer."""

    def __init__(self, path: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._exchange, self._timeout_s = Exchange(), timeout_s
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            self._sock.connect(path)
        except OSError as exc:
            self._sock.close()
            raise ClientError(0, f"cannot connect to {path}: {exc.strerror or exc}") from None
        self._lines = self._sock.makefile("rb")

    def call(self, call: Call[R]) -> R:
        """Send one request and wait for its reply."""
        frame, rid = self._exchange.frame(call)
        try:
            self._sock.settimeout(self._timeout_s + call.wait_s)
            try:
                self._sock.sendall(frame)
            except (BrokenPipeError, ConnectionResetError):
                self._refusal()  # raises the broker's reason, when it gave one
                raise
            while (reply := self._exchange.reply(self._lines.readline(), rid)) is None:
                pass
        except OSError as exc:
            raise ClientError(0, f"connection to the broker failed: {exc}") from None
        return call.result(reply)

    def _refusal(self) -> None:
        """Raise the error the broker wrote before it closed the connection, if it
        wrote one: a frame over MaxFrameBytes is answered 413 and the connection
        closed while the rest is still being written, so the write fails, and the
        reason is the reply line waiting to be read, not the broken pipe."""
        try:
            line = self._lines.readline()
        except OSError:  # nothing left to read
            return
        try:
            self._exchange.reply(line, NO_ID)
        except ClientError as exc:
            if exc.status:
                raise
        except ValueError:  # not a reply
            pass

    def request(self, wrapper: dict[str, Any]) -> Reply:
        """Any wrapper, as it is (PROTOCOL §2): the reply with its Body as plain JSON values."""
        return self.call(calls.request(wrapper))

    def publish(self, topic: str, messages: Messages) -> PublishResult:
        return self.call(calls.publish(topic, messages))

    def ack(self, topic: str, subscriber: str, keys: Sequence[str]) -> SettleResult:
        return self.call(calls.settle("Acks", topic, subscriber, keys))

    def nack(self, topic: str, subscriber: str, keys: Sequence[str], delay_s: float | None = None) -> SettleResult:
        """Back to their queue, to be delivered again no sooner than `delay_s` from now."""
        return self.call(calls.settle("Nacks", topic, subscriber, keys, delay_s))

    def reject(self, topic: str, subscriber: str, keys: Sequence[str]) -> SettleResult:
        """Given up: to the topic's DeadLetter, or dropped."""
        return self.call(calls.settle("Rejects", topic, subscriber, keys))

    def touch(self, topic: str, subscriber: str, keys: Sequence[str]) -> SettleResult:
        """Their ack deadline (AckRetry) starts again now."""
        return self.call(calls.settle("Touch", topic, subscriber, keys))

    def take(self, topic: str, subscriber: str, count: int = 1, wait_s: float = 0.0, acks: Sequence[str] | None = None) -> list[Message]:
        """Up to `count` messages for a Pull subscriber, waiting up to `wait_s` for one; `acks` are acked first."""
        return self.call(calls.take(topic, subscriber, count, wait_s, acks))

    def reconnect(self, subscriber: str, topic: str | None = None) -> None:
        return self.call(calls.reconnect(subscriber, topic))

    def status(self, topic: str | None = None) -> Status:
        return self.call(calls.status(topic))

    def peek(
        self, topic: str, subscriber: str | None = None, state: str | None = None, limit: int | None = None, after: str | None = None
    ) -> PeekResult:
        """A page of what waits; `state` "ready" or "inflight", `after` the last page's `next`."""
        return self.call(calls.peek(topic, subscriber, state, limit, after))

    def purge(self, topic: str, subscriber: str | None = None, keys: Sequence[str] | None = None) -> PurgeResult:
        return self.call(calls.purge(topic, subscriber, keys))

    def redrive(self, topic: str, keys: Sequence[str] | None = None) -> RedriveResult:
        return self.call(calls.redrive(topic, keys))

    def pause(self, subscriber: str, topic: str | None = None) -> None:
        return self.call(calls.pause("PAUSE", subscriber, topic))

    def resume(self, subscriber: str, topic: str | None = None) -> None:
        return self.call(calls.pause("RESUME", subscriber, topic))

    def ping(self) -> PingResult:
        return self.call(calls.ping())

    def close(self) -> None:
        self._lines.close()
        self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient:
    """asyncio client; `await AsyncClient.connect(path)`. Its methods are Client's,
    awaited; concurrent calls on one client each get their own reply."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout_s: float) -> None:
        self._exchange = Exchange()
        self._reader, self._writer, self._timeout_s = reader, writer, timeout_s
        self._lock = asyncio.Lock()

    @classmethod
    async def connect(cls, path: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> AsyncClient:
        try:
            reader, writer = await asyncio.open_unix_connection(path, limit=REPLY_LIMIT_BYTES)
        except OSError as exc:
            raise ClientError(0, f"cannot connect to {path}: {exc.strerror or exc}") from None
        return cls(reader, writer, timeout_s)

    async def call(self, call: Call[R]) -> R:
        frame, rid = self._exchange.frame(call)
        async with self._lock:
            try:
                self._writer.write(frame)
                await self._writer.drain()
                while (reply := self._exchange.reply(await self._line(self._timeout_s + call.wait_s), rid)) is None:
                    pass
            except (OSError, TimeoutError) as exc:
                raise ClientError(0, f"connection to the broker failed: {exc!r}") from None
        return call.result(reply)

    async def _line(self, timeout_s: float) -> bytes:
        """The next reply line; one too long leaves the rest of it unread, so the
        connection is of no further use (ClientError with status 0)."""
        try:
            return await asyncio.wait_for(self._reader.readline(), timeout_s)
        except ValueError:
            raise ClientError(0, f"a reply longer than {REPLY_LIMIT_BYTES} bytes") from None

    async def request(self, wrapper: dict[str, Any]) -> Reply:
        return await self.call(calls.request(wrapper))

    async def publish(self, topic: str, messages: Messages) -> PublishResult:
        return await self.call(calls.publish(topic, messages))

    async def ack(self, topic: str, subscriber: str, keys: Sequence[str]) -> SettleResult:
        return await self.call(calls.settle("Acks", topic, subscriber, keys))

    async def nack(self, topic: str, subscriber: str, keys: Sequence[str], delay_s: float | None = None) -> SettleResult:
        return await self.call(calls.settle("Nacks", topic, subscriber, keys, delay_s))

    async def reject(self, topic: str, subscriber: str, keys: Sequence[str]) -> SettleResult:
        return await self.call(calls.settle("Rejects", topic, subscriber, keys))

    async def touch(self, topic: str, subscriber: str, keys: Sequence[str]) -> SettleResult:
        return await self.call(calls.settle("Touch", topic, subscriber, keys))

    async def take(
        self, topic: str, subscriber: str, count: int = 1, wait_s: float = 0.0, acks: Sequence[str] | None = None
    ) -> list[Message]:
        return await self.call(calls.take(topic, subscriber, count, wait_s, acks))

    async def reconnect(self, subscriber: str, topic: str | None = None) -> None:
        return await self.call(calls.reconnect(subscriber, topic))

    async def status(self, topic: str | None = None) -> Status:
        return await self.call(calls.status(topic))

    async def peek(
        self, topic: str, subscriber: str | None = None, state: str | None = None, limit: int | None = None, after: str | None = None
    ) -> PeekResult:
        return await self.call(calls.peek(topic, subscriber, state, limit, after))

    async def purge(self, topic: str, subscriber: str | None = None, keys: Sequence[str] | None = None) -> PurgeResult:
        return await self.call(calls.purge(topic, subscriber, keys))

    async def redrive(self, topic: str, keys: Sequence[str] | None = None) -> RedriveResult:
        return await self.call(calls.redrive(topic, keys))

    async def pause(self, subscriber: str, topic: str | None = None) -> None:
        return await self.call(calls.pause("PAUSE", subscriber, topic))

    async def resume(self, subscriber: str, topic: str | None = None) -> None:
        return await self.call(calls.pause("RESUME", subscriber, topic))

    async def ping(self) -> PingResult:
        return await self.call(calls.ping())

    async def close(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except OSError:
            pass

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
