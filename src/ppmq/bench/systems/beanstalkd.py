"""beanstalkd: one tube per subscriber, since it has no fan-out.

Durable is `-b DIR -f 0` (binlog, fsync before every reply), fast `-b DIR -F`.
The client speaks the text protocol itself so that a batch is one write and
its replies one read, as the other systems' clients pipeline theirs.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

from ppmq.bench.service import Running, Service, free_port
from ppmq.bench.systems import IDLE_S, lacking
from ppmq.bench.workloads import Workload

NAME = "beanstalkd"
TTR_S = 600  # a reserved job returns to ready after this; far beyond any run


def missing() -> str | None:
    return lacking(shutil.which("beanstalkd"))


def start(tmp: Path, w: Workload) -> Running:
    data, port = tmp / "data", free_port()
    data.mkdir()
    sync = ["-f", "0"] if w.durable else ["-F"]
    service = Service(["beanstalkd", "-l", "127.0.0.1", "-p", str(port), "-b", str(data), "-z", str(1 << 20), *sync], tmp)
    service.wait_tcp(port)
    version = subprocess.run(["beanstalkd", "-v"], capture_output=True, text=True).stdout.split()[-1]
    return Running(service, {"port": port}, data, f"beanstalkd {version} ({'-f 0' if w.durable else '-F'})")


class _Conn:
    """A beanstalkd connection that sends commands in bulk and reads replies in order."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def line(self) -> bytes:
        return self.file.readline().rstrip(b"\r\n")

    def expect(self, n: int, word: bytes) -> None:
        for _ in range(n):
            reply = self.line()
            if not reply.startswith(word):
                raise RuntimeError(f"beanstalkd: expected {word!r}, got {reply!r}")

    def job(self) -> tuple[bytes, bytes] | None:
        """The reply to a reserve: (id, body), or None when it timed out."""
        reply = self.line()
        if reply == b"TIMED_OUT":
            return None
        _, job_id, size = reply.split()
        body = self.file.read(int(size) + 2)[:-2]
        return job_id, body

    def close(self) -> None:
        self.sock.close()


class Publisher:
    """Every message goes into each subscriber's tube; a batch is one write."""

    def __init__(self, address: dict, w: Workload) -> None:
        self.conn = _Conn(address["port"])
        self.tubes = [b"s%d" % i for i in range(w.subscribers)]

    def publish(self, batch: list[tuple[int, bytes]]) -> None:
        out = []
        for tube in self.tubes:
            out.append(b"use %s\r\n" % tube)
            out += [b"put %d 0 %d %d\r\n%s\r\n" % (prio, TTR_S, len(payload), payload) for prio, payload in batch]
        self.conn.send(b"".join(out))
        for _ in self.tubes:
            self.conn.expect(1, b"USING")
            self.conn.expect(len(batch), b"INSERTED")

    def close(self) -> None:
        self.conn.close()


class Subscriber:
    """Reserves up to a batch (waiting for the first), then deletes them in one write."""

    def __init__(self, address: dict, w: Workload, index: int) -> None:
        self.conn = _Conn(address["port"])
        self.tube = b"s%d" % index
        self.count = w.batch

    def prepare(self) -> None:
        self.conn.send(b"watch %s\r\nignore default\r\n" % self.tube)
        self.conn.expect(2, b"WATCHING")

    def start(self) -> None:
        pass

    def batches(self) -> Iterator[list[bytes]]:
        reserve = b"reserve-with-timeout %d\r\n" % IDLE_S + b"reserve-with-timeout 0\r\n" * (self.count - 1)
        while True:
            self.conn.send(reserve)
            jobs = [job for job in (self.conn.job() for _ in range(self.count)) if job is not None]
            if not jobs:
                yield []
                continue
            self.conn.send(b"".join(b"delete %s\r\n" % job_id for job_id, _ in jobs))
            self.conn.expect(len(jobs), b"DELETED")
            yield [body for _, body in jobs]

    def close(self) -> None:
        self.conn.close()
