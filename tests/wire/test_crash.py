"""Crash safety (PROTOCOL §3 Persistence): kill -9 at random moments, restart, check.

Publishers send confirmed batches, subscribers ack everything on their delivery
connection, and the broker is killed with SIGKILL in the middle of a commit, of
a delivery, of an expiry sweep or of a SIGHUP reload, then started again on the
same DataPath. After every cycle, with the broker dead and its store frozen:

- the store passes `fsck`;
- every message answered 200 has reached each subscriber or is still held for it;
- no run of the broker delivers a message that, before it started, a subscriber
  had acked (ack answered 200), that had expired, or whose key had a newer
  version answered 200;
- no generated key names two messages (PROTOCOL §3 Keys): every payload is
  published once, so a key delivered with two payloads was handed out twice,
  as it would be if a batch that left before its commit died with it and the
  next run reused its ids.

At the end a last run drains everything: every confirmed message reaches every
subscriber (losses must be zero); deliveries beyond the first are the
at-least-once duplicates. It runs with `Sync: true` and with `Sync: false`: a
process killed loses nothing without fsync either, since its commits are in the
page cache, and without Sync batches leave before their commit too. `CrashRun` is
shared with tools/crash_soak.py, which runs it for 500 cycles.
"""

from __future__ import annotations

import datetime as dt
import itertools
import random
import socket
import struct
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest
import yaml

from ppmq.client.library import Client
from ppmq.config import Config, load_config
from ppmq.errors import ClientError
from ppmq.protocol.framing import Framer
from ppmq.store.fsck import check, read_snapshot

from ..conftest import BrokerProcess, Subscriber, make_config, wait_for

SUBSCRIBERS = ("a", "b")
MOMENTS = ("commit", "delivery", "expiry", "reload")
DD_KEYS = 16


def crash_config(tmp: Path, with_c: bool = False, sync: bool = True) -> dict:
    """`work`: fan-out to a and b; `dd`: dedupe; `auto`: AckRequired false, for a, whose
    batches complete once written; `exp`: expiry, also held for `lazy`,
    who never listens, so that expired messages pile up for the sweep. `with_c`
    subscribes `c` (who never listens either) to `work`: reloading between the two
    adds a subscription, then drops it with everything it holds. Without `sync`
    a kill -9 must lose nothing all the same: the commits are in the page cache."""
    return make_config(
        tmp,
        [
            {"Name": "work", "Priorities": 2, "AckRetry": "1s", "Subscribers": ["a", "b", "c"] if with_c else ["a", "b"]},
            {"Name": "dd", "Dedupe": True, "AckRetry": "1s", "Subscribers": ["a"]},
            {"Name": "exp", "Expire": True, "Subscribers": ["a", "lazy"]},
            {"Name": "auto", "AckRequired": False, "Subscribers": ["a"]},
        ],
        [{"Name": "a", "BatchSize": 20, "Window": 40}, {"Name": "b", "BatchSize": 7, "Window": 14}, "lazy", "c"],
        Sync=sync,
    )


@dataclass
class Delivery:
    run: int
    sub: str
    topic: str
    key: str
    payload: str
    expires: float | None  # Unix seconds


@dataclass
class Ledger:
    """What the broker confirmed, and in which run: shared by every thread."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    confirmed: dict[str, int] = field(default_factory=dict)  # work payload -> run
    auto: set[str] = field(default_factory=set)  # confirmed payloads of `auto`
    versions: dict[int, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))  # dd key -> (version, run)
    acked: dict[tuple[str, str], int] = field(default_factory=dict)  # (sub, work payload) -> run of the ack's 200
    deliveries: list[Delivery] = field(default_factory=list)
    run_of_pid: dict[int, int] = field(default_factory=dict)


class Recorder(Subscriber):
    """A subscriber that records every message with the broker run that sent it
    (known from the peer's pid) and acks each batch on the delivery connection.

    It reads a connection to its end, also once acking fails because the broker
    is dead: what reached the socket before the kill was delivered (on an
    `AckRequired: false` topic it is already gone from the store)."""

    def __init__(self, name: str, path: str, ledger: Ledger, on_batch: Callable[[], None]) -> None:
        self.name, self.ledger, self.on_batch = name, ledger, on_batch
        self.reading = 0  # connections not yet read to their end
        super().__init__(path, ack=None)

    def _read(self, conn: socket.socket) -> None:
        with self.lock:
            self.reading += 1
        try:
            self._read_to_the_end(conn)
        finally:
            with self.lock:
                self.reading -= 1

    def _read_to_the_end(self, conn: socket.socket) -> None:
        pid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        wait_for(lambda: pid in self.ledger.run_of_pid, what=f"broker pid {pid} to be known")  # it may connect before start() returns
        run = self.ledger.run_of_pid[pid]
        framer, ids, pending = Framer(1 << 30), itertools.count(), []
        try:
            while data := conn.recv(1 << 16):
                for frame in framer.feed(data):
                    obj = msgspec.json.decode(frame)
                    if "Status" in obj:
                        self._acked(pending.pop(0), obj, run)
                        continue
                    acked = self._batch(conn, obj, run, next(ids))
                    if acked is not None:
                        pending.append(acked)
        except OSError:
            pass

    def _batch(self, conn: socket.socket, batch: dict, run: int, rid: int) -> tuple[str, list[str], int] | None:
        """Record a batch and ack it; None if the ack could not be sent."""
        payloads = []
        with self.ledger.lock:
            for m in batch["Messages"]:
                expires = dt.datetime.fromisoformat(m["Expires"]).timestamp() if "Expires" in m else None
                self.ledger.deliveries.append(Delivery(run, self.name, batch["Topic"], m["Key"], m["Payload"], expires))
                payloads.append(m["Payload"])
        keys = [m["Key"] for m in batch["Messages"]]
        try:
            conn.sendall(msgspec.json.encode({"Topic": batch["Topic"], "Subscriber": self.name, "Acks": keys, "Id": rid}) + b"\n")
        except OSError:
            return None
        finally:
            self.on_batch()
        return batch["Topic"], payloads, len(keys)

    def _acked(self, pending: tuple[str, list[str], int], reply: dict, run: int) -> None:
        topic, payloads, n = pending
        if topic == "work" and reply["Status"] == 200 and reply.get("Accepted") == n:
            with self.ledger.lock:
                for payload in payloads:
                    self.ledger.acked.setdefault((self.name, payload), run)


class Publishers:
    """One thread per topic, each sending confirmed batches until the broker dies."""

    def __init__(self, socket_path: str, ledger: Ledger, run: int, rng: random.Random, counters: Counter) -> None:
        self.path, self.ledger, self.run, self.rng, self.counters = socket_path, ledger, run, rng, counters
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(f,), daemon=True) for f in (self._work, self._dd, self._exp, self._auto)]
        for thread in self.threads:
            thread.start()

    def _loop(self, publish) -> None:
        try:
            with Client(self.path, timeout_s=10) as client:
                while not self.stop.is_set():
                    publish(client)
        except ClientError:
            pass  # the broker was killed: the batch in the air may or may not be stored

    def _numbers(self, name: str, n: int) -> range:
        """n numbers for payloads, never handed out before (the exp burst runs
        beside the exp thread): a payload names one message, in every run."""
        with self.ledger.lock:
            start = self.counters[name]
            self.counters[name] += n
        return range(start, start + n)

    def _work(self, client: Client) -> None:
        payloads = [f"w{i}" for i in self._numbers("work", self.rng.randint(1, 20))]
        client.publish("work", [{"Payload": p, "Priority": self.rng.randint(0, 1)} for p in payloads])
        with self.ledger.lock:
            self.ledger.confirmed.update(dict.fromkeys(payloads, self.run))
        time.sleep(0.005)  # a steady stream, not a flood the subscribers never catch up with

    def _auto(self, client: Client) -> None:
        payloads = [f"u{i}" for i in self._numbers("auto", self.rng.randint(1, 20))]
        client.publish("auto", [{"Payload": p} for p in payloads])
        with self.ledger.lock:
            self.ledger.auto.update(payloads)
        time.sleep(0.005)

    def _dd(self, client: Client) -> None:
        keys = self.rng.sample(range(DD_KEYS), self.rng.randint(1, 4))
        versions = {k: self.counters[f"dd{k}"] + 1 for k in keys}
        self.counters.update({f"dd{k}": 1 for k in keys})
        client.publish("dd", [{"Key": f"k{k}", "Payload": f"k{k}:{v}"} for k, v in versions.items()])
        with self.ledger.lock:
            for k, v in versions.items():
                self.ledger.versions[k].append((v, self.run))
        time.sleep(0.01)

    def _exp(self, client: Client, burst: int = 0, ttl_s: float | None = None) -> None:
        numbers = self._numbers("exp", burst or self.rng.randint(1, 10))
        client.publish("exp", [{"Payload": f"e{i}", "TTL": ttl_s or self.rng.uniform(0.1, 1.5)} for i in numbers])
        time.sleep(0.02)

    def burst_of_expiring(self, n: int, ttl_s: float) -> None:
        """Many messages expiring at the same instant: a long sweep to be killed in."""
        with Client(self.path, timeout_s=10) as client:
            self._exp(client, burst=n, ttl_s=ttl_s)

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)


class CrashRun:
    """Cycles of run, kill -9, check; then a drain that checks nothing was lost."""

    def __init__(self, tmp: Path, seed: int, sync: bool = True) -> None:
        self.tmp = tmp
        self.sync = sync
        self.rng = random.Random(seed)
        self.ledger = Ledger()
        self.broker = BrokerProcess(tmp, crash_config(tmp, sync=sync))
        self.with_c = False
        self.counters: Counter = Counter()
        self.started: list[float] = []  # wall clock before each run's process was spawned
        self.moments: Counter = Counter()
        self._batches = 0
        self._kill_at_batch: int | None = None
        self._runs_checked = 0  # deliveries before this index have been through check_runs
        self._named: dict[tuple[str, str], Delivery] = {}  # (topic, generated key) -> the first delivery with it
        self.recorders = [Recorder(s, self.broker.sub_socket(s), self.ledger, self._on_batch) for s in SUBSCRIBERS]

    def _start(self) -> int:
        self.started.append(time.time())
        run = len(self.started) - 1
        self.broker.start()
        self.ledger.run_of_pid[self.broker.proc.pid] = run
        return run

    def _on_batch(self) -> None:
        """Kill from a subscriber's thread, right while deliveries and acks flow."""
        self._batches += 1
        if self._kill_at_batch is not None and self._batches >= self._kill_at_batch and self.broker.alive():
            self._kill_at_batch = None
            self.broker.proc.kill()

    def cycle(self, moment: str) -> None:
        """One run of the broker, killed at `moment`, then the checks."""
        self.moments[moment] += 1
        run = self._start()
        publishers = Publishers(self.broker.socket, self.ledger, run, self.rng, self.counters)
        if moment == "commit":
            time.sleep(self.rng.uniform(0.05, 0.4))
            config = self.config
            problems = check(read_snapshot(config.data_path), config)
            assert not problems, "fsck beside a live broker:\n" + "\n".join(problems)
        elif moment == "delivery":
            self._kill_at_batch = self._batches + self.rng.randint(1, 30)
            wait_for(lambda: not self.broker.alive(), what="the kill during a delivery")
        elif moment == "expiry":
            ttl_s = 0.3
            publishers.burst_of_expiring(self.rng.randint(300, 2000), ttl_s)
            time.sleep(ttl_s + self.rng.uniform(0, 0.15))
        elif moment == "reload":
            time.sleep(self.rng.uniform(0.05, 0.3))  # a backlog for c to hold, or to be dropped with it
            self.with_c = not self.with_c
            self.broker.reload(crash_config(self.tmp, self.with_c, self.sync))
            time.sleep(self.rng.uniform(0, 0.2))
        self._kill_at_batch = None
        self.broker.kill()
        publishers.join()
        self.read_what_the_dead_broker_sent()
        self.check_frozen_store()
        self.check_runs(since=self._runs_checked)
        self._runs_checked = len(self.ledger.deliveries)

    def read_what_the_dead_broker_sent(self) -> None:
        """Let the subscribers accept and read to their end the connections of the
        killed run (their accept loop looks every 0.1 s)."""
        time.sleep(0.3)
        wait_for(lambda: not any(r.reading for r in self.recorders), what="the subscribers to read the dead broker's connections")

    def check_frozen_store(self) -> None:
        """With the broker dead: fsck is clean, and every confirmed message has reached
        each subscriber or is still held for it."""
        config = self.config
        snap = read_snapshot(config.data_path, fragments=True)
        problems = check(snap, config)
        assert not problems, "fsck after a kill -9:\n" + "\n".join(problems)
        held = set()
        sub_names = {i: n for n, i in snap.state.sub_ids.items()}
        topic_names = {i: n for n, i in snap.state.topic_ids.items()}
        for (t, m), holders in snap.holders.items():
            payload = msgspec.json.decode(snap.bodies[(t, m)].fragment)["Payload"]
            held.update((sub_names[s], topic_names[t], payload) for s in holders)
        missing = [
            (s, "work", p) for p in self.confirmed_work() for s in SUBSCRIBERS if (s, "work", p) not in held and not self.received(s, p)
        ]
        missing += [("a", "auto", p) for p in self.confirmed_auto() if ("a", "auto", p) not in held and not self.received("a", p)]
        missing += [("a", "dd", k) for k in self.dd_behind(held)]
        assert not missing, f"confirmed but neither delivered nor stored: {missing[:10]} ({len(missing)} in all)"

    def confirmed_work(self) -> list[str]:
        with self.ledger.lock:
            return list(self.ledger.confirmed)

    def confirmed_auto(self) -> list[str]:
        with self.ledger.lock:
            return list(self.ledger.auto)

    def received(self, sub: str, payload: str) -> bool:
        return (sub, payload) in self._received()

    def _received(self) -> set[tuple[str, str]]:
        with self.ledger.lock:
            count = len(self.ledger.deliveries)
            if getattr(self, "_received_upto", 0) != count:
                self._received_cache = {(d.sub, d.payload) for d in self.ledger.deliveries}
                self._received_upto = count
        return self._received_cache

    def dd_behind(self, held: set[tuple[str, str, str]]) -> list[str]:
        """Dedupe keeps the newest version: the dd keys for which no version at least
        as new as the newest confirmed one has reached a, nor is stored for it."""
        seen: dict[str, int] = defaultdict(int)
        for payload in [p for s, topic, p in held if s == "a" and topic == "dd"] + [p for s, p in self._received() if s == "a"]:
            key, _, version = payload.partition(":")
            if version:
                seen[key] = max(seen[key], int(version))
        with self.ledger.lock:
            newest = {f"k{k}": max(v for v, _ in versions) for k, versions in self.ledger.versions.items() if versions}
        return [key for key, version in newest.items() if seen[key] < version]

    def check_runs(self, since: int = 0) -> None:
        """No run delivers what was finished before it started: acked, expired,
        replaced; and no generated key comes with two messages, in any runs.

        Checks the deliveries from index `since` on (an ack answered just before a
        kill may be read a little later, so the drain checks them all again)."""
        with self.ledger.lock:
            deliveries = self.ledger.deliveries[since:]
            acked = dict(self.ledger.acked)
            replaced_by = {k: sorted(vs) for k, vs in self.ledger.versions.items()}
        wrong = []
        for d in deliveries:
            if d.topic == "work" and acked.get((d.sub, d.payload), d.run) < d.run:
                wrong.append(f"{d} after its ack was confirmed in run {acked[(d.sub, d.payload)]}")
            elif d.topic == "exp" and d.expires is not None and d.expires < self.started[d.run]:
                wrong.append(f"{d} although it expired before the run started")
            elif d.topic == "dd":
                key, version = d.payload.split(":")
                newer = [run for v, run in replaced_by.get(int(key[1:]), []) if v > int(version) and run < d.run]
                if newer:
                    wrong.append(f"{d} although a newer version was confirmed in run {newer[0]}")
            if d.topic != "dd":  # dd's keys are the publisher's, one version after another
                first = self._named.setdefault((d.topic, d.key), d)
                if first.payload != d.payload:
                    wrong.append(f"{d}, whose key came before with another message: {first}")
        assert not wrong, "\n".join(wrong[:20])

    @property
    def config(self) -> Config:
        """The config the broker runs (or will run at its next start)."""
        return load_config(self.broker.config_path)

    def drain(self, timeout_s: float = 60) -> None:
        """A last run with no publishers: everything confirmed arrives, everything is acked."""
        if self.with_c:  # c never acks: drop it, with all it holds
            self.broker.config_path.write_text(yaml.safe_dump(crash_config(self.tmp, sync=self.sync)))
        self._start()
        with self.broker.client() as c:
            for sub in SUBSCRIBERS:
                c.reconnect(sub)  # what the subscribers send when they start: in-flight ones come again
        wait_for(lambda: not self.losses(), timeout_s, "every confirmed message to reach every subscriber")

        def settled() -> bool:
            topics = self.broker.status()["Topics"]
            return all(topics[t]["Stored"] == 0 for t in ("work", "dd", "exp", "auto"))

        wait_for(settled, timeout_s, "every message to be acked or to expire")
        assert self.broker.stop() == 0
        self.check_runs()
        config = self.config
        problems = check(read_snapshot(config.data_path), config)
        assert not problems, "\n".join(problems)

    def losses(self) -> list[tuple[str, str]]:
        lost = [(s, p) for p in self.confirmed_work() for s in SUBSCRIBERS if not self.received(s, p)]
        lost += [("a", p) for p in self.confirmed_auto() if not self.received("a", p)]
        return lost + [("a", key) for key in self.dd_behind(set())]

    def figures(self) -> dict[str, int]:
        with self.ledger.lock:
            got = Counter((d.sub, d.topic, d.payload) for d in self.ledger.deliveries)
        return {
            "cycles": sum(self.moments.values()),
            **{f"kills during {m}": n for m, n in sorted(self.moments.items())},
            "confirmed messages": len(self.ledger.confirmed) + len(self.ledger.auto) + sum(len(v) for v in self.ledger.versions.values()),
            "losses": len(self.losses()),
            "duplicates": sum(got.values()) - len(got),
        }

    def close(self) -> None:
        if self.broker.alive():
            self.broker.kill()
        for recorder in self.recorders:
            recorder.close()


def run_cycles(tmp: Path, cycles: int, seed: int, sync: bool = True) -> dict[str, int]:
    """`cycles` kills at moments taken in turn, the drain, and the figures."""
    run = CrashRun(tmp, seed, sync)
    try:
        for i in range(cycles):
            run.cycle(MOMENTS[i % len(MOMENTS)])
        run.drain()
        return run.figures()
    finally:
        run.close()


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "no-sync"])
def test_thirty_kills_at_random_moments_lose_nothing_and_bring_nothing_back(short_tmp, sync):
    figures = run_cycles(short_tmp, cycles=30, seed=random.randrange(1 << 30), sync=sync)
    assert figures["losses"] == 0
    assert figures["confirmed messages"] > 1000, figures
