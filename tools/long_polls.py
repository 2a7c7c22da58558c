"""What idle long polls cost the broker (PROTOCOL §9 TAKE with Wait), and how soon one is answered.

    .venv/bin/python tools/long_polls.py [--polls 1000] [--seconds 30]
    .venv/bin/python tools/long_polls.py --latency 500

Starts `ppmq serve` (Sync: true) with one Pull subscriber and nothing published,
opens `--polls` connections that each send one TAKE with a Wait longer than the
measurement, checks in STATUS that all of them wait, then reads the broker's
user+system CPU from /proc/PID/stat over `--seconds` and prints it as a share of
one core. A waiting TAKE lives on the event loop as a future and a timer: no
step, no wake-up until a message can be taken, so the figure should be near 0.

`--latency N`: one worker waits in a TAKE (acking the message it took before)
while the publisher sends one message at a time, N times, 5 ms after the
worker's last reply; prints the percentiles of the time from the publish to
the TAKE's reply, which takes a commit, so an fsync, at least.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from ppmq.client.library import Client

TAKE = b'{"Id":1,"Topic":"t","Subscriber":"w","Command":"TAKE","Count":10,"Wait":%d}\n'


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(tmp: Path) -> tuple[subprocess.Popen, str]:
    config = {
        "ServerSocket": str(tmp / "ppmq.sock"),
        "DataPath": str(tmp / "data"),
        "Subscribers": [{"Name": "w", "Pull": True}],
        "Topics": [{"Name": "t", "Subscribers": ["w"]}],
    }
    (tmp / "ppmq.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([sys.executable, "-m", "ppmq.cli", "serve", "-c", str(tmp / "ppmq.yaml")])
    deadline = time.monotonic() + 15
    while not os.path.exists(config["ServerSocket"]):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("the broker did not start")
        time.sleep(0.05)
    return proc, config["ServerSocket"]


def waiting(path: str) -> int:
    with Client(path) as c:
        return c.status().topics["t"].subscribers["w"].waiting_takes or 0


def latency(path: str, n: int) -> list[float]:
    """Seconds from each publish to the reply of the TAKE that waited for it."""
    answered: list[float] = []

    def work() -> None:
        acks: list[str] = []
        with Client(path, timeout_s=60) as c:
            for _ in range(n):
                acks = [m.key for m in c.take("t", "w", count=10, wait_s=30, acks=acks)]
                answered.append(time.monotonic())

    worker = threading.Thread(target=work)
    worker.start()
    sent = []
    with Client(path) as c:
        for i in range(n):
            time.sleep(0.005)  # the worker's ack and TAKE are in, and it waits
            sent.append(time.monotonic())
            c.publish("t", [{"Payload": i}])
            while len(answered) <= i and worker.is_alive():
                time.sleep(0.0005)
    worker.join(60)
    return [a - s for s, a in zip(sent, answered)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--polls", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--latency", type=int, default=0, help="measure this many publishes to a waiting TAKE instead")
    args = ap.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the broker inherits it too
    with tempfile.TemporaryDirectory(prefix="ppmq-polls-") as d:
        proc, path = start(Path(d))
        polls = []
        try:
            if args.latency:
                ms = sorted(1000 * s for s in latency(path, args.latency))
                print(
                    f"publish to a waiting TAKE's reply, {len(ms)} times: p50 {ms[len(ms) // 2]:.2f} ms, p99 {ms[int(len(ms) * 0.99)]:.2f} ms"
                )
                return
            for _ in range(args.polls):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(path)
                s.sendall(TAKE % int(args.seconds + 60))
                polls.append(s)
            deadline = time.monotonic() + 30
            while (n := waiting(path)) < args.polls:
                if time.monotonic() > deadline:
                    raise SystemExit(f"only {n} of {args.polls} TAKEs wait")
                time.sleep(0.2)
            time.sleep(1.0)  # let the set-up settle
            before, started = cpu_s(proc.pid), time.monotonic()
            time.sleep(args.seconds)
            used, elapsed = cpu_s(proc.pid) - before, time.monotonic() - started
            print(f"{args.polls} waiting TAKEs, {elapsed:.1f} s: broker CPU {used:.2f} s = {100 * used / elapsed:.2f}% of a core")
        finally:
            for s in polls:
                s.close()
            proc.terminate()
            proc.wait(15)


if __name__ == "__main__":
    main()
