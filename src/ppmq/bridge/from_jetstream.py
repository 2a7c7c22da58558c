"""`ppmq bridge from`: a durable JetStream pull consumer into a ppmq topic (PROTOCOL §10).

A fetched batch is published to the topic in one request, and acked to JetStream
only once the broker answered 200, which it does once the batch is committed. A
bridge killed in between leaves the batch unacked: JetStream delivers it again
after the consumer's AckWait. The stream and the consumer are the operator's, so
the bridge binds to them and never creates or changes one.

Each message carries a Key, used where the topic has Dedupe (elsewhere the
broker assigns keys): the message's Nats-Msg-Id header when it has one, else
`STREAM:SEQUENCE`, so a redelivered message replaces its own stored copy.
"""

from __future__ import annotations

from collections.abc import Awaitable
from functools import partial
from typing import Any

import msgspec

from ppmq.bridge.link import Link, Nats, log, nats_link, ppmq_link
from ppmq.client.library import DEFAULT_TIMEOUT_S, AsyncClient
from ppmq.client.results import PublishResult

FETCH_COUNT = 256  # messages per fetch, published to ppmq in one request
FETCH_WAIT_S = 5.0  # how long a fetch waits for a first message before asking again


def ppmq_message(msg: Any) -> dict[str, Any]:
    """A NATS message as a ppmq one: the payload as JSON if it parses, else as a string."""
    try:
        msgspec.json.decode(msg.data)
        payload: Any = msgspec.Raw(msg.data)
    except msgspec.DecodeError:
        payload = msg.data.decode("utf-8", errors="replace")  # a JSON string holds text only
    key = (msg.headers or {}).get("Nats-Msg-Id") or f"{msg.metadata.stream}:{msg.metadata.sequence.stream}"
    return {"Key": key, "Payload": payload}


class FromBridge:
    """Fetch, publish to the topic, ack; over and over."""

    def __init__(self, nats: Link[Nats], ppmq: Link[AsyncClient], topic: str) -> None:
        self.nats, self.ppmq, self.topic = nats, ppmq, topic

    async def run(self) -> None:
        while True:
            batch = await self.nats.attempt(_fetch)
            if not batch:
                continue
            messages = [ppmq_message(m) for m in batch]
            await self.ppmq.attempt(partial(self._publish, messages=messages))
            await _ack(batch)

    def _publish(self, client: AsyncClient, messages: list[dict[str, Any]]) -> Awaitable[PublishResult]:
        return client.publish(self.topic, messages)


async def _fetch(conn: Nats) -> list[Any]:
    import nats.errors

    try:
        return await conn.sub.fetch(FETCH_COUNT, timeout=FETCH_WAIT_S)
    except nats.errors.TimeoutError:
        return []


async def _ack(batch: list[Any]) -> None:
    """Ack on the connection the batch came on. If that one is gone, so are the
    acks: JetStream redelivers the batch after AckWait and it is published again;
    the next fetch finds the connection lost and reopens it."""
    try:
        for m in batch:
            await m.ack()
    except Exception as exc:
        log.warning("acks of %d messages lost (%s): JetStream delivers them again", len(batch), exc)


async def run(server_socket: str, url: str, stream: str, consumer: str, topic: str) -> None:
    """Bridge the consumer into `topic`, until cancelled."""

    async def bind(conn: Nats) -> None:
        conn.sub = await conn.js.pull_subscribe_bind(durable=consumer, stream=stream)

    nats, ppmq = nats_link(url, bind), ppmq_link(server_socket, DEFAULT_TIMEOUT_S)
    try:
        await FromBridge(nats, ppmq, topic).run()
    finally:
        await nats.close()
        await ppmq.close()
