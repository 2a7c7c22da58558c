"""The PHPMQ listener (PROTOCOL §9): PhpmqSocket's connections, frames to ops.

A PHPMQ queue is the ppmq topic of that name, and what its consumers take,
ack, re-queue and dead-letter is the topic's `PhpmqSubscriber`'s. Each frame
becomes the op a ppmq client would send, with the same access check as on
ServerSocket, and is applied before the next frame is read: so a send (001) is
committed, and durable with Sync, before the broker looks at anything after it.
A consume request (002) is the exception: it sets what the connection's
Consumer (server/phpmq_consume.py) keeps in flight, and the dispatches (003) come from
that Consumer's task while the connection's next frames are read.

The protocol has no replies, so whatever ppmq would answer with an error closes
the connection, logged: a bad frame (counted in `Rejected` as a bad request on
ServerSocket is), a queue that does not exist (counted in `UnknownQueue` too,
so that an operator finds a producer's typo), a refused request. The client
notices the close, and no message it sent is silently dropped.

Connections count toward MaxConnections with ServerSocket's
(server/connection_limit.py); one over it is closed at once, before a byte is read.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable

import msgspec
from msgspec import UNSET

from ppmq.config import TopicConfig
from ppmq.core.access import Peer
from ppmq.core.ops import Guarded, Invalid, Op, Requeue
from ppmq.errors import BadFrame, BadRequest, FrameTooLarge, Refused, TooLarge, UnknownQueue
from ppmq.protocol import messages as p
from ppmq.protocol import phpmq as wire
from ppmq.server.phpmq_consume import Consumer, Wanted
from ppmq.server.protocol_listener import ProtocolListener, read_within

log = logging.getLogger("ppmq.phpmq")

LISTENER = "PhpmqSocket"  # its name in the connection counts (STATUS Listeners)


class PhpmqConnection:
    """One client on PhpmqSocket: its frames, applied one at a time, and its
    consuming (server/phpmq_consume.py), which runs beside them."""

    def __init__(self, server: PhpmqServer, peer: Peer, out: asyncio.StreamWriter, where: str) -> None:
        self.server = server
        self.where = where
        guard = server.policy.guard(peer, where) if server.policy is not None else None
        self.authorize: Callable[[p.Request], None] = guard or (lambda req: None)
        self.consumer = Consumer(server.takes, out, self.authorize, where)

    async def serve(self, reader: asyncio.StreamReader) -> None:
        """Until EOF, a bad frame or a refusal; each frame is applied (and
        committed) before the next is decoded. A frame must arrive whole within
        ReadTimeout of its first byte, as on ServerSocket."""
        decoder = wire.Decoder(self.server.config.max_frame_bytes)
        started = None  # monotonic time the pending partial frame began
        try:
            while True:
                frame = decoder.next_frame()
                if frame is not None:
                    started = None
                    await self.apply(frame)
                    continue
                timeout_s = self.server.config.read_timeout
                if decoder.pending and started is None:
                    started = time.monotonic()
                data = await read_within(reader, timeout_s and started and started + timeout_s)
                if data is None:
                    raise BadFrame(f"frame not complete within ReadTimeout ({timeout_s:g}s)")
                if not data:
                    if decoder.pending:
                        log.info("%s: closed in the middle of a PHPMQ frame; the partial frame is dropped", self.where)
                    return
                decoder.feed(data)
        except BadFrame as exc:
            self._reject(exc)
        except Refused as exc:
            log.warning("%s: %s; closing the connection", self.where, exc)
        finally:
            await self.consumer.close()

    def _reject(self, exc: BadFrame) -> None:
        """Count a bad frame in Rejected, as the writer counts every bad request,
        and one naming an unknown queue in the listener's UnknownQueue."""
        log.warning("%s: bad PHPMQ frame: %s; closing the connection", self.where, exc)
        if isinstance(exc, UnknownQueue):
            self.server.unknown_queue += 1
        error = TooLarge(str(exc)) if isinstance(exc, FrameTooLarge) else BadRequest(f"PHPMQ: {exc}")
        self.server.writer.submit(Invalid(error, UNSET))

    async def apply(self, frame: wire.Frame) -> None:
        """One frame, as the op a ppmq client would send for it; Refused if
        the broker answers it with an error."""
        topic = self._queue(frame)
        if frame.type == wire.SEND:
            await self._call(self._guarded(p.Request(topic=topic.name, messages=[_message(topic, frame)])), "send")
            return
        sub = _phpmq_subscriber(topic)
        if frame.type == wire.CONSUME:
            assert frame.count is not None, "a 002 has a count (phpmq_codec.PACKETS)"
            self.consumer.consume(Wanted(topic.name, sub, frame.count, topic.phpmq_dispatch_ttl))
            return
        message_id = frame.message_id
        assert message_id is not None, "a 004, 005 and 006 have a message id (wire.PACKETS)"
        if frame.type == wire.ACK:
            await self._call(self._guarded(p.Request(topic=topic.name, subscriber=sub, acks=[message_id])), "ack")
        elif frame.type == wire.DEAD_LETTER:
            await self._call(self._guarded(p.Request(topic=topic.name, subscriber=sub, rejects=[message_id])), "dead letter")
        else:
            await self._call(self._requeue(topic.name, sub, message_id, frame.ttl_s), "re-queue")
        self.consumer.settled(topic.name, message_id)

    def _queue(self, frame: wire.Frame) -> TopicConfig:
        """The topic a frame's queue names, in the config in force; a queue that
        does not exist is a bad frame."""
        topic = next((t for t in self.server.config.topics if t.name == frame.queue), None)
        if topic is None:
            raise UnknownQueue(f"queue {frame.queue[:200]!r} does not exist (no such topic)")
        if frame.type != wire.SEND and topic.phpmq_subscriber is None:
            raise BadFrame(f"queue {topic.name!r} cannot be consumed: its topic has no PhpmqSubscriber")
        return topic

    def _guarded(self, request: p.Request) -> Op:
        return Guarded(request, self.authorize)

    def _requeue(self, topic: str, sub: str, key: str, ttl_s: int) -> Requeue:
        """A re-queue is checked as the Nacks it resembles: the subscriber's Users."""
        return Requeue(topic, sub, key, ttl_s, lambda: self.authorize(p.Request(topic=topic, subscriber=sub, nacks=[key])))

    async def _call(self, op: Op, what: str) -> p.Reply:
        """Apply op and wait for its commit; Refused unless the broker took it."""
        reply = await self.server.writer.call(op)
        if reply.status != 200:
            raise Refused(f"PHPMQ {what} refused ({reply.status}): {reply.error}")
        return reply


def _phpmq_subscriber(topic: TopicConfig) -> str:
    assert topic.phpmq_subscriber is not None, "checked by _queue"
    return topic.phpmq_subscriber


def _message(topic: TopicConfig, frame: wire.Frame) -> p.Message:
    """A send's message: the content as a JSON string, the TTL (0: none); on a
    Dedupe topic, where the key is the client's to give and PHPMQ gives none, a
    random one shaped like the published server's IDs (32 hex digits)."""
    return p.Message(
        payload=msgspec.Raw(msgspec.json.encode(frame.content)),
        ttl_s=frame.ttl_s or None,
        key=uuid.uuid4().hex if topic.dedupe else None,
    )


class PhpmqServer(ProtocolListener):
    """Listens on PhpmqSocket; `config` is replaced whole at every reload."""

    LISTENER = LISTENER
    PROTOCOL = "PHPMQ"
    log = log
    unknown_queue = 0  # frames naming a queue that does not exist, since the start (STATUS Listeners)

    async def serve(self, peer: Peer | None, reader: asyncio.StreamReader, out: asyncio.StreamWriter, where: str) -> None:
        assert peer is not None, "PhpmqSocket is a Unix socket"
        await PhpmqConnection(self, peer, out, where).serve(reader)

    def complete_status(self, listeners: dict[str, dict[str, int]]) -> None:
        """STATUS `Listeners`: this listener's entry gains `UnknownQueue`."""
        listeners.setdefault(LISTENER, {})["UnknownQueue"] = self.unknown_queue
