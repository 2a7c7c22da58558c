"""A broker's CPU per message at a paced rate, and asyncio's loop alone beside it.

    .venv/bin/python tools/paced.py [--messages 10000] [--rate 1000] [--runs 3] [--brokers ppmq,streams,protocol]
    .venv/bin/python tools/paced.py --instructions [--brokers ppmq]    # needs valgrind
    .venv/bin/python tools/paced.py --calls                            # ppmq's calls a message
    .venv/bin/python tools/paced.py --brokers ppmq,other --other 'other=CMD --dir {dir}'   # any broker beside it

ppmq's paced workload (`ppmq bench -w latency-fast`) with the smallest clients that
can drive it: a publisher sends a message a request on the server socket and waits
for the reply; two subscribers listen on sockets of their own and ack every batch
on the delivery connection. The brokers:

- `ppmq`: `ppmq serve`, Sync false, the journal on, as configured by default;
- `streams` and `protocol`: stand-ins on asyncio that answer each publish and
  write it, as a batch frame, to both subscribers, and do nothing else: no JSON
  decoding, no store, no journal. `streams` reads through StreamReader tasks, as
  ppmq did until it read in its protocol's callback; `protocol` in a bare
  asyncio.Protocol's, the cheapest the loop offers. Their CPU per message is a
  floor for any broker on asyncio's loop with this pattern.

The broker's CPU (from /proc) is counted from when the clients are ready to when
the last ack is in, the clients' beside it; runs of the brokers alternate.
`--instructions` runs the broker under valgrind's callgrind instead, at 20
messages a second (so that it keeps up), twice, and prints the difference in
instructions divided by the difference in messages: what one more message costs,
start-up cancelled out. CPU time on a shared machine varies by 10% from run to
run; this does not, so it tells apart changes of a few percent. At 20 messages a
second the broker's once-a-second work weighs 50 times more on a message than at
1,000, the same for every variant compared. `--calls` runs ppmq under
tools/callcount.py instead, at 500 messages a second, twice, and prints the
function calls one more message costs (Python functions and builtins, as
cProfile counts them), by module and by function.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from instructions import CALLGRIND, collected  # tools/, beside this script
from ppmq.bench.procs import cpu_s

SUBSCRIBERS = ("s0", "s1")
PAYLOAD = b'"' + b"x" * 198 + b'"'
REPLY = b'{"Id":1,"Status":200}\n'
VALGRIND_RATE = 20  # messages a second a broker under callgrind keeps up with
INSTRUCTION_RUNS = (200, 600)  # messages in the two runs whose difference is taken
CALLS_RATE, CALL_RUNS = 500, (2_000, 6_000)  # for --calls: the broker keeps up while profiled
CALLCOUNT = Path(__file__).with_name("callcount.py")
START_TIMEOUT_S = 120.0  # valgrind starts slowly
_KEY = re.compile(rb'"Key":("\d+")')  # a batch's generated keys, quoted


class _StandIn:
    """A stand-in broker's state: the subscribers' transports, and how many messages it pushed."""

    def __init__(self) -> None:
        self.outs: list[tuple[bytes, asyncio.WriteTransport]] = []
        self.pushed = 0

    def published(self, line: bytes, reply_to: asyncio.WriteTransport) -> None:
        reply_to.write(REPLY)
        self.pushed += 1
        for name, out in self.outs:
            out.write(b'{"Topic":"bench","Subscriber":"%s","Messages":[{"Key":"%d","Message":%s}]}\n' % (name, self.pushed, line))


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
    """`streams`: a task per connection that reads chunks and handles their lines."""
    buf = b""
    while data := await reader.read(1 << 16):
        *lines, buf = (buf + data).split(b"\n")
        for line in lines:
            handle(line, out)


async def stand_in(io: str, directory: Path) -> None:
    """Connect to both subscribers, then serve the publisher until SIGTERM."""
    loop = asyncio.get_running_loop()
    broker = _StandIn()

    def ignore(line: bytes, out: object) -> None:
        """The acks: read, and nothing more."""

    for name in SUBSCRIBERS:
        path = str(directory / f"{name}.sock")
        while not os.path.exists(path):
            await asyncio.sleep(0.01)
        if io == "streams":
            reader, out = await asyncio.open_unix_connection(path)
            loop.create_task(_read_lines(reader, out, ignore))
        else:
            out, _ = await loop.create_unix_connection(lambda: _Lines(ignore), path)
        broker.outs.append((name.encode(), out))
    if io == "streams":
        await asyncio.start_unix_server(lambda r, w: _read_lines(r, w, broker.published), str(directory / "s.sock"))
    else:
        await loop.create_unix_server(lambda: _Lines(broker.published), str(directory / "s.sock"))
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


def subscribe(directory: Path, name: str, messages: int) -> None:
    """Listen (bound under another name first, so that the broker never finds it
    not listening yet) and ack every batch, until `messages` are in."""
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
            keys = _KEY.findall(line)
            conn.sendall(b'{"Topic":"bench","Subscriber":"%s","Acks":[%s]}\n' % (name.encode(), b",".join(keys)))
            seen += len(keys)
    conn.close()
    print(json.dumps({"cpu_s": time.process_time()}), flush=True)


def publish(directory: Path, messages: int, rate: int) -> None:
    """A message a request, each waited for, paced as ppmq bench paces its latency workloads."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(directory / "s.sock"))
    replies = sock.makefile("rb")
    start = time.monotonic()
    for i in range(messages):
        wait = start + i / rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        sock.sendall(b'{"Topic":"bench","Id":1,"Messages":[{"Priority":%d,"Payload":%s}]}\n' % (i % 3, PAYLOAD))
        if b'"Status":200' not in replies.readline():
            sys.exit("the broker refused a publish")
    sock.close()
    print(json.dumps({"cpu_s": time.process_time()}), flush=True)


OTHERS: dict[str, str] = {}  # --other NAME=COMMAND: brokers run beside ppmq with the same clients


def _broker_argv(broker: str, directory: Path) -> list[str]:
    if broker in OTHERS:
        return [part.replace("{dir}", str(directory)) for part in OTHERS[broker].split()]
    if broker != "ppmq":
        return [sys.executable, __file__, "--role", "serve", broker, "--dir", str(directory)]
    config = {
        "ServerSocket": str(directory / "s.sock"),
        "DataPath": str(directory / "data"),
        "Sync": False,
        "Subscribers": [{"Name": s, "Socket": str(directory / f"{s}.sock")} for s in SUBSCRIBERS],
        "Topics": [{"Name": "bench", "Priorities": 3, "Subscribers": list(SUBSCRIBERS)}],
    }
    (directory / "ppmq.yaml").write_text(yaml.safe_dump(config))
    return [sys.executable, "-m", "ppmq.cli", "serve", "-c", str(directory / "ppmq.yaml")]


def _wait_listening(path: Path, broker: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(str(path))
                return
            except OSError:
                if broker.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the broker did not come up on {path}") from None
        time.sleep(0.05)


def run(broker: str, messages: int, rate: int, valgrind: bool = False, calls_to: Path | None = None) -> tuple[float, float, int | None]:
    """One run: the broker's and the clients' CPU seconds per 10,000 messages, and
    under valgrind the broker's instructions in all; with `calls_to`, the
    broker's calls are counted into that file."""
    with tempfile.TemporaryDirectory(prefix="ppmq-paced-") as d:
        directory = Path(d)
        argv = _broker_argv(broker, directory)
        if valgrind:
            argv = [*CALLGRIND, *argv]
        if calls_to is not None:
            argv = [argv[0], str(CALLCOUNT), str(calls_to), *argv[1:]]
        served = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONHASHSEED": "0"}
        )

        def client(*args: str) -> subprocess.Popen[str]:
            return subprocess.Popen(
                [sys.executable, __file__, "--role", *args, "--dir", d, "--messages", str(messages)], stdout=subprocess.PIPE, text=True
            )

        try:
            subscribers = [client("subscribe", name) for name in SUBSCRIBERS]
            _wait_listening(directory / "s.sock", served)
            cpu0 = cpu_s([served.pid])
            clients = [client("publish", str(rate)), *subscribers]
            client_cpu = [json.loads(c.communicate(timeout=messages / rate * 3 + 60)[0])["cpu_s"] for c in clients]
            cpu1 = cpu_s([served.pid])
        finally:
            served.send_signal(signal.SIGTERM)
            _, err = served.communicate(timeout=START_TIMEOUT_S)
    per_10k = 10_000 / messages
    return (cpu1 - cpu0) * per_10k, sum(client_cpu) * per_10k, collected(err)


def timed(brokers: list[str], messages: int, rate: int, runs: int) -> None:
    figures: dict[str, list[tuple[float, float]]] = {b: [] for b in brokers}
    for i in range(runs):
        for broker in brokers if i % 2 == 0 else reversed(brokers):
            cpu, clients, _ = run(broker, messages, rate)
            figures[broker].append((cpu, clients))
            print(f"run {i + 1}/{runs} {broker}: broker {cpu:.2f} CPU s/10k, clients {clients:.2f}", flush=True)
    print(f"\n{messages:,} messages at {rate:,}/s, medians of {runs}")
    print("broker    broker CPU s/10k  clients CPU s/10k")
    for broker, got in figures.items():
        print(f"{broker:<9} {statistics.median(r[0] for r in got):>16.2f} {statistics.median(r[1] for r in got):>18.2f}")


def instructions(brokers: list[str]) -> None:
    small, large = INSTRUCTION_RUNS
    for broker in brokers:
        counts = [run(broker, n, VALGRIND_RATE, valgrind=True)[2] for n in (small, large)]
        print(
            f"{broker}: {(counts[1] - counts[0]) / (large - small):,.0f} instructions a message ({small} and {large} messages at {VALGRIND_RATE}/s)",
            flush=True,
        )


# What each of ppmq's modules is for, as docs/performance.md splits a paced
# message's calls: a Python call counts where its function is, a builtin where
# the function calling it is.
CONCERNS = {
    "store rows": ("store/",),
    "counters": ("store/counters.py", "store/state.py"),
    "step bookkeeping": ("core/broker.py", "core/ops.py", "core/staging.py", "core/laning.py", "server/group_commit.py",
                         "server/gathering.py", "server/take_waits.py", "server/waiters.py", "server/metrics.py", "threading.py",
                         "asyncio/"),
    "publish, dispatch, ack": ("core/publish.py", "core/dispatch.py", "core/settlement.py", "core/queues.py", "core/pull.py",
                               "core/taker_holdings.py", "core/validate.py", "server/push.py", "server/parallel_push.py"),
    "framing, decoding, replies": ("protocol/", "server/requests.py", "server/connection.py"),
    "journal events": ("core/events.py", "server/journal.py", "server/journal_lines.py"),
    "config lookups": ("config.py", "core/topology.py"),
    "access checks": ("core/access.py",),
}  # fmt: skip


def concern_of(path: str) -> str:
    """The concern a source file's calls count under: its longest matching prefix."""
    where = path.split("/ppmq/", 1)[-1] if "/ppmq/" in path else "/".join(path.rsplit("/", 2)[-2:])
    best, length = "other", 0
    for concern, prefixes in CONCERNS.items():
        for prefix in prefixes:
            if (where.startswith(prefix) or where.endswith(prefix)) and len(prefix) > length:
                best, length = concern, len(prefix)
    return best


def calls() -> None:
    """ppmq's function calls a message: the difference of two profiled runs."""
    small, large = CALL_RUNS
    counted = []
    with tempfile.TemporaryDirectory(prefix="ppmq-calls-") as d:
        for n in (small, large):
            out = Path(d) / f"{n}.json"
            run("ppmq", n, CALLS_RATE, calls_to=out)
            counted.append({(where, name, caller): count for where, name, caller, count in json.loads(out.read_text())})
    per_message = {key: (count - counted[0].get(key, 0)) / (large - small) for key, count in counted[1].items()}
    python = sum(n for (where, _, _), n in per_message.items() if where != "<C>")
    builtin = sum(n for (where, _, _), n in per_message.items() if where == "<C>")
    print(f"ppmq: {python + builtin:,.0f} calls a message: {python:,.0f} to Python functions, {builtin:,.0f} to builtins")
    print(f"({small} and {large} messages at {CALLS_RATE}/s)\n\nby concern (Python calls + builtins they make):")
    concerns: dict[str, list[float]] = {}
    for (where, _, caller), n in per_message.items():
        python_call = where != "<C>"
        concerns.setdefault(concern_of(where if python_call else caller), [0.0, 0.0])[0 if python_call else 1] += n
    for concern, (py, c) in sorted(concerns.items(), key=lambda kv: -sum(kv[1])):
        print(f"{py + c:8.1f}  {concern} ({py:.0f} + {c:.0f})")
    print("\nby function:")
    functions: dict[tuple[str, str], float] = {}
    for (where, name, _), n in per_message.items():
        key = ("<C>" if where == "<C>" else where.split("/ppmq/", 1)[-1], name)
        functions[key] = functions.get(key, 0.0) + n
    for (where, name), n in sorted(functions.items(), key=lambda kv: -kv[1])[:50]:
        print(f"{n:8.1f}  {where}:{name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=10_000)
    ap.add_argument("--rate", type=int, default=1000, help="messages a second")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--brokers", default="ppmq,streams,protocol", help="comma-separated: ppmq, streams, protocol")
    ap.add_argument("--instructions", action="store_true", help="count the broker's instructions a message under callgrind")
    ap.add_argument("--calls", action="store_true", help="count ppmq's function calls a message (Python and builtins)")
    ap.add_argument(
        "--other", action="append", default=[], metavar="NAME=COMMAND",
        help="another broker to run with the same clients, named in --brokers: COMMAND (split on spaces, {dir} "
        "replaced by the run's directory) listens on {dir}/s.sock and pushes to {dir}/s0.sock and {dir}/s1.sock",
    )  # fmt: skip
    ap.add_argument("--role", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    OTHERS.update(other.split("=", 1) for other in args.other)
    if args.role:
        role, arg = args.role
        if role == "serve":
            asyncio.run(stand_in(arg, args.dir))
        elif role == "subscribe":
            subscribe(args.dir, arg, args.messages)
        else:
            publish(args.dir, args.messages, int(arg))
    elif args.calls:
        calls()
    elif args.instructions:
        instructions(args.brokers.split(","))
    else:
        timed(args.brokers.split(","), args.messages, args.rate, args.runs)


if __name__ == "__main__":
    main()
