"""Client library: publish with confirmation, ack, reconnect, status.

`Client` blocks, `AsyncClient` is for asyncio; both send one wrapper per call
with an `Id` and return once the broker has committed it (PROTOCOL §4). A
status other than 200 raises ClientError with the broker's message.

    with Client("/run/ppmq/ppmq.sock") as c:
        c.publish("filescan", [{"Key": "k", "Payload": "hello", "Priority": 1}])
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from typing import Any, TypeAlias

import msgspec

from ppmq.errors import ClientError
from ppmq.protocol.messages import Reply

_encoder = msgspec.json.Encoder()
_reply_decoder = msgspec.json.Decoder(Reply)
DEFAULT_TIMEOUT_S = 30.0
# The longest reply line AsyncClient reads: more than any reply of a broker, whose
# largest (a TAKE) holds at most MaxFrameBytes of messages, or one message.
REPLY_LIMIT_BYTES = 1 << 30
# A publish's messages: objects, or each one's JSON object already encoded
Messages: TypeAlias = list[dict[str, Any]] | list[msgspec.Raw]


class _Calls:
    """What both flavours share: building wrappers and reading replies."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def _frame(self, wrapper: dict[str, Any]) -> tuple[bytes, msgspec.Raw]:
        rid = msgspec.Raw(b"%d" % next(self._ids))
        # Id first: the broker can find it even in a frame it cannot parse
        return _encoder.encode({"Id": rid, **wrapper}) + b"\n", rid

    @staticmethod
    def _check(line: bytes) -> Reply:
        if not line:
            raise ClientError(0, "the broker closed the connection")
        reply = _reply_decoder.decode(line)
        if reply.status != 200:
            raise ClientError(reply.status, reply.error or "")
        return reply

    @staticmethod
    def publish_wrapper(topic: str, messages: Messages) -> dict[str, Any]:
        return {"Topic": topic, "Messages": messages}

    @staticmethod
    def ack_wrapper(topic: str, subscriber: str, keys: list[str]) -> dict[str, Any]:
        return {"Topic": topic, "Subscriber": subscriber, "Acks": keys}

    @staticmethod
    def reconnect_wrapper(subscriber: str, topic: str | None) -> dict[str, Any]:
        wrapper = {"Subscriber": subscriber, "Command": "RECONNECT"}
        return {**wrapper, "Topic": topic} if topic else wrapper

    @staticmethod
    def take_wrapper(topic: str, subscriber: str, count: int, wait_s: float, acks: list[str] | None) -> dict[str, Any]:
        """PROTOCOL §9 TAKE, with the previous batch's Acks applied first when given."""
        wrapper = {"Topic": topic, "Subscriber": subscriber, "Command": "TAKE", "Count": count, "Wait": wait_s}
        return {**wrapper, "Acks": acks} if acks else wrapper

    @staticmethod
    def status_wrapper(topic: str | None) -> dict[str, Any]:
        """STATUS of every topic, or of `topic` only (PROTOCOL §8)."""
        return {"Command": "STATUS", "Topic": topic} if topic else {"Command": "STATUS"}


class Client(_Calls):
    """Blocking client on the broker's server socket."""

    def __init__(self, path: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        try:
            self._sock.connect(path)
        except OSError as exc:
            self._sock.close()
            raise ClientError(0, f"cannot connect to {path}: {exc.strerror or exc}") from None
        self._lines = self._sock.makefile("rb")

    def request(self, wrapper: dict[str, Any]) -> Reply:
        frame, rid = self._frame(wrapper)
        try:
            self._sock.sendall(frame)
            while True:
                line = self._lines.readline()
                reply = self._check(line)
                if reply.id == rid:
                    return reply
        except OSError as exc:
            raise ClientError(0, f"connection to the broker failed: {exc}") from None

    def publish(self, topic: str, messages: Messages) -> int:
        return self.request(self.publish_wrapper(topic, messages)).accepted or 0

    def ack(self, topic: str, subscriber: str, keys: list[str]) -> int:
        return self.request(self.ack_wrapper(topic, subscriber, keys)).accepted or 0

    def reconnect(self, subscriber: str, topic: str | None = None) -> None:
        self.request(self.reconnect_wrapper(subscriber, topic))

    def status(self, topic: str | None = None) -> dict[str, Any]:
        return self.request(self.status_wrapper(topic)).body

    def take(self, topic: str, subscriber: str, count: int = 1, wait_s: float = 0.0, acks: list[str] | None = None) -> list[dict[str, Any]]:
        """Up to `count` messages for a Pull subscriber, waiting up to `wait_s` for
        one (the client's timeout must be longer); `acks` are acked first."""
        return self.request(self.take_wrapper(topic, subscriber, count, wait_s, acks)).body["Messages"]

    def close(self) -> None:
        self._lines.close()
        self._sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Calls):
    """asyncio client; `await AsyncClient.connect(path)`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout_s: float) -> None:
        super().__init__()
        self._reader, self._writer, self._timeout_s = reader, writer, timeout_s
        self._lock = asyncio.Lock()

    @classmethod
    async def connect(cls, path: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> AsyncClient:
        try:
            reader, writer = await asyncio.open_unix_connection(path, limit=REPLY_LIMIT_BYTES)
        except OSError as exc:
            raise ClientError(0, f"cannot connect to {path}: {exc.strerror or exc}") from None
        return cls(reader, writer, timeout_s)

    async def request(self, wrapper: dict[str, Any]) -> Reply:
        frame, rid = self._frame(wrapper)
        async with self._lock:
            try:
                self._writer.write(frame)
                await self._writer.drain()
                while True:
                    line = await self._line()
                    reply = self._check(line)
                    if reply.id == rid:
                        return reply
            except (OSError, TimeoutError) as exc:
                raise ClientError(0, f"connection to the broker failed: {exc!r}") from None

    async def _line(self) -> bytes:
        """The next reply line; one too long leaves the rest of it unread, so the
        connection is of no further use (ClientError with status 0)."""
        try:
            return await asyncio.wait_for(self._reader.readline(), self._timeout_s)
        except ValueError:
            raise ClientError(0, f"a reply longer than {REPLY_LIMIT_BYTES} bytes") from None

    async def publish(self, topic: str, messages: Messages) -> int:
        return (await self.request(self.publish_wrapper(topic, messages))).accepted or 0

    async def ack(self, topic: str, subscriber: str, keys: list[str]) -> int:
        return (await self.request(self.ack_wrapper(topic, subscriber, keys))).accepted or 0

    async def reconnect(self, subscriber: str, topic: str | None = None) -> None:
        await self.request(self.reconnect_wrapper(subscriber, topic))

    async def status(self, topic: str | None = None) -> dict[str, Any]:
        return (await self.request(self.status_wrapper(topic))).body

    async def take(
        self, topic: str, subscriber: str, count: int = 1, wait_s: float = 0.0, acks: list[str] | None = None
    ) -> list[dict[str, Any]]:
        """As Client.take: the timeout given to connect must be longer than `wait_s`."""
        return (await self.request(self.take_wrapper(topic, subscriber, count, wait_s, acks))).body["Messages"]

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
