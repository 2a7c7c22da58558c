"""The storage floor of a paced step: the LMDB writes of one, without ppmq's logic.

    .venv/bin/python tools/step_floor.py [--messages 3000] [--pause-ms 0]

At 1,000 msg/s a step carries one publish and the two subscribers' acks of the
message before (`tools/writer_cost.py --batch 1 --shared`). Its transaction
puts six rows (the message's bodies and holders rows, a flight row for each
subscriber, the topic's counters and the head record) and deletes four (the
acked message's bodies, holders and two flight rows), then commits without
fsync: what cProfile and strace count for one. This script makes the same
puts and deletes, with rows of about the same sizes, through py-lmdb into an
environment opened as ppmq opens its store, and times each transaction with
`time.thread_time()`, as writer_cost.py times a step. The difference between
the two is what ppmq's own Python costs a step beyond its store. `--pause-ms N`
idles N ms before each step, outside the time counted, as writer_cost.py's does.
"""

from __future__ import annotations

import argparse
import struct
import tempfile
import time
from typing import Any

import lmdb

TM = struct.Struct(">IQ")  # topic, message: a bodies or holders row
TSM = struct.Struct(">IHQ")  # topic, subscriber, batch: a flight row
BODY_ROW = b"b" * 270  # one message of 200 bytes with its fragment and head
HOLDERS_ROW = b"h" * 34  # one message, two holders
FLIGHT_ROW = b"f" * 37  # a deadline and one entry
TOPIC_RECORD = b"c" * 120
HEAD_RECORD = b"s" * 60
SUBSCRIBERS = (1, 2)


def step(env: lmdb.Environment, dbs: dict[str, Any], t: int, m: int) -> None:
    """Message m published and put in flight to both subscribers, m - 1 acked by both and gone."""
    with env.begin(write=True) as txn:
        if m > 1:
            txn.delete(TM.pack(t, m - 1), db=dbs["bodies"])
            txn.delete(TM.pack(t, m - 1), db=dbs["holders"])
            for s in SUBSCRIBERS:
                txn.delete(TSM.pack(t, s, m - 1), db=dbs["flights"])
        txn.put(TM.pack(t, m), BODY_ROW, db=dbs["bodies"])
        txn.put(TM.pack(t, m), HOLDERS_ROW, db=dbs["holders"])
        for s in SUBSCRIBERS:
            txn.put(TSM.pack(t, s, m), FLIGHT_ROW, db=dbs["flights"])
        txn.put(b"topic:bench", TOPIC_RECORD, db=dbs["meta"])
        txn.put(b"state", HEAD_RECORD, db=dbs["meta"])


def run(messages: int, pause_s: float) -> float:
    """Microseconds of thread CPU a step, the pauses not counted."""
    with tempfile.TemporaryDirectory(prefix="ppmq-floor-") as d:
        env = lmdb.open(d, map_size=1 << 30, max_dbs=16, sync=False, metasync=False, readahead=False, lock=True)
        dbs = {name: env.open_db(name.encode()) for name in ("bodies", "holders", "flights", "meta")}
        cpu = 0.0
        for m in range(1, messages + 1):
            if pause_s:
                time.sleep(pause_s)
            start = time.thread_time()
            step(env, dbs, 1, m)
            cpu += time.thread_time() - start
        env.close()
    return cpu / messages * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=3000)
    ap.add_argument("--pause-ms", type=float, default=0.0, help="idle this long before each step (not timed)")
    args = ap.parse_args()
    print(f"the store's part of a step: {run(args.messages, args.pause_ms / 1000):.1f} us (pause {args.pause_ms:g} ms)")


if __name__ == "__main__":
    main()
