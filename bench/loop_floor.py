"""What asyncio's event loop alone costs at 1,000 msg/s: ppmq's paced workload with no broker in it.

    .venv/bin/python bench/loop_floor.py [--messages 10000] [--rate 1000] [--runs 3] [--io streams,protocol]

A stand-in broker on asyncio, with ppmq's socket pattern at a paced rate (`ppmq bench -w latency-fast`):
a publisher sends a message a request on the server socket and waits for the reply; the stand-in
answers, and writes the message, as a batch frame, to two subscribers that listen on sockets of their
own and ack every batch on that delivery connection. It splits lines and does nothing else: no JSON
decoding, no store, no journal. So its CPU per message is a floor for any broker built on asyncio's
loop with this pattern, and what ppmq's own work costs is the difference with its `latency-fast`
figure. `--io streams` reads through StreamReader tasks, as ppmq does; `protocol` calls back from a
bare asyncio.Protocol, the cheapest the loop offers. Runs of the two alternate; the stand-in's CPU is
counted from the first publish to the last ack, the clients' (publisher and both subscribers) beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUBSCRIBERS = ("s0", "s1")
PAYLOAD = b'"' + b"x" * 198 + b'"'
REPLY = b'{"Id":1,"Status":200}\n'


class _Floor:
    """The stand-in's state: the subscribers' transports, and its CPU once the first publish came."""

    def __init__(self, messages: int) -> None:
        self.expected_acks = messages * len(SUBSCRIBERS)
        self.acks = 0
        self.pushed = 0
        self.outs: list[tuple[bytes, asyncio.WriteTransport]] = []
        self.started: resource.struct_rusage | None = None
        self.done = asyncio.get_running_loop().create_future()

    def published(self, line: bytes, reply_to: asyncio.WriteTransport) -> None:
        if self.started is None:
            self.started = resource.getrusage(resource.RUSAGE_SELF)
        reply_to.write(REPLY)
        self.pushed += 1
        for name, out in self.outs:
            out.write(b'{"Topic":"bench","Subscriber":"%s","Messages":[{"Key":"%d","Message":%s}]}\n' % (name, self.pushed, line))

    def acked(self, line: bytes) -> None:
        self.acks += 1
        if self.acks == self.expected_acks and not self.done.done():
            self.done.set_result(resource.getrusage(resource.RUSAGE_SELF))


class _Lines(asyncio.Protocol):
    """`protocol`: each line handled in the loop's read callback, no task woken."""

    def __init__(self, handle) -> None:
        self.handle = handle
        self.buf = b""

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        *lines, self.buf = (self.buf + data).split(b"\n")
        for line in lines:
            self.handle(line, self.transport)


async def _read_lines(reader: asyncio.StreamReader, out: asyncio.StreamWriter, handle) -> None:
    """`streams`: a task per connection that reads chunks, as ppmq's serve_requests does."""
    buf = b""
    while data := await reader.read(1 << 16):
        *lines, buf = (buf + data).split(b"\n")
        for line in lines:
            handle(line, out)


async def serve(io: str, directory: Path, messages: int) -> None:
    loop = asyncio.get_running_loop()
    floor = _Floor(messages)
    on_publish, on_ack = floor.published, (lambda line, _: floor.acked(line))
    if io == "streams":
        server = await asyncio.start_unix_server(lambda r, w: _read_lines(r, w, on_publish), str(directory / "s.sock"))
    else:
        server = await loop.create_unix_server(lambda: _Lines(on_publish), str(directory / "s.sock"))
    for name in SUBSCRIBERS:
        path = str(directory / f"{name}.sock")
        while not os.path.exists(path):
            await asyncio.sleep(0.01)
        if io == "streams":
            reader, out = await asyncio.open_unix_connection(path)
            loop.create_task(_read_lines(reader, out, on_ack))
        else:
            out, _ = await loop.create_unix_connection(lambda: _Lines(on_ack), path)
        floor.outs.append((name.encode(), out))
    (directory / "ready").touch()
    ended = await floor.done
    server.close()
    cpu_s = (ended.ru_utime + ended.ru_stime) - (floor.started.ru_utime + floor.started.ru_stime)
    print(json.dumps({"cpu_s": cpu_s}), flush=True)


def subscribe(directory: Path, name: str, messages: int) -> None:
    """Listen (bound under a temporary name, so the stand-in never finds it not listening yet) and ack every batch."""
    path = directory / f"{name}.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path) + ".tmp")
    listener.listen(1)
    os.rename(str(path) + ".tmp", path)
    conn, _ = listener.accept()
    buf, seen = b"", 0
    while seen < messages and (data := conn.recv(1 << 16)):
        *lines, buf = (buf + data).split(b"\n")
        for line in lines:
            key = line.split(b'"Key":"', 1)[1].split(b'"', 1)[0]
            conn.sendall(b'{"Topic":"bench","Subscriber":"%s","Acks":["%s"]}\n' % (name.encode(), key))
            seen += 1
    conn.close()
    print(json.dumps({"cpu_s": time.process_time()}), flush=True)


def publish(directory: Path, messages: int, rate: int) -> None:
    """A message a request, each waited for, paced as ppmq bench paces its latency workloads."""
    while not (directory / "ready").exists():
        time.sleep(0.01)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(directory / "s.sock"))
    replies = sock.makefile("rb")
    start = time.monotonic()
    for i in range(messages):
        wait = start + i / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        sock.sendall(b'{"Topic":"bench","Id":1,"Messages":[{"Priority":%d,"Payload":%s}]}\n' % (i % 3, PAYLOAD))
        replies.readline()
    sock.close()
    print(json.dumps({"cpu_s": time.process_time()}), flush=True)


def run(io: str, messages: int, rate: int) -> tuple[float, float]:
    """One run: the stand-in's and the clients' CPU seconds per 10,000 messages."""
    me = [sys.executable, __file__]
    with tempfile.TemporaryDirectory(prefix="ppmq-floor-") as d:

        def role(*args: str) -> subprocess.Popen[str]:
            return subprocess.Popen([*me, "--role", *args, "--dir", d, "--messages", str(messages)], stdout=subprocess.PIPE, text=True)

        procs = [role("serve", io)] + [role("subscribe", name) for name in SUBSCRIBERS] + [role("publish", str(rate))]
        cpu = [json.loads(p.communicate(timeout=messages / rate * 3 + 60)[0])["cpu_s"] for p in procs]
    per_10k = 10_000 / messages
    return cpu[0] * per_10k, sum(cpu[1:]) * per_10k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--rate", type=int, default=1000, help="messages a second")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--io", default="streams,protocol", help="comma-separated: streams, protocol")
    ap.add_argument("--role", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        role, arg = args.role
        if role == "serve":
            asyncio.run(serve(arg, args.dir, args.messages))
        elif role == "subscribe":
            subscribe(args.dir, arg, args.messages)
        else:
            publish(args.dir, args.messages, int(arg))
        return
    modes = args.io.split(",")
    figures: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
    for i in range(args.runs):
        for mode in modes if i % 2 == 0 else reversed(modes):
            figures[mode].append(run(mode, args.messages, args.rate))
            print(f"run {i + 1}/{args.runs} {mode}: stand-in {figures[mode][-1][0]:.2f} CPU s/10k, clients {figures[mode][-1][1]:.2f}", flush=True)
    print(f"\n{args.messages:,} messages at {args.rate:,}/s, medians of {args.runs}")
    print("io        stand-in CPU s/10k  clients CPU s/10k")
    for mode, runs in figures.items():
        print(f"{mode:<9} {statistics.median(r[0] for r in runs):>18.2f} {statistics.median(r[1] for r in runs):>18.2f}")


if __name__ == "__main__":
    main()
