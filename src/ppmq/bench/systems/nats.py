"""NATS JetStream: one file-backed stream, one durable pull consumer per subscriber.

The stream keeps a message while a consumer has not acked it (interest
retention), as ppmq does. Durable needs `sync_interval: always` (nats-server
2.10 and newer; the `bench` extra brings one): older servers fsync on a timer
only, and the bench says so in the version it reports. JetStream has no
priorities.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from ppmq.bench.service import Running, Service, free_port
from ppmq.bench.systems import IDLE_S, lacking
from ppmq.bench.workloads import Workload

NAME = "nats"
STREAM = SUBJECT = "bench"


def _server() -> str | None:
    """The nats-server next to this Python (from the bench extra) first, then PATH's."""
    beside = Path(sys.executable).parent / "nats-server"
    return str(beside) if beside.exists() else shutil.which("nats-server")


def missing() -> str | None:
    return lacking(_server(), "nats")


def _version(server: str) -> tuple[int, ...]:
    out = subprocess.run([server, "--version"], capture_output=True, text=True).stdout
    return tuple(int(x) for x in out.split("v")[-1].strip().split(".")[:3])


def start(tmp: Path, w: Workload) -> Running:
    server, port = _server(), free_port()
    assert server is not None, "missing() found it"
    version = _version(server)
    can_sync = version >= (2, 10)
    sync = "  sync_interval: always\n" if w.durable and can_sync else ""
    (tmp / "nats.conf").write_text(f'listen: "127.0.0.1:{port}"\njetstream {{\n  store_dir: "{tmp / "data"}"\n{sync}}}\n')
    service = Service([server, "-c", str(tmp / "nats.conf")], tmp)
    service.wait_tcp(port)
    if not w.durable:
        mode = "default sync_interval 2m"
    elif can_sync:
        mode = "sync_interval always"
    else:
        mode = "NOT fsynced per write: this version has no sync_interval"
    text = ".".join(map(str, version))
    return Running(service, {"url": f"nats://127.0.0.1:{port}"}, tmp / "data", f"NATS {text} JetStream ({mode})")


async def _jetstream(url: str):
    import nats

    nc = await nats.connect(url)
    return nc, nc.jetstream()


class Publisher:
    def __init__(self, address: dict, w: Workload) -> None:
        self.loop = asyncio.new_event_loop()
        self.nc, self.js = self.loop.run_until_complete(_jetstream(address["url"]))

    def publish(self, batch: list[tuple[int, bytes]]) -> None:
        self.loop.run_until_complete(self._publish(batch))

    async def _publish(self, batch: list[tuple[int, bytes]]) -> None:
        """All at once, then every PubAck: one batch in flight, as for the others."""
        await asyncio.gather(*(self.js.publish(SUBJECT, payload) for _, payload in batch))

    def close(self) -> None:
        self.loop.run_until_complete(self.nc.close())
        self.loop.close()


class Subscriber:
    def __init__(self, address: dict, w: Workload, index: int) -> None:
        self.url, self.name, self.count, self.window = address["url"], f"s{index}", w.batch, w.window
        self.loop = asyncio.new_event_loop()

    def prepare(self) -> None:
        self.loop.run_until_complete(self._subscribe())

    async def _subscribe(self) -> None:
        from nats.js.api import AckPolicy, ConsumerConfig, RetentionPolicy, StorageType

        self.nc, js = await _jetstream(self.url)
        await js.add_stream(name=STREAM, subjects=[SUBJECT], storage=StorageType.FILE, retention=RetentionPolicy.INTEREST)
        config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=self.window)
        self.sub = await js.pull_subscribe(SUBJECT, durable=self.name, stream=STREAM, config=config)

    def start(self) -> None:
        pass

    def batches(self) -> Iterator[list[bytes]]:
        while True:
            yield self.loop.run_until_complete(self._batch())

    async def _batch(self) -> list[bytes]:
        import nats.errors

        try:
            msgs = await self.sub.fetch(self.count, timeout=IDLE_S)
        except (nats.errors.TimeoutError, TimeoutError):  # nats-py raises either
            return []
        for m in msgs:
            await m.ack()
        return [m.data for m in msgs]

    def close(self) -> None:
        self.loop.run_until_complete(self.nc.close())
        self.loop.close()
