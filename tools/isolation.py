"""Isolation: a good subscriber's delivery rate with and without four
misbehaving subscribers (one that never reads, one that never acks, one that
resets every connection, one whose socket is missing), all at once.

    .venv/bin/python tools/isolation.py [--messages 20000] [--runs 3] [--shared]

The good subscriber (a separate process) acks every batch on its delivery
connection; one publisher sends `--messages` messages of 200 bytes in confirmed
batches of 100 to its topic. Time runs from the first publish to the last ack.
Each misbehaving subscriber has a topic of its own, preloaded with 1,000
messages and an AckRetry of 1 s, so it keeps being served (redelivered to,
reconnected to) during the run; with `--shared` they subscribe to the good
subscriber's topic instead, so every message is also stored for them, and a
third setup has the same four subscribers merely absent (no socket at all):
that separates the cost of fanning out to more queues from the cost of the
misbehaviour. Runs alternate; the figures are ratios of the medians, and the
broker's RssAnon (its own memory, without LMDB's file pages) is read at the end.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from ppmq.client.library import Client
from quick import SUBSCRIBER, memory, payload, start_broker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.wire.test_isolation import MISBEHAVIOURS, Misbehaving

PRELOAD = 1000


SETUPS = ("alone", "absent", "misbehaving")  # the four others: not configured, without sockets, misbehaving


def config(tmp: Path, setup: str, shared: bool) -> Path:
    bad = list(MISBEHAVIOURS) if setup != "alone" else []
    subs = [{"Name": s, "Socket": str(tmp / f"{s}.sock"), "BatchSize": 100, "Window": 1000} for s in ["good", *bad]]
    topics = [{"Name": "work", "Priorities": 3, "Subscribers": ["good", *bad] if shared else ["good"]}]
    if not shared:
        topics += [{"Name": f"bad-{s}", "AckRetry": "1s", "Subscribers": [s]} for s in bad]
    cfg = {"ServerSocket": str(tmp / "ppmq.sock"), "DataPath": str(tmp / "data"), "RetryMax": "1s", "Subscribers": subs, "Topics": topics}
    path = tmp / "ppmq.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(n: int, setup: str, shared: bool) -> tuple[float, float]:
    """Messages per second to the good subscriber, and the broker's RssAnon in MB at the end."""
    with tempfile.TemporaryDirectory(prefix="ppmq-bench-") as d:
        tmp = Path(d)
        cfg = config(tmp, setup, shared)
        good = subprocess.Popen([sys.executable, "-c", SUBSCRIBER, str(tmp / "good.sock"), str(n)], stdout=subprocess.PIPE, text=True)
        assert good.stdout.readline().strip() == "ready"
        bad = [Misbehaving(str(tmp / f"{kind}.sock"), kind) for kind in MISBEHAVIOURS] if setup == "misbehaving" else []
        broker = start_broker(cfg)
        try:
            with Client(str(tmp / "ppmq.sock")) as c:
                for kind in MISBEHAVIOURS if setup != "alone" and not shared else ():
                    for i in range(0, PRELOAD, 100):
                        c.publish(f"bad-{kind}", [{"Payload": payload(i + j, 200)} for j in range(100)])
                time.sleep(1.0)  # the misbehaving ones are being served before the clock starts
                start = time.time()
                for i in range(0, n, 100):
                    c.publish("work", [{"Payload": payload(i + j, 200), "Priority": (i + j) % 3} for j in range(100)])
            end = float(good.stdout.readline())
            return n / (end - start), memory(broker.pid)["RssAnon"] / (1 << 20)
        finally:
            broker.send_signal(signal.SIGTERM)
            broker.wait()
            good.kill()
            for m in bad:
                m.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--shared", action="store_true", help="the misbehaving subscribers share the good one's topic")
    args = ap.parse_args()
    setups = SETUPS if args.shared else ("alone", "misbehaving")
    runs: dict[str, list[tuple[float, float]]] = {setup: [] for setup in setups}
    for _ in range(args.runs):
        for setup in setups:
            runs[setup].append(run(args.messages, setup, args.shared))
    rate = {setup: statistics.median(r for r, _ in runs[setup]) for setup in setups}
    anon = {setup: statistics.median(m for _, m in runs[setup]) for setup in setups}
    where = "the same topic" if args.shared else "topics of their own"
    print(f"good subscriber, {args.messages:,} messages, the four others on {where}:")
    for setup in setups:
        change = f" ({(rate[setup] / rate['alone'] - 1) * 100:+.1f}% of alone)" if setup != "alone" else ""
        print(f"  {setup:12} median {rate[setup]:8,.0f} msg/s{change}; broker RssAnon {anon[setup]:.1f} MB")
    if args.shared:
        print(f"  misbehaving vs absent: {(rate['misbehaving'] / rate['absent'] - 1) * 100:+.1f}%")
    print(json.dumps({"runs": runs, "shared": args.shared}))


if __name__ == "__main__":
    main()
