"""Redis Streams: one stream; one consumer group per subscriber (XADD, XREADGROUP, XACK).

Durable is `appendonly yes` with `appendfsync always`: Redis answers a write only
after the append-only file is fsynced. Fast is `appendfsync no`. Streams have no
priorities (the priority rides along as a field) and keep acknowledged entries
until trimmed; the bench does not trim, as a stream consumer would not per message.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from ppmq.bench.service import Running, Service
from ppmq.bench.systems import IDLE_S, lacking
from ppmq.bench.workloads import Workload

NAME = "redis"
STREAM = "bench"


def missing() -> str | None:
    return lacking(shutil.which("redis-server"), "redis")


def start(tmp: Path, w: Workload) -> Running:
    data, sock = tmp / "data", str(tmp / "redis.sock")
    data.mkdir()
    argv = [
        "redis-server",
        "--port",
        "0",
        "--unixsocket",
        sock,
        "--unixsocketperm",
        "700",
        "--dir",
        str(data),
        "--save",
        "",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always" if w.durable else "no",
    ]
    service = Service(argv, tmp)
    service.wait_unix(sock)
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
    mode = f"appendfsync {'always' if w.durable else 'no'}"
    return Running(service, {"unix": sock}, data, f"Redis {version.removeprefix('v=')} Streams ({mode}, {_client_library()})")


def _client_library() -> str:
    """redis-py as its users run it: with hiredis parsing replies (the bench extra
    installs it); without, the client would set the pace and flatter every peer."""
    import redis
    from redis.utils import HIREDIS_AVAILABLE

    return f"redis-py {redis.__version__}" + (" with hiredis" if HIREDIS_AVAILABLE else " WITHOUT hiredis")


def _client(address: dict):
    import redis

    return redis.Redis(unix_socket_path=address["unix"])


class Publisher:
    """A batch is one pipeline of XADDs: one round trip, every entry confirmed."""

    def __init__(self, address: dict, w: Workload) -> None:
        self.r = _client(address)

    def publish(self, batch: list[tuple[int, bytes]]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for prio, payload in batch:
            pipe.xadd(STREAM, {"p": payload, "r": prio})
        pipe.execute()

    def close(self) -> None:
        self.r.close()


class Subscriber:
    """XACK of a batch rides with the XREADGROUP of the next, in one round trip."""

    def __init__(self, address: dict, w: Workload, index: int) -> None:
        self.r = _client(address)
        self.group = f"s{index}"
        self.count = w.batch

    def prepare(self) -> None:
        self.r.xgroup_create(STREAM, self.group, id="0", mkstream=True)

    def start(self) -> None:
        pass

    def batches(self) -> Iterator[list[bytes]]:
        self.pending: list[bytes] = []
        while True:
            pipe = self.r.pipeline(transaction=False)
            if self.pending:
                pipe.xack(STREAM, self.group, *self.pending)
            pipe.xreadgroup(self.group, "c", {STREAM: ">"}, count=self.count, block=int(IDLE_S * 1000))
            reply = pipe.execute()[-1]
            entries = reply[0][1] if reply else []
            self.pending = [entry_id for entry_id, _ in entries]
            yield [fields[b"p"] for _, fields in entries]

    def close(self) -> None:
        """Ack the last batch, which no further read carries."""
        if getattr(self, "pending", None):
            self.r.xack(STREAM, self.group, *self.pending)
        self.r.close()
