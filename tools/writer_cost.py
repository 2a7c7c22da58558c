"""The writer thread's cost per message, without sockets: Broker.step in-process.

    .venv/bin/python tools/writer_cost.py [--messages 100000] [--batch 100] [--sync] [--window 1000] [--lag 0 | --shared] [--behind 0] [--pause-ms 0] [--journal on|off|events] [--dedupe] [--max-messages N] [--ttl S] [--topic YAML] [--subscriber YAML]
    .venv/bin/python tools/writer_cost.py --take [--messages 100000] [--topic YAML] [--subscriber YAML]
    .venv/bin/python tools/writer_cost.py --drain [--messages 100000] [--window 1000]
    .venv/bin/python tools/writer_cost.py --replace [--messages 100000]

Replays the fan-out workload (batches of 100 messages of 200 bytes, priorities
0-2, two subscribers with a window of 1000 that ack every batch) straight into
the broker's state machine on a real LMDB store, and prints the thread CPU time
per message of each phase. Each publish and each step of acks is a step of its
own, unless `--shared`: then the subscribers' acks of the last publish come in
the step of the next, before it, as they do end to end when the acks come
while the commit before waits for the disk, or when a publish waits for the
acks on their way (server/gathering.py). With `--window 100 --shared` they make the
room its messages go straight into flight with: the path of fan-out at Window
= BatchSize when the subscribers keep up. With `--window 100 --lag 1` the
subscribers ack a publish behind, so every message waits in the ready queue
and leaves it with the ack that makes room, from the queue's tail in memory:
the path of a queue one batch behind. With `--lag 3` the queue never
empties and batches are read from its rows: the path when the publisher runs
ahead (fan-out without fsync). `--behind N` first publishes N messages that
nobody takes yet, so the subscribers' queues stay N messages behind: what a
batch costs when the queue it takes from is long (kept in memory up to the
tails' budget, 4 MiB, so up to about 8,000 messages of 250 bytes for each of
the two subscribers). With `--shared` too, the acks that make room for each
batch come in the step of the next publish, as they would if a publish waited
for the acks of subscribers that are behind. The writer thread is where the
broker serialises, so this bounds the broker's throughput; it is far steadier
than an end-to-end run on a shared machine, which makes it the figure to
compare code changes with.
`--journal` says what the journal costs: `on` (the default) builds each step's
events and encodes them as the broker's journal does, `events` builds them only,
`off` neither. `--batch 1` is the paced workload's shape (a message a publish,
each acked on its own): what a step costs beyond its messages; with `--pause-ms
1` the writer idles a millisecond before each step, as it does at 1,000 msg/s,
and the step starts with the caches and the processor as idling left them.
`--drain` is the backlog workload's second half: --messages of 1 KiB published
while nobody reads, then taken from the store and acked until none is left
(only that timed).
`--dedupe` gives the topic Dedupe and every message a Key of its own (`ppmq
bench --dedupe`): what a producer that may resend sends, acked by those Keys.
`--max-messages N` gives the topic MaxMessages N (a bounded queue, which the
run should not fill). `--ttl S` gives it Expire and every message a TTL of S
seconds (which the run should not outlast). `--replace` is a Dedupe topic's
backlog brought up to date: --messages keyed messages published while nobody
reads, then each key published again, every message a replacement of one that
waits (only that timed). `--topic` and `--subscriber` add keys of the config
file to the topic and to both subscribers, as a YAML mapping (`--subscriber
'{Metadata: true}'`, `--topic '{AckRetry: 30s}'`): what any other option costs.
The config is checked as the broker checks its file.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import yaml

from ppmq.config import parse_config
from ppmq.core.broker import Broker
from ppmq.core.events import Event
from ppmq.core.ops import Delivery, Op, Step, Take
from ppmq.errors import ConfigError
from ppmq.protocol import messages as p
from ppmq.server.journal_lines import Lines
from ppmq.store.store import Store

SUBS = ["a", "b"]


@contextmanager
def bench_broker(
    sync: bool, window: int, journal: str, topic: dict[str, Any] | None = None, subscriber: dict[str, Any] | None = None
) -> Iterator[Broker]:
    """A broker on a new store of its own: topic `bench`, priorities 0-2,
    subscribers SUBS; `topic` and `subscriber` add keys of the config file's own
    (TopicConfig, SubscriberConfig), checked as the broker checks its file."""
    with tempfile.TemporaryDirectory(prefix="ppmq-bench-") as d:
        subs = [{"Name": s, "Socket": f"{d}/{s}.sock", "BatchSize": 100, "Window": window, **(subscriber or {})} for s in SUBS]
        text = yaml.safe_dump({
            "ServerSocket": f"{d}/s.sock", "DataPath": d, "Sync": sync, "Journal": {"Enabled": journal != "off"}, "Subscribers": subs,
            "Topics": [{"Name": "bench", "Subscribers": list(SUBS), "Priorities": 3, **(topic or {})}],
        })  # fmt: skip
        store = Store(d, sync=sync, max_bytes=1 << 30)
        try:
            yield Broker(parse_config(text, Path(d, "ppmq.yaml")), store, time.time_ns())
        finally:
            store.close()


def payload_of(size: int) -> msgspec.Raw:
    """A message's Payload of `size` bytes: a JSON string."""
    return msgspec.Raw(b'"' + b"x" * (size - 2) + b'"')


def messages(i: int, count: int, payload: msgspec.Raw, keyed: bool = False, ttl_s: float | None = None) -> list[p.Message]:
    """The messages of publish i (its first message's number), priorities 0-2 in
    turn; `keyed`: each with a Key of its own; each with a TTL of `ttl_s` if given."""
    return [p.Message(payload=payload, priority=(i + j) % 3, key=f"k{i + j}" if keyed else None, ttl_s=ttl_s) for j in range(count)]


def encoder(journal: str) -> Callable[[list[Event]], object]:
    """What a step's events cost: encoded as the journal does (`on`), or nothing more."""
    return Lines("bench").encode if journal == "on" else len


def acks_of(deliveries: list[Delivery]) -> list[p.Request]:
    """Each batch's ack, as its subscriber sends it: every Key it holds."""
    return [
        p.Request(topic="bench", subscriber=d.subscriber, acks=[m["Key"] for m in msgspec.json.decode(d.frame)["Messages"]])
        for d in deliveries
    ]


def timed(
    broker: Broker, ops: list[Op], open_subs: set[str], encode: Callable[[list[Event]], object], pause_s: float = 0.0
) -> tuple[Step, float]:
    """One step, and the writer thread's seconds for it, its events encoded as
    `encode` says; after `pause_s` idle (not timed), as between two steps at a paced rate."""
    if pause_s:
        time.sleep(pause_s)
    start = time.thread_time()
    step = broker.step(ops, open_subs, time.time_ns())
    encode(step.events)
    return step, time.thread_time() - start


def backlog(broker: Broker, n: int, payload: msgspec.Raw, keyed: bool = False) -> None:
    """n messages published 100 a request while nobody reads (not timed)."""
    for i in range(0, n, 100):
        broker.step([p.Request(topic="bench", messages=messages(i, 100, payload, keyed))], set(), time.time_ns())


def run(
    n: int,
    sync: bool,
    window: int,
    lag: int,
    journal: str = "on",
    batch: int = 100,
    behind: int = 0,
    keyed: bool = False,
    ttl_s: float | None = None,
    topic: dict[str, Any] | None = None,
    subscriber: dict[str, Any] | None = None,
    shared: bool = False,
    pause_s: float = 0.0,
) -> dict[str, float]:
    """The fan-out workload; `keyed`: every message with a Key of its own, which
    its ack names; `ttl_s`: each with that TTL (the topic needs Expire);
    `shared`: the acks of a publish's batches in the step of the next;
    `pause_s`: the writer idles that long before each step."""
    encode = encoder(journal)
    with bench_broker(sync, window, journal, topic, subscriber) as broker:
        cost = {"publish and deliver": 0.0, "ack": 0.0} if not shared else {"acks, publish and deliver": 0.0}
        payload = payload_of(200)
        pending: list[tuple[int, Delivery]] = []  # (publish number, batch) not acked yet
        for i in range(-behind, 0, batch):  # the queues fall behind by these, the Windows full
            step = broker.step([p.Request(topic="bench", messages=messages(i, batch, payload, keyed, ttl_s))], set(SUBS), time.time_ns())
            pending += [(-behind, d) for d in step.deliveries]
        for i in range(0, n, batch):
            publish = p.Request(topic="bench", messages=messages(i, batch, payload, keyed, ttl_s), id=msgspec.Raw(b"1"))
            if shared:
                step, seconds = timed(broker, [*acks_of([d for _, d in pending]), publish], set(SUBS), encode, pause_s)
                cost["acks, publish and deliver"] += seconds
                pending = [(i, d) for d in step.deliveries]
                continue
            # subscribers that keep up are open, idle and empty when a publish arrives
            step, seconds = timed(broker, [publish], set(SUBS), encode, pause_s)
            cost["publish and deliver"] += seconds
            pending += [(i, d) for d in step.deliveries]
            acks = acks_of([d for at, d in pending if at <= i - batch * lag])
            pending = [(at, d) for at, d in pending if at > i - batch * lag]
            step, seconds = timed(broker, acks, set(SUBS) if lag else set(), encode, pause_s)  # trailing acks make room for the queue
            cost["ack"] += seconds
            pending += [(i, d) for d in step.deliveries]
    return {phase: seconds / n * 1e6 for phase, seconds in cost.items()}


def drain(n: int, window: int, journal: str = "on", size: int = 1024) -> dict[str, float]:
    """The backlog workload's second half: n messages of `size` bytes published
    with nobody reading (not timed), then taken by both subscribers, each step
    acking every batch the one before pushed, until none is left (timed)."""
    encode = encoder(journal)
    with bench_broker(False, window, journal) as broker:
        backlog(broker, n, payload_of(size))
        seconds, deliveries, steps = 0.0, [], 0
        while deliveries or not steps:
            step, took = timed(broker, acks_of(deliveries), set(SUBS), encode)
            seconds += took
            deliveries, steps = step.deliveries, steps + 1
        left = broker.state.topics["bench"].stored
        if left:
            raise SystemExit(f"the drain ended with {left} messages stored")
    return {"take and ack": seconds / n * 1e6}


def replace(n: int, journal: str = "on") -> dict[str, float]:
    """A Dedupe topic's backlog brought up to date: n keyed messages published
    while nobody reads (not timed), then each key published again, 100 a
    publish (timed), every message a replacement of one that waits."""
    encode = encoder(journal)
    with bench_broker(False, 1000, journal, {"Dedupe": True}) as broker:
        payload = payload_of(200)
        backlog(broker, n, payload, keyed=True)
        seconds = 0.0
        for i in range(0, n, 100):
            seconds += timed(
                broker, [p.Request(topic="bench", messages=messages(i, 100, payload, True), id=msgspec.Raw(b"1"))], set(), encode
            )[1]
        replaced = broker.state.topics["bench"].replaced
        if replaced != n:
            raise SystemExit(f"{replaced} of {n} messages were replaced")
    return {"replace": seconds / n * 1e6}


def take(n: int, journal: str = "on", topic: dict[str, Any] | None = None, subscriber: dict[str, Any] | None = None) -> dict[str, float]:
    """Pull subscribers (PROTOCOL §9): SUBS with Pull, each a worker that TAKEs
    Count 100 after every publish, acking what it took the time before in the
    same TAKE, as `ppmq bench -w pull`'s workers do; their replies, which carry
    the messages, encoded as the event loop encodes them (timed too)."""
    encode = encoder(journal)
    with bench_broker(False, 1000, journal, topic, {**(subscriber or {}), "Pull": True, "Socket": None}) as broker:
        cost = {"publish": 0.0, "take and ack": 0.0}
        payload = payload_of(200)
        held: dict[str, list[str]] = {s: [] for s in SUBS}
        for i in range(0, n, 100):
            publish = p.Request(topic="bench", messages=messages(i, 100, payload), id=msgspec.Raw(b"1"))
            cost["publish"] += timed(broker, [publish], set(), encode)[1]
            takes = [
                Take(k, p.Request(topic="bench", subscriber=s, command="TAKE", count=100, id=msgspec.Raw(b"1"), acks=held[s] or None))
                for k, s in enumerate(SUBS)
            ]  # fmt: skip
            start = time.thread_time()
            step = timed(broker, takes, set(), encode)[0]
            replies = [p.encode_reply(reply) for reply in step.replies]
            cost["take and ack"] += time.thread_time() - start
            held = {s: [m["Key"] for m in msgspec.json.decode(r)["Body"]["Messages"]] for s, r in zip(SUBS, replies)}
    return {phase: seconds / n * 1e6 for phase, seconds in cost.items()}


def mapping(text: str) -> dict[str, Any]:
    """A command line's YAML mapping (argparse turns the ValueError into a usage error)."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        value = None
    if not isinstance(value, dict):
        raise ValueError(text)
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=100, help="messages a publish; 1: the paced workload's steps")
    ap.add_argument("--sync", action="store_true", help="fsync every commit (adds the disk, and its noise)")
    ap.add_argument("--window", type=int, default=1000, help="messages in flight per subscriber; 100 is one batch")
    ap.add_argument("--lag", type=int, default=0, help="publishes the subscribers' acks trail by")
    ap.add_argument("--shared", action="store_true", help="the acks of a publish's batches in the step of the next, before it")
    ap.add_argument("--behind", type=int, default=0, help="messages the subscribers' queues hold when the run starts")
    ap.add_argument(
        "--pause-ms", type=float, default=0.0, help="idle this long before each step of the fan-out (not timed), as at a paced rate"
    )
    ap.add_argument(
        "--journal", choices=("on", "events", "off"), default="on", help="journal events built and encoded, built only, or neither"
    )
    ap.add_argument("--drain", action="store_true", help="the backlog workload: --messages of 1 KiB published, then drained")
    ap.add_argument("--dedupe", action="store_true", help="the topic has Dedupe, and every message a Key of its own")
    ap.add_argument("--max-messages", type=int, default=0, help="the topic's MaxMessages (0: none)")
    ap.add_argument("--ttl", type=float, help="the topic has Expire, and every message this TTL in seconds")
    ap.add_argument("--replace", action="store_true", help="--messages keyed messages waiting on a Dedupe topic, then each replaced")
    ap.add_argument("--take", action="store_true", help="the subscribers are Pull, each a worker that TAKEs 100 after every publish")
    ap.add_argument("--topic", type=mapping, default={}, help="more keys of the topic, as YAML: '{AckRetry: 30s}'")
    ap.add_argument("--subscriber", type=mapping, default={}, help="more keys of both subscribers, as YAML: '{Metadata: true}'")
    args = ap.parse_args()
    if args.shared and args.lag:
        ap.error("--shared acks every batch in the next publish's step: no --lag")
    topic = {"Dedupe": args.dedupe, "MaxMessages": args.max_messages, "Expire": args.ttl is not None, **args.topic}
    if args.drain:
        us = drain(args.messages, args.window, args.journal)
    elif args.replace:
        us = replace(args.messages, args.journal)
    elif args.take:
        us = take(args.messages, args.journal, args.topic, args.subscriber)
    else:
        us = run(
            args.messages,
            args.sync,
            args.window,
            args.lag,
            args.journal,
            args.batch,
            args.behind,
            args.dedupe,
            args.ttl,
            topic,
            args.subscriber,
            args.shared,
            args.pause_ms / 1000,
        )
    total = sum(us.values())
    print("writer CPU per message: " + ", ".join(f"{k} {v:.2f} us" for k, v in us.items()) + f"; total {total:.2f} us")
    print(f"so one writer thread tops out near {1e6 / total:,.0f} messages/s")


if __name__ == "__main__":
    try:
        main()
    except ConfigError as exc:
        sys.exit(f"writer_cost.py: {exc}")
