"""A step's fixed cost: one message a publish, and how it grows with idle topics.

    .venv/bin/python tools/step_cost.py [--messages 4000] [--idle-topics 0,200] [--runs 3]

Each message is a step of its own, as at a low, paced rate: a publish that goes
straight into flight to two open subscribers, then one ack step per subscriber.
It runs Broker.step in-process on a real LMDB store (without fsync) and prints
the writer thread's CPU time per message, with no other topic and with
`--idle-topics` more topics that the same subscribers take but nobody publishes
to. A step should cost what its own topics cost: the idle ones should not show.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import msgspec

from ppmq.config import Config, SubscriberConfig, TopicConfig
from ppmq.core.broker import Broker
from ppmq.protocol import messages as p
from ppmq.store.store import Store

SUBS = ["a", "b"]


def run(n: int, idle_topics: int) -> float:
    """GroupCommit CPU microseconds per message (its publish step and both ack steps)."""
    with tempfile.TemporaryDirectory(prefix="ppmq-bench-") as d:
        topics = [TopicConfig(name="bench", subscribers=SUBS, priorities=3)]
        topics += [TopicConfig(name=f"idle{i}", subscribers=SUBS, priorities=3) for i in range(idle_topics)]
        config = Config(
            server_socket=f"{d}/s.sock",
            data_path=d,
            sync=False,
            subscribers=[SubscriberConfig(name=s, socket=f"{d}/{s}.sock", batch_size=100, window=1000) for s in SUBS],
            topics=topics,
        )
        store = Store(d, sync=False, max_bytes=1 << 30)
        broker = Broker(config, store, time.time_ns())
        payload = msgspec.Raw(b'"' + b"x" * 198 + b'"')
        spent = 0.0
        for i in range(n):
            request = p.Request(topic="bench", messages=[p.Message(payload=payload, priority=i % 3)], id=msgspec.Raw(b"1"))
            start = time.thread_time()
            step = broker.step([request], set(SUBS), time.time_ns())
            acks = [
                p.Request(topic="bench", subscriber=d.subscriber, acks=[m["Key"] for m in msgspec.json.decode(d.frame)["Messages"]])
                for d in step.deliveries
            ]
            for ack in acks:
                broker.step([ack], set(), time.time_ns())
            spent += time.thread_time() - start
        store.close()
    return spent / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=4000)
    ap.add_argument("--idle-topics", default="0,200", help="comma-separated counts of idle topics to compare")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    counts = [int(c) for c in args.idle_topics.split(",")]
    runs: dict[int, list[float]] = {c: [] for c in counts}
    for _ in range(args.runs):  # interleaved, so that the machine's load hits every count alike
        for count in counts:
            runs[count].append(run(args.messages, count))
    for count in counts:
        print(
            f"{count:5d} idle topics: {statistics.median(runs[count]):6.1f} us of writer CPU per message (3 steps), median of {args.runs}"
        )


if __name__ == "__main__":
    main()
