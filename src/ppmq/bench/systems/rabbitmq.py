"""RabbitMQ: a fanout exchange to one durable priority queue per subscriber.

Durable publishes persistent messages, fast transient ones; publisher confirms
in both, so a batch is confirmed (for persistent messages: on disk) before the
next. Subscribers prefetch as many messages as ppmq's window and ack each batch
with one `multiple` ack.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ppmq.bench.service import Running, Service, free_port
from ppmq.bench.systems import IDLE_S, lacking
from ppmq.bench.workloads import Workload

NAME = "rabbitmq"
EXCHANGE = "bench"
SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # the real one; /usr/sbin's insists on user rabbitmq


def missing() -> str | None:
    return lacking(SERVER, "aio_pika")


def start(tmp: Path, w: Workload) -> Running:
    port = free_port()
    (tmp / "enabled_plugins").write_text("[].\n")
    env = {
        "HOME": str(tmp),  # its Erlang cookie
        "RABBITMQ_MNESIA_BASE": str(tmp / "data"),
        "RABBITMQ_LOG_BASE": str(tmp / "log"),
        "RABBITMQ_NODENAME": f"bench{port}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(free_port()),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(tmp / "enabled_plugins"),
        "RABBITMQ_PLUGINS_EXPAND_DIR": str(tmp / "plugins"),
        "RABBITMQ_CONFIG_FILE": str(tmp / "rabbitmq"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(tmp / "advanced.config"),
    }
    service = Service([SERVER], tmp, env)
    service.wait_tcp(port)
    version = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"], capture_output=True, text=True).stdout
    mode = "persistent" if w.durable else "transient"
    return Running(service, {"url": f"amqp://guest:guest@127.0.0.1:{port}/"}, tmp / "data", f"RabbitMQ {version} ({mode}, confirms)")


async def _channel(url: str, confirms: bool):
    import aio_pika

    conn = await aio_pika.connect(url)
    channel = await conn.channel(publisher_confirms=confirms)
    exchange = await channel.declare_exchange(EXCHANGE, aio_pika.ExchangeType.FANOUT, durable=True)
    return conn, channel, exchange


class Publisher:
    def __init__(self, address: dict, w: Workload) -> None:
        import aio_pika

        self.loop = asyncio.new_event_loop()
        self.conn, _, self.exchange = self.loop.run_until_complete(_channel(address["url"], confirms=True))
        self.mode = aio_pika.DeliveryMode.PERSISTENT if w.durable else aio_pika.DeliveryMode.NOT_PERSISTENT
        self.top = w.priorities - 1  # AMQP: larger is more urgent; ppmq: 0 is

    def publish(self, batch: list[tuple[int, bytes]]) -> None:
        self.loop.run_until_complete(self._publish(batch))

    async def _publish(self, batch: list[tuple[int, bytes]]) -> None:
        """All at once, then every confirm: one batch in flight, as for the others."""
        import aio_pika

        sends = (
            self.exchange.publish(aio_pika.Message(payload, delivery_mode=self.mode, priority=self.top - prio), routing_key="")
            for prio, payload in batch
        )
        await asyncio.gather(*sends)

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()


class Subscriber:
    def __init__(self, address: dict, w: Workload, index: int) -> None:
        self.url, self.name, self.w = address["url"], f"s{index}", w
        self.loop = asyncio.new_event_loop()
        self.inbox: asyncio.Queue[Any]  # made by start(), on the loop it consumes on

    def prepare(self) -> None:
        self.loop.run_until_complete(self._declare())

    async def _declare(self) -> None:
        self.conn, channel, exchange = await _channel(self.url, confirms=False)
        await channel.set_qos(prefetch_count=self.w.window)
        self.queue = await channel.declare_queue(self.name, durable=True, arguments={"x-max-priority": self.w.priorities})
        await self.queue.bind(exchange)

    def start(self) -> None:
        self.inbox = asyncio.Queue()
        self.loop.run_until_complete(self.queue.consume(self.inbox.put))

    def batches(self) -> Iterator[list[bytes]]:
        while True:
            yield self.loop.run_until_complete(self._batch())

    async def _batch(self) -> list[bytes]:
        """What has arrived, at most a batch, waiting for the first; acked at once."""
        try:
            messages = [await asyncio.wait_for(self.inbox.get(), IDLE_S)]
        except TimeoutError:
            return []
        while len(messages) < self.w.batch and not self.inbox.empty():
            messages.append(self.inbox.get_nowait())
        await messages[-1].ack(multiple=True)
        return [m.body for m in messages]

    def close(self) -> None:
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()
