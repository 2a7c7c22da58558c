"""ppmq itself: `ppmq serve` on a Unix socket; subscribers listen on their own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import yaml

from ppmq.bench.service import Running, Service
from ppmq.bench.systems import IDLE_S
from ppmq.bench.workloads import Workload
from ppmq.client.library import Client

NAME = "ppmq"
TOPIC = "bench"
PULLED = "w"  # the Pull subscriber of the pull workload


def missing() -> str | None:
    return None


def start(tmp: Path, w: Workload) -> Running:
    subs = [PULLED] if w.pull else [f"s{i}" for i in range(w.subscribers)]
    kind = {"Pull": True} if w.pull else {}
    config: dict[str, Any] = {
        "ServerSocket": str(tmp / "ppmq.sock"),
        "DataPath": str(tmp / "data"),
        "Sync": w.durable,
        "RetryMax": "100ms",  # a backlog's subscribers come up once publishing ends
        "Subscribers": [
            {"Name": s, **(kind or {"Socket": str(tmp / f"{s}.sock")}), "BatchSize": w.batch, "Window": w.window} for s in subs
        ],
        "Topics": [{"Name": TOPIC, "Priorities": w.priorities, "Subscribers": subs, "Dedupe": w.dedupe}],
    }
    if w.metrics_s:
        config["Metrics"] = {"Textfile": str(tmp / "ppmq.prom"), "Interval": w.metrics_s}
    (tmp / "ppmq.yaml").write_text(yaml.safe_dump(config))
    service = Service([sys.executable, "-m", "ppmq.cli", "serve", "-c", str(tmp / "ppmq.yaml")], tmp)
    service.wait_unix(config["ServerSocket"])
    address = {"server": config["ServerSocket"], "subscribers": [s.get("Socket") for s in config["Subscribers"]]}
    acks = "acks to ServerSocket" if w.server_acks or w.pull else "acks on the delivery connection"
    dedupe = ", Dedupe with a Key a message" if w.dedupe else ""
    metrics = f", Metrics every {w.metrics_s:g}s" if w.metrics_s else ""
    return Running(
        service, address, tmp / "data", f"ppmq {_revision()} (Sync {str(w.durable).lower()}, Window {w.window}, {acks}{dedupe}{metrics})"
    )


def _revision() -> str:
    """The commit the broker runs from, when it runs from a git checkout."""
    here = Path(__file__).resolve().parent
    done = subprocess.run(["git", "-C", str(here), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "(no git)"


class Publisher:
    """One request per batch with an Id: the reply comes after the commit."""

    def __init__(self, address: dict, w: Workload) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(address["server"])
        self.file = self.sock.makefile("rb")
        self.head = b'{"Topic":"%s","Id":1,"Messages":[' % TOPIC.encode()
        self.dedupe = w.dedupe
        self.sent = 0

    def publish(self, batch: list[tuple[int, bytes]]) -> None:
        if self.dedupe:  # every key new: what a producer that may resend sends
            first, self.sent = self.sent, self.sent + len(batch)
            body = b",".join(
                b'{"Key":"k%d","Priority":%d,"Payload":"%s"}' % (first + i, prio, payload) for i, (prio, payload) in enumerate(batch)
            )
        else:
            body = b",".join(b'{"Priority":%d,"Payload":"%s"}' % (prio, payload) for prio, payload in batch)
        self.sock.sendall(self.head + body + b"]}\n")
        reply = msgspec.json.decode(self.file.readline())
        if reply.get("Status") != 200:
            raise RuntimeError(f"ppmq refused a publish: {reply}")

    def close(self) -> None:
        self.sock.close()


class _Batch(msgspec.Struct):
    Topic: str
    Subscriber: str
    Messages: list[dict[str, msgspec.Raw]]


class Subscriber:
    """Listens on its socket; acks each batch on the delivery connection, or one-way
    to ServerSocket (ppMQ's way) with `server_acks`."""

    def __init__(self, address: dict, w: Workload, index: int) -> None:
        self.path = address["subscribers"][index]
        self.backlog = w.backlog
        self.conn: socket.socket | None = None
        self.acks: socket.socket | None = None
        if w.server_acks:
            self.acks = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.acks.connect(address["server"])

    def prepare(self) -> None:
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)  # bound but not listening: the broker is refused
        if not self.backlog:
            self.listener.listen(1)

    def start(self) -> None:
        """The broker connects once it has messages for us (it may not have yet)."""
        if self.backlog:
            self.listener.listen(1)
        self.conn, _ = self.listener.accept()
        self.conn.settimeout(IDLE_S)

    def batches(self) -> Iterator[list[bytes]]:
        decode = msgspec.json.Decoder(_Batch).decode
        conn = self.conn
        assert conn is not None, "start() accepted it"
        ack = (self.acks or conn).sendall
        buf = b""
        while True:
            try:
                data = conn.recv(1 << 20)
            except TimeoutError:
                yield []
                continue
            if not data:
                return
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                batch = decode(line)
                keys = b",".join(bytes(m["Key"]) for m in batch.Messages)
                ack(b'{"Topic":"%s","Subscriber":"%s","Acks":[%s]}\n' % (batch.Topic.encode(), batch.Subscriber.encode(), keys))
                yield [bytes(m["Payload"]) for m in batch.Messages]

    def close(self) -> None:
        for sock in (self.conn, self.acks):
            if sock is not None:
                sock.close()
        self.listener.close()


class Taker:
    """A worker of the Pull subscriber: TAKEs up to a batch, waiting up to IDLE_S
    for one, and acks each batch in its next TAKE, as a worker would."""

    def __init__(self, address: dict, w: Workload, index: int) -> None:
        self.path = address["server"]
        self.count = w.batch
        self.client: Client  # made by prepare()
        self.acks: list[str] | None = None

    def prepare(self) -> None:
        self.client = Client(self.path, timeout_s=IDLE_S + 30)

    def start(self) -> None:
        pass

    def batches(self) -> Iterator[list[bytes]]:
        while True:
            taken = self.client.take(TOPIC, PULLED, self.count, IDLE_S, self.acks)
            self.acks = [m.key for m in taken]
            yield [m.payload.encode() for m in taken]

    def close(self) -> None:
        if self.acks:
            self.client.ack(TOPIC, PULLED, self.acks)
        self.client.close()
