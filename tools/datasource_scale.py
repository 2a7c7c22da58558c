"""How fast the `ppmq` Spark data source reads a large store: build one, read it, time it.

    .venv/bin/python tools/datasource_scale.py [--messages 1000000] [--master 'local[2]'] [--keep DIR]

Builds a store of `--messages` messages of 200 bytes, spread over two topics,
each held (ready, never delivered) by two subscribers: written by the broker's
state machine in-process with Sync false, in steps of 1,000 messages, which is
far faster than through a socket. Then reads it with
`spark.read.format("ppmq").load(DIR)` on `--master`, every column of every row
(a count and the payloads' total length), and prints the seconds of the read,
its partitions and the rows per second. `--keep DIR` builds the store in DIR
(or reuses the one there) instead of a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import msgspec

from ppmq.config import Config, SubscriberConfig, TopicConfig
from ppmq.core.broker import Broker
from ppmq.protocol import messages as p
from ppmq.store.store import Store

TOPICS = ("orders", "filescan")
SUBSCRIBERS = ("indexer", "archiver")
PER_STEP = 1_000
NS = 1_000_000_000


def build(path: Path, messages: int) -> float:
    """Write the store; return the seconds it took."""
    config = Config(
        server_socket="/nonexistent", data_path=str(path), sync=False, max_store_bytes=64 << 30,
        subscribers=[SubscriberConfig(name=s, socket=f"/nonexistent/{s}") for s in SUBSCRIBERS],
        topics=[TopicConfig(name=t, subscribers=list(SUBSCRIBERS), priorities=3) for t in TOPICS],
    )  # fmt: skip
    store = Store(str(path), sync=False, max_bytes=64 << 30)
    start, now = time.monotonic(), time.time_ns()
    broker = Broker(config, store, now)
    for i in range(0, messages, PER_STEP):
        topic = TOPICS[(i // PER_STEP) % len(TOPICS)]
        batch = [p.Message(payload=msgspec.Raw(b'"%0198d"' % (i + j)), priority=j % 3) for j in range(min(PER_STEP, messages - i))]
        step = broker.step([p.Request(topic=topic, messages=batch, id=msgspec.Raw(b"1"))], set(), now + i)
        assert step.replies[0].status == 200, step.replies[0]
    store.close()
    return time.monotonic() - start


def read(path: Path, master: str) -> dict[str, float]:
    """Read every row of the store through the data source, timed from load() to the last row."""
    from pyspark.sql import functions as F

    from ppmq.pipeline.datasource import PpmqDataSource
    from ppmq.pipeline.session import local_session

    spark = local_session(master, "ppmq datasource_scale")
    spark.dataSource.register(PpmqDataSource)
    try:
        start = time.monotonic()
        df = spark.read.format("ppmq").load(str(path))
        (row,) = df.agg(F.count("*").alias("rows"), F.sum(F.length("payload")).alias("payload_chars")).collect()
        seconds = time.monotonic() - start
        return {"rows": row["rows"], "seconds": seconds, "partitions": df.rdd.getNumPartitions(), "rows_per_s": row["rows"] / seconds}
    finally:
        spark.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--keep", type=Path, help="build the store here, or reuse the one already there")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ppmq-datasource-") as tmp:
        path = args.keep or Path(tmp) / "store"
        built = None
        if not (path / "data.mdb").exists():
            path.mkdir(parents=True, exist_ok=True)
            built = build(path, args.messages)
        size_mb = os.path.getsize(path / "data.mdb") / (1 << 20)
        result = read(path, args.master)
    print(f"read {result['rows']:,} rows ({size_mb:,.0f} MB store) on {args.master} in {result['seconds']:.1f} s, "
          f"{result['partitions']} partitions: {result['rows_per_s']:,.0f} rows/s", file=sys.stderr)  # fmt: skip
    print(json.dumps({"messages": args.messages, "store_mb": size_mb, "build_s": built, "master": args.master, **result}))


if __name__ == "__main__":
    main()
