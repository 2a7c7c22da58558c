"""How fast `ppmq report` gets through journals: generate one, report on it, time it.

    .venv/bin/python bench/journal_scale.py [--events 10000000] [--master 'local[2]'] [--keep DIR]

Generates journals of `--hosts` hosts in the format of docs/journal.md (batches
of 100 messages; each message published once, delivered to and acked by two
subscribers, about 1% redelivered after an AckRetry, 0.5% expired before
delivery, 2% replaced by dedupe), as gzipped segments of about 64 MB of JSON,
then runs `ppmq report` on them in a process of its own and prints the wall
time and the events processed per minute. An event is one message entry of a
record (a record without entries counts one), as the report counts them.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BATCH = 100
SEGMENT_BYTES = 64 << 20
NS = 1_000_000_000
SUBSCRIBERS = ("indexer", "archiver")
TOPICS = ("orders", "filescan", "events")


class Segments:
    """Writes a host's records into gzipped segments of about SEGMENT_BYTES of JSON."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True)
        self.file: gzip.GzipFile | None = None
        self.size = 0
        self.count = 0

    def write(self, record: str) -> None:
        if self.file is None or self.size >= SEGMENT_BYTES:
            self.close()
            self.file = gzip.open(self.directory / f"journal-{self.count:06d}.jsonl.gz", "wt", compresslevel=1)
            self.count += 1
            self.size = 0
        self.file.write(record)
        self.size += len(record)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _ints(values: list[int]) -> str:
    return "[" + ",".join(map(str, values)) + "]"


def host_journal(directory: Path, host: str, events: int, rng: random.Random) -> int:
    """One host's journal of about `events` events; returns how many it wrote."""
    out = Segments(directory)
    head = f'{{"V":1,"Host":{json.dumps(host)},"Event":'
    written, seq, ts = 0, {t: 0 for t in TOPICS}, 1_795_300_000 * NS
    while written < events:
        topic = rng.choice(TOPICS)
        ids = list(range(seq[topic] + 1, seq[topic] + 1 + BATCH))
        seq[topic] += BATCH
        ts += rng.randint(1, 40) * NS // 100  # batches 10-400 ms apart
        sizes = [rng.randint(80, 1200) for _ in ids]
        replaced = ["true" if rng.random() < 0.02 else "false" for _ in ids]
        out.write(
            f'{head}"publish","Ts":{ts},"Topic":"{topic}","Ids":{_ints(ids)},"Bytes":{_ints(sizes)},'
            f'"Prio":{_ints([i % 3 for i in ids])},"ExpiresNs":{_ints([0] * BATCH)},"Replaced":[{",".join(replaced)}]}}\n'
        )
        written += BATCH
        for sub in SUBSCRIBERS:
            expired = {m for m in ids if rng.random() < 0.005}
            kept = [m for m in ids if m not in expired]
            at = ts + rng.randint(1, 50) * NS // 1000
            where = f'"Topic":"{topic}","Subscriber":"{sub}"'
            out.write(f'{head}"deliver","Ts":{at},{where},"Ids":{_ints(kept)},"PubNs":{_ints([ts] * len(kept))},"Attempts":{_ints([1] * len(kept))},"Bytes":{_ints(sizes[: len(kept)])}}}\n')
            late = {m for m in kept if rng.random() < 0.01}
            acked = [m for m in kept if m not in late]
            ack_at = at + int(rng.lognormvariate(-2.5 if sub == "indexer" else -1.0, 0.8) * NS)
            out.write(f'{head}"ack","Ts":{ack_at},{where},"Ids":{_ints(acked)},"PubNs":{_ints([ts] * len(acked))},"Attempts":{_ints([1] * len(acked))}}}\n')
            if expired:
                out.write(f'{head}"expire","Ts":{at},{where},"Ids":{_ints(sorted(expired))},"PubNs":{_ints([ts] * len(expired))},"Delivered":[{",".join(["false"] * len(expired))}]}}\n')
            if late:
                late = sorted(late)
                retry = ack_at + 30 * NS
                out.write(f'{head}"requeue","Ts":{retry},{where},"Reason":"AckRetry","Ids":{_ints(late)}}}\n')
                out.write(f'{head}"deliver","Ts":{retry},{where},"Ids":{_ints(late)},"PubNs":{_ints([ts] * len(late))},"Attempts":{_ints([2] * len(late))},"Bytes":{_ints([500] * len(late))}}}\n')
                out.write(f'{head}"ack","Ts":{retry + NS},{where},"Ids":{_ints(late)},"PubNs":{_ints([ts] * len(late))},"Attempts":{_ints([2] * len(late))}}}\n')
                written += 2 * len(late)  # the first ack left them out
            written += 2 * len(kept) + len(expired)
    out.close()
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--keep", help="generate into this directory and keep it (and reuse it if it exists)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ppmq-scale-") as tmp:
        base = Path(args.keep or tmp)
        journals = base / "journals"
        if not journals.exists():
            start = time.monotonic()
            rng = random.Random(1)
            total = sum(host_journal(journals / f"host{h}", f"host{h}", args.events // args.hosts, rng) for h in range(args.hosts))
            size = sum(p.stat().st_size for p in journals.rglob("*.gz"))
            print(f"generated {total:,} events for {args.hosts} hosts in {time.monotonic() - start:.0f} s: {size / 1e6:.0f} MB gzipped", flush=True)
            (base / "events").write_text(str(total))
        out = base / "report"
        start = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "ppmq.cli", "report", str(journals), "--out", str(out), "--master", args.master],
            capture_output=True, text=True,
        )  # fmt: skip
        wall_s = time.monotonic() - start
        if done.returncode:
            sys.exit(f"ppmq report failed:\n{done.stderr[-3000:]}")
        events = int(done.stdout.split()[0].replace(",", ""))
        print(done.stdout.strip())
        generated = int((base / "events").read_text())
        if events != generated:
            sys.exit(f"the report counted {events:,} events, the generator wrote {generated:,}")
        print(
            f"ppmq report on {args.master}: {events:,} events in {wall_s:.0f} s wall (JVM start included): "
            f"{events / wall_s * 60:,.0f} events per minute; load average {os.getloadavg()[0]:.1f}"
        )


if __name__ == "__main__":
    main()
