"""`ppmq bridge to`: a Pull subscriber's messages into JetStream (PROTOCOL §10).

One task per topic the subscriber is on, each with its own broker connection (a
connection waiting in a TAKE is not read until it is answered, PROTOCOL §9) and
all on one NATS connection. A batch is acked to ppmq in the next TAKE, only once
JetStream has sent a PubAck for every message of it: a bridge killed in between
leaves the batch in flight, the broker gives it back at once, and the next bridge
publishes it again under the same Nats-Msg-Id, which JetStream drops as a
duplicate within the stream's duplicate window.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable
from functools import partial
from typing import Any

import msgspec

from ppmq.bridge.link import Link, Nats, nats_link, ppmq_link
from ppmq.client.library import DEFAULT_TIMEOUT_S, AsyncClient
from ppmq.client.results import Message
from ppmq.config import Config, TopicConfig

TAKE_COUNT = 256  # messages per TAKE: one round of PubAcks waited for together
TAKE_WAIT_S = 20.0  # a TAKE's Wait; the broker answers as soon as one message is ready

_encode = msgspec.json.encode


class TopicBridge:
    """One topic of the subscriber: take, publish, ack with the next take."""

    def __init__(self, topic: TopicConfig, subscriber: str, subject: str, ppmq: Link[AsyncClient], nats: Link[Nats]) -> None:
        self.topic, self.subscriber, self.subject = topic, subscriber, subject
        self.ppmq, self.nats = ppmq, nats

    async def run(self) -> None:
        acks: list[str] = []
        while True:
            batch = await self.ppmq.attempt(partial(self._take, acks=acks))
            if batch:
                await self.nats.attempt(partial(self._publish, batch=batch))
            acks = [m.key for m in batch]

    def _take(self, client: AsyncClient, acks: list[str]) -> Awaitable[list[Message]]:
        """The next batch, with the last one's acks."""
        return client.take(self.topic.name, self.subscriber, TAKE_COUNT, TAKE_WAIT_S, acks)

    async def _publish(self, conn: Nats, batch: list[Message]) -> None:
        """Every message at once, then every PubAck: an exception if any is missing."""
        await asyncio.gather(*(conn.js.publish(self.subject, _encode(m.payload), headers={"Nats-Msg-Id": self.msg_id(m)}) for m in batch))

    def msg_id(self, message: Message) -> str:
        """`topic:key`; on a Dedupe topic a key names every version of a message, so
        the version's Published instant (Metadata: true) is added, in nanoseconds."""
        msg_id = f"{self.topic.name}:{message.key}"
        if self.topic.dedupe and message.published is not None:
            msg_id += f":{published_ns(message.published)}"
        return msg_id


def published_ns(text: str) -> int:
    """The inverse of protocol.format_expires: RFC 3339 UTC, up to nanoseconds."""
    base, _, frac = text.removesuffix("Z").partition(".")
    seconds = dt.datetime.strptime(base, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.UTC).timestamp()
    return int(seconds) * 10**9 + int(frac.ljust(9, "0"))


def subscribed_topics(config: Config, subscriber: str) -> list[TopicConfig]:
    return [t for t in config.topics if subscriber in t.subscribers]


async def run(config: Config, url: str, subscriber: str, prefix: str) -> None:
    """Bridge every topic `subscriber` is on, until cancelled."""
    nats = nats_link(url)
    bridges = [
        TopicBridge(t, subscriber, prefix + t.name, ppmq_link(config.server_socket, DEFAULT_TIMEOUT_S), nats)
        for t in subscribed_topics(config, subscriber)
    ]
    try:
        await asyncio.gather(*(b.run() for b in bridges))
    finally:
        links: list[Link[Any]] = [nats, *(b.ppmq for b in bridges)]
        for link in links:
            await link.close()
