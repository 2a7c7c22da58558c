"""How fast `ppmq report` gets through journals of a fleet: record one, replicate it, report on it, time it.

    .venv/bin/python tools/journal_scale.py [--events 12500000] [--hosts 50] [--master 'local[2]'] [--keep DIR]

The journal is a real broker's: `ppmq serve` runs with a temporary config, four
producers publish in requests of 1, 10 and 100 messages (mostly single
messages, as request/response producers do) to three topics, and two
subscribers ack every batch on their connection, except that `archiver` leaves
about 1% of messages unacked so that AckRetry redelivers them. What the broker
wrote is then replicated to `--hosts` hosts: each host's copy rewrites `Host`
and shifts `Ts` and `PubNs` by a per-host offset, and is repeated end to end
(shifted by the recorded span each time) until the host has `--events` /
`--hosts` events. So record sizes, event mix and latencies are what a broker
writes under that mixed load (about 3 events a record), not full batches.

Then `ppmq report` runs on the gzipped segments in a process of its own; the
script prints the wall time, the events processed per minute and the peak RSS
of the report's JVM. An event is one message entry of a record (a record
without entries counts one), as the report counts them.
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import yaml

from ppmq.client.library import Client
from ppmq.protocol.framing import Framer

SEGMENT_BYTES = 64 << 20
NS = 1_000_000_000
SUBSCRIBERS = ("indexer", "archiver")
TOPICS = ("orders", "filescan", "events")
REQUEST_SIZES = (1, 10, 100)
REQUEST_WEIGHTS = (0.94, 0.05, 0.01)  # per request: most producers send one message at a time
PRODUCERS = 4
UNACKED = 0.01  # share of archiver's messages left for AckRetry to redeliver
RECORDED_MESSAGES = 20_000


class AckingSubscriber:
    """A subscriber socket that acks each batch on its connection; `skip` is the share
    of first deliveries it leaves unacked (acked when redelivered)."""

    def __init__(self, path: str, skip: float, rng: random.Random) -> None:
        self.skip, self.rng = skip, rng
        self.skipped: set[str] = set()  # keys left unacked once: acked when they come back
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(4)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        framer = Framer(1 << 30)
        with conn:
            while data := conn.recv(1 << 16):
                for frame in framer.feed(data):
                    batch = msgspec.json.decode(frame)
                    if "Messages" in batch:
                        keys = [m["Key"] for m in batch["Messages"] if self._acks(m["Key"])]
                        ack = {"Topic": batch["Topic"], "Subscriber": batch["Subscriber"], "Acks": keys, "Id": "a"}
                        conn.sendall(msgspec.json.encode(ack) + b"\n")

    def _acks(self, key: str) -> bool:
        if key in self.skipped or self.rng.random() >= self.skip:
            return True
        self.skipped.add(key)
        return False

    def close(self) -> None:
        self.sock.close()


def _config(tmp: Path) -> dict[str, Any]:
    return {
        "ServerSocket": str(tmp / "ppmq.sock"),
        "DataPath": str(tmp / "data"),
        "Subscribers": [{"Name": s, "Socket": str(tmp / f"{s}.sock"), "BatchSize": 100} for s in SUBSCRIBERS],
        "Topics": [{"Name": t, "AckRetry": "1s", "Subscribers": list(SUBSCRIBERS)} for t in TOPICS],
        "Journal": {"Host": "recorded"},
    }


def _produce(sock: str, messages: int, seed: int) -> None:
    """One producer: requests of 1, 10 or 100 messages to a random topic."""
    rng = random.Random(seed)
    with Client(sock, timeout_s=60) as client:
        sent = 0
        while sent < messages:
            size = min(rng.choices(REQUEST_SIZES, REQUEST_WEIGHTS)[0], messages - sent)
            payloads = [{"Payload": {"n": sent + i, "pad": "x" * rng.randint(40, 900)}} for i in range(size)]
            client.publish(rng.choice(TOPICS), payloads)
            sent += size


def _all_acked(sock: str, messages: int) -> bool:
    with Client(sock) as client:
        topics = client.status()["Topics"]
    acked = sum(s["Acked"] for t in TOPICS for s in topics[t]["Subscribers"].values())
    return acked >= messages * len(SUBSCRIBERS)


def record(tmp: Path, messages: int) -> Path:
    """Run a broker under the mixed workload until every message is acked; its journal directory."""
    config = _config(tmp)
    (tmp / "ppmq.yaml").write_text(yaml.safe_dump(config))
    rng = random.Random(1)
    subs = [AckingSubscriber(str(tmp / f"{s}.sock"), UNACKED if s == "archiver" else 0.0, rng) for s in SUBSCRIBERS]
    with open(tmp / "broker.log", "wb") as log:
        broker = subprocess.Popen(
            [sys.executable, "-m", "ppmq.cli", "serve", "-c", str(tmp / "ppmq.yaml")], stdout=log, stderr=subprocess.STDOUT
        )
    try:
        _wait(lambda: os.path.exists(config["ServerSocket"]), 30)
        producers = [threading.Thread(target=_produce, args=(config["ServerSocket"], messages // PRODUCERS, p)) for p in range(PRODUCERS)]
        for p in producers:
            p.start()
        for p in producers:
            p.join()
        _wait(lambda: _all_acked(config["ServerSocket"], messages // PRODUCERS * PRODUCERS), 120)
    finally:
        broker.terminate()
        broker.wait(30)
        for s in subs:
            s.close()
    return Path(config["DataPath"]) / "journal"


def _wait(ready: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            sys.exit("the recording broker did not get there in time")
        time.sleep(0.2)


def _events(record: dict[str, Any]) -> int:
    return len(record.get("Ids", ())) or 1


def _read_records(journal: Path) -> list[dict[str, Any]]:
    """Every record of a journal directory, in time order."""
    lines: list[bytes] = []
    for path in sorted(journal.iterdir()):
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            lines += f.read().splitlines()
    return sorted((msgspec.json.decode(line) for line in lines if line), key=lambda r: r["Ts"])


class Segments:
    """Writes a host's records into gzipped segments of about SEGMENT_BYTES of JSON."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True)
        self.file: gzip.GzipFile | None = None
        self.size = 0
        self.count = 0

    def write(self, line: bytes) -> None:
        if self.file is None or self.size >= SEGMENT_BYTES:
            self.close()
            self.file = gzip.open(self.directory / f"journal-{self.count:06d}.jsonl.gz", "wb", compresslevel=1)
            self.count += 1
            self.size = 0
        self.file.write(line)
        self.size += len(line)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def replicate(records: list[dict[str, Any]], directory: Path, host: str, offset_ns: int, events: int) -> int:
    """`records` as host `host` wrote them: shifted by `offset_ns`, repeated end to end
    until about `events` events; returns how many it wrote."""
    span = records[-1]["Ts"] - records[0]["Ts"] + NS
    out = Segments(directory)
    encode = msgspec.json.Encoder().encode
    written, shift = 0, offset_ns
    while written < events:
        for r in records:
            copy = {**r, "Host": host, "Ts": r["Ts"] + shift}
            if "PubNs" in r:
                copy["PubNs"] = [p + shift for p in r["PubNs"]]
            out.write(encode(copy) + b"\n")
            written += _events(r)
            if written >= events:
                break
        shift += span
    out.close()
    return written


def generate(base: Path, hosts: int, events: int) -> int:
    """Record a broker's journal under `base`/recording, replicate it to `base`/journals."""
    start = time.monotonic()
    recording = base / "recording"
    recording.mkdir(parents=True)
    records = _read_records(record(recording, RECORDED_MESSAGES))
    recorded = sum(map(_events, records))
    print(
        f"recorded {len(records):,} records, {recorded:,} events ({recorded / len(records):.1f} a record) in {time.monotonic() - start:.0f} s",
        flush=True,
    )
    total = sum(replicate(records, base / "journals" / f"host{h:02d}", f"host{h:02d}", h * 7 * NS, events // hosts) for h in range(hosts))
    size = sum(p.stat().st_size for p in (base / "journals").rglob("*.gz"))
    print(f"generated {total:,} events for {hosts} hosts in {time.monotonic() - start:.0f} s: {size / 1e6:.0f} MB gzipped", flush=True)
    return total


def _peak_rss_of_children(proc: subprocess.Popen, peak: list[int]) -> None:
    """Sample the RSS of the report's JVM (a child of the report process) until it exits."""
    while proc.poll() is None:
        for task in Path(f"/proc/{proc.pid}/task").glob("*/children"):
            for child in task.read_text().split():
                try:
                    status = Path(f"/proc/{child}/status").read_text()
                except OSError:
                    continue
                rss = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
                peak[0] = max(peak[0], rss * 1024)
        time.sleep(0.5)


def run_report(journals: Path, out: Path, master: str) -> tuple[subprocess.CompletedProcess, float, int]:
    """`ppmq report` in a process of its own: what it printed, its wall time, its JVM's peak RSS."""
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ppmq.cli", "report", str(journals), "--out", str(out), "--master", master],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    peak = [0]
    sampler = threading.Thread(target=_peak_rss_of_children, args=(proc, peak), daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    sampler.join()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), time.monotonic() - start, peak[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=12_500_000)
    ap.add_argument("--hosts", type=int, default=50)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--keep", help="generate into this directory and keep it (and reuse it if it exists)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ppmq-scale-") as tmp:
        base = Path(args.keep or tmp)
        if not (base / "events").exists():
            (base / "events").write_text(str(generate(base, args.hosts, args.events)))
        done, wall_s, peak = run_report(base / "journals", base / "report", args.master)
        if done.returncode:
            sys.exit(
                f"ppmq report failed after {wall_s:.0f} s (JVM peak RSS {peak / 2**20:,.0f} MiB; load average {os.getloadavg()[0]:.1f}):\n{done.stderr[-3000:]}"
            )
        events = int(done.stdout.split()[0].replace(",", ""))
        print(done.stdout.strip())
        generated = int((base / "events").read_text())
        if events != generated:
            sys.exit(f"the report counted {events:,} events, the generator wrote {generated:,}")
        print(
            f"ppmq report on {args.master}: {events:,} events in {wall_s:.0f} s wall (JVM start included): "
            f"{events / wall_s * 60:,.0f} events per minute; JVM peak RSS {peak / 2**20:,.0f} MiB; load average {os.getloadavg()[0]:.1f}"
        )


if __name__ == "__main__":
    main()
