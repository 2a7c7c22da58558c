"""The zbus listener (PROTOCOL §11): ZbusSocket's connections, HTTP and
WebSocket on one socket, zbus commands to ops.

A zbus `mq` is the ppmq topic of that name and a `channel` one of its Pull
subscribers. `pub` is a publish, answered once it is committed; `take` is a
TAKE that does not wait (604 when nothing is ready); `ack` acks for the
channel; `query` reads STATUS; `create` and `remove` only say whether the
config has the topic (and channel), since topics come from the config; `ping`
is not answered. Every request is checked as the same request on ServerSocket
would be, by the peer's credentials.

The connection is the taker of what it takes, as a ServerSocket connection is
of its TAKEs: when it closes, what it took and did not ack is ready again at
once. The channel's `ZbusAck` says when a taken message counts as acked:
`window` at the connection's next take on that mq and channel, `explicit` at
an `ack`, `delivery` as it is sent.

Requests are applied one at a time, in order, each answered before the next is
read. A request or frame that is not HTTP, WebSocket or zbus JSON, or is over
MaxFrameBytes, or does not arrive whole within ReadTimeout, closes the
connection (after a 400 or 413, or a WebSocket close, where one can be sent) and
counts in Rejected. Connections count toward MaxConnections with the other
listeners'.
"""

from __future__ import annotations

import asyncio
import logging
import pwd
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import msgspec
from msgspec import UNSET

from ppmq.config import SubscriberConfig, TopicConfig
from ppmq.core.access import Peer
from ppmq.core.ops import Guarded, Invalid
from ppmq.errors import BadFrame, BadRequest, Forbidden, FrameTooLarge, NotFound, RequestError, TooLarge
from ppmq.protocol import messages as p
from ppmq.protocol import zbus as wire
from ppmq.server.protocol_listener import ProtocolListener, read_within
from ppmq.server.zbus_sub import Subscription, Taken, taken_of

log = logging.getLogger("ppmq.zbus")

REPLY_ID = msgspec.Raw(b"0")  # a TAKE or STATUS needs an Id for its reply to carry a body; nobody else sees it


class ZbusConnection:
    """One client on ZbusSocket: its requests, applied and answered in order."""

    def __init__(self, server: ZbusServer, peer: Peer | None, out: asyncio.StreamWriter, where: str) -> None:
        self.server = server
        self.out = out
        self.where = where
        self.peer_check = self._guard(peer, where) if peer is not None else None  # None on TCP: only signed requests
        self.signed: dict[tuple[str, str | int], Callable[[p.Request], None]] = {}  # the check of each ZbusKeys user, by ApiKey and User
        self.authorize: Callable[[p.Request], None] = _allowed  # the check of the request being applied
        self.waiting_id: str | None = None  # the id of the request being applied, until its reply is written
        self.replied = asyncio.Event()  # set when the request being applied has its reply
        self.taker = server.takes.new_taker()
        self.unacked: dict[tuple[str, str], list[str]] = {}  # taken here, acked at the next take or sub (ZbusAck: window)
        self.subs: dict[tuple[str, str], Subscription] = {}  # by mq and channel
        self.stream = wire.Stream(server.config.max_frame_bytes)

    async def serve(self, reader: asyncio.StreamReader) -> None:
        """Until EOF, a bad request or frame, or an HTTP exchange that ends the
        connection. A request or frame must arrive whole within ReadTimeout of
        its first byte."""
        started: float | None = None  # monotonic time the pending partial request began
        try:
            while not self.stream.closed:
                timeout_s = self.server.config.read_timeout
                if self.stream.pending and started is None:
                    started = time.monotonic()
                elif not self.stream.pending:
                    started = None
                data = await read_within(reader, timeout_s and started and started + timeout_s)
                if data is None:
                    raise BadFrame(f"request not complete within ReadTimeout ({timeout_s:g}s)")
                messages, out = self.stream.feed(data)
                while messages or out:
                    self.out.write(out)
                    for message in messages:
                        await self.apply(message)
                        if message.http and not self.stream.keep_alive:
                            return
                    await self.out.drain()
                    messages, out = self.stream.feed(None) if messages else ([], b"")
                if not data:
                    return
        except BadFrame as exc:
            self._reject(exc)
        finally:
            for sub in self.subs.values():
                await sub.close()
            self.server.takes.gone(self.taker)

    def _reject(self, exc: BadFrame) -> None:
        """Answer what can be answered, and count the request in Rejected as the
        writer counts every bad request."""
        log.warning("%s: bad zbus request: %s; closing the connection", self.where, exc)
        try:
            self.out.write(self.stream.refusal(exc))
        except (ConnectionError, OSError):
            pass
        error = TooLarge(str(exc)) if isinstance(exc, FrameTooLarge) else BadRequest(f"zbus: {exc}")
        self.server.writer.submit(Invalid(error, UNSET))

    async def apply(self, message: wire.Message) -> None:
        """One request, answered (unless it is a ping, or asks for no answer).
        Until it is, no push carries its id: a client would take the push for
        the reply."""
        self.waiting_id = message.header("id")
        self.replied.clear()
        try:
            self._answer(message, await self._answer_of(message))
        finally:
            self.waiting_id = None
            self.replied.set()

    async def _answer_of(self, message: wire.Message) -> tuple[wire.Call | None, tuple[int, Any] | None]:
        """The request's call (None if it is not one) and its status and body
        (None when it has no answer)."""
        try:
            call = wire.call_of(message)
            if call.cmd == "sub" and message.http:
                raise BadRequest("sub needs a WebSocket: messages are pushed")
            self.authorize = self._check_of(message, call)
            answer = await self._run(call)
        except RequestError as exc:
            return None, (exc.status, wire.error_body(exc))
        return call, answer

    def _answer(self, message: wire.Message, answered: tuple[wire.Call | None, tuple[int, Any] | None]) -> None:
        call, answer = answered
        if message.http:
            assert answer is not None, "only a sub refresh has no answer"
            self.out.write(self.stream.reply_http(*answer))
        elif answer is not None and self.stream.open and (call is None or (call.cmd != "ping" and call.answer)):
            self.out.write(self.stream.reply_ws(wire.reply(message, *answer)))

    def _check_of(self, message: wire.Message, call: wire.Call) -> Callable[[p.Request], None]:
        """Who a request is judged as: the ZbusKeys user whose key signed it;
        without apiKey, the peer by its credentials (ZbusSocket). On TCP
        (ZbusListen) every request but ping must be signed. Forbidden otherwise."""
        api_key = message.header("apikey")
        if api_key is None:
            if self.peer_check is not None:
                return self.peer_check
            if call.cmd == "ping":
                return _allowed
            raise Forbidden("zbus: a request on ZbusListen must be signed (apiKey, signFields, signature)")
        key = next((k for k in self.server.config.zbus_keys if k.api_key == api_key), None)
        if key is None or not wire.signed_with(message, key.secret):
            raise Forbidden(f"zbus: bad signature, or no such apiKey {api_key[:100]!r}")
        check = self.signed.get((api_key, key.user))  # a reload may give the key another User
        if check is None:
            check = self.signed[(api_key, key.user)] = self._guard(Peer.of_uid(_uid(key.user)), f"{self.where} as {key.user}")
        return check

    def _guard(self, peer: Peer, where: str) -> Callable[[p.Request], None]:
        policy = self.server.policy
        return policy.guard(peer, where) if policy is not None else _allowed

    async def _run(self, call: wire.Call) -> tuple[int, Any] | None:
        """A call's status and body; None for a call that has no answer."""
        match call.cmd:
            case "sub":
                return await self._sub(call)
            case "pub":
                return await self._pub(call)
            case "take":
                return await self._take(call)
            case "ack":
                await self._ack(call, call.ids)
                return 200, None
            case "query":
                return await self._query(call)
            case "create" | "remove":
                self._channel(self._topic(call), call)
                return 200, None
            case "ping":
                return 200, None
        raise NotFound(f"Command({call.cmd}) Not Found")

    def _topic(self, call: wire.Call) -> TopicConfig:
        topic = next((t for t in self.server.config.topics if t.name == call.mq), None)
        if topic is None:
            raise NotFound(f"MQ({call.mq}) Not Found")
        return topic

    def _channel(self, topic: TopicConfig, call: wire.Call) -> str | None:
        """The channel a call names, if it names one: a Pull subscriber of the topic."""
        if call.channel is None:
            return None
        if call.channel not in topic.subscribers or not self.server.subscriber(call.channel).pull:
            raise NotFound(f"Channel({call.channel}) Not Found")
        return call.channel

    async def _call(self, request: p.Request) -> p.Reply:
        """Apply a request as ServerSocket would, and wait for its commit; its error, raised."""
        reply = await self.server.writer.call(Guarded(request, self.authorize))
        if reply.status != 200:
            raise _error(reply)
        return reply

    async def _pub(self, call: wire.Call) -> tuple[int, Any]:
        topic = self._topic(call)
        message = p.Message(
            payload=msgspec.Raw(msgspec.json.encode(call.body)),
            key=call.key,
            priority=call.priority or 0,
            ttl_s=call.ttl,
        )
        await self._call(p.Request(topic=topic.name, messages=[message]))
        return 200, None

    async def _take(self, call: wire.Call) -> tuple[int, Any]:
        topic = self._topic(call)
        channel = self._channel(topic, call)
        assert channel is not None, "a take names its channel (wire.call_of)"
        mode = self.server.subscriber(channel).zbus_ack
        held = self.unacked.pop((topic.name, channel), [])
        request = p.Request(
            topic=topic.name,
            subscriber=channel,
            acks=held or None,
            command="TAKE",
            count=call.window,
            wait=0,
            id=REPLY_ID,
        )
        reply = await self.server.takes.take(self.taker, request, self.authorize)
        if reply.status != 200:
            raise _error(reply)
        taken = taken_of(reply)
        keys = [m.key for m in taken]
        if mode == "delivery" and keys:
            await self._ack(call, keys)
        elif mode == "window" and keys:
            self.unacked[(topic.name, channel)] = keys
        if not taken:
            return wire.EMPTY, []
        left = len(taken)
        return 200, [wire.delivered(topic.name, channel, m.key, m.payload, (left := left - 1)) for m in taken]

    async def _sub(self, call: wire.Call) -> tuple[int, Any] | None:
        """The first sub to an mq and channel is answered; a later one only
        sets the credit anew (a zbus client's window refresh). With ZbusAck:
        window, each acks what was pushed or taken here on that channel before it."""
        topic = self._topic(call)
        channel = self._channel(topic, call)
        assert channel is not None, "a sub names its channel (wire.call_of)"
        key = (topic.name, channel)
        held = self.unacked.pop(key, [])
        if held:
            await self._call(p.Request(topic=topic.name, subscriber=channel, acks=held))
        sub = self.subs.get(key)
        if sub is None:
            push = partial(self._push, topic.name, channel, self.server.subscriber(channel).zbus_ack, self.authorize)
            sub = self.subs[key] = Subscription(self.server.takes, self.taker, topic.name, channel, self.authorize, push, self.where)
            sub.refresh(call.window)
            return 200, None
        sub.refresh(call.window)
        return None

    async def _push(self, mq: str, channel: str, mode: str, check: Callable[[p.Request], None], messages: list[Taken], credit: int) -> None:
        """Messages a subscription took, written with the credit left after each."""
        while self.waiting_id is not None and any(m.key == self.waiting_id for m in messages):
            await self.replied.wait()
        if not self.stream.open:
            return
        left = credit + len(messages)
        for m in messages:
            left -= 1
            self.out.write(self.stream.reply_ws(wire.delivered(mq, channel, m.key, m.payload, left)))
        await self.out.drain()
        keys = [m.key for m in messages]
        if mode == "window":
            self.unacked.setdefault((mq, channel), []).extend(keys)
        elif mode == "delivery":
            reply = await self.server.writer.call(Guarded(p.Request(topic=mq, subscriber=channel, acks=keys), check))
            if reply.status != 200:
                log.warning("%s: acking pushed messages of %s/%s refused (%d): %s", self.where, mq, channel, reply.status, reply.error)

    async def _ack(self, call: wire.Call, keys: list[str]) -> None:
        topic = self._topic(call)
        channel = self._channel(topic, call)
        await self._call(p.Request(topic=topic.name, subscriber=channel, acks=keys))
        assert channel is not None, "an ack names its channel (wire.call_of)"
        held = self.unacked.get((topic.name, channel))
        if held:  # acked now, not again at the next take
            self.unacked[(topic.name, channel)] = [key for key in held if key not in keys]

    async def _query(self, call: wire.Call) -> tuple[int, Any]:
        """PROTOCOL §11 query: the topic's stored count and each channel's acked count."""
        topic = self._topic(call)
        channel = self._channel(topic, call)
        body = (await self._call(p.Request(topic=topic.name, command="STATUS", id=REPLY_ID))).body
        entry = body["Topics"][topic.name]
        channels = [
            {"name": name, "offset": entry["Subscribers"][name]["Acked"], "mask": 0, "filter": None}
            for name in topic.subscribers
            if self.server.subscriber(name).pull and name in entry["Subscribers"]
        ]
        if channel is not None:
            return 200, next(c for c in channels if c["name"] == channel)
        return 200, {"name": topic.name, "type": "disk", "size": entry["Stored"], "mask": 0, "channels": channels}


def _allowed(request: p.Request) -> None:
    """The check where no access rule applies."""


def _uid(user: str | int) -> int:
    """A ZbusKeys User's uid (checked to exist when the config loaded)."""
    if isinstance(user, int) or user.isdigit():
        return int(user)
    return pwd.getpwnam(user).pw_uid


def _error(reply: p.Reply) -> RequestError:
    """A broker's error reply as the error it stands for, status and text."""
    exc = RequestError(str(reply.error))
    exc.status = reply.status
    return exc


class ZbusServer(ProtocolListener):
    """Listens on ZbusSocket; `config` is replaced whole at every reload."""

    LISTENER = "ZbusSocket"
    PROTOCOL = "zbus"
    log = log

    def subscriber(self, name: str) -> SubscriberConfig:
        return next(s for s in self.config.subscribers if s.name == name)

    async def serve(self, peer: Peer | None, reader: asyncio.StreamReader, out: asyncio.StreamWriter, where: str) -> None:
        await ZbusConnection(self, peer, out, where).serve(reader)
        await out.drain()


class ZbusTcpServer(ZbusServer):
    """Listens on ZbusListen, HOST:PORT: the same protocol, every request but ping signed."""

    LISTENER = "ZbusListen"
