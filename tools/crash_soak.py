"""The crash harness of tests/wire/test_crash.py, long: 500 kill -9 cycles by default.

    .venv/bin/python tools/crash_soak.py [--cycles 500] [--seed N] [--no-sync]

Each cycle starts the broker on the same DataPath, lets publishers and
subscribers work, and kills it with SIGKILL during a commit, a delivery, an
expiry sweep or a SIGHUP reload (in turn); the store is then checked with fsck
and against what was confirmed, and every generated key delivered so far must
have come with one message only. A last run drains everything. Prints the
cycles, the confirmed messages, the losses (must be zero) and the duplicates
(at-least-once redeliveries); exits 1 if any check failed. `--no-sync` runs the
broker with `Sync: false`: a kill -9 loses nothing then either, since every
commit is in the page cache (only the machine's crash would lose the last ones).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.wire.test_crash import run_cycles


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=500)
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: a fresh one, printed)")
    parser.add_argument("--no-sync", dest="sync", action="store_false", help="the broker with Sync: false")
    args = parser.parse_args()
    seed = random.randrange(1 << 30) if args.seed is None else args.seed
    print(f"seed {seed}, {args.cycles} cycles, Sync {str(args.sync).lower()}", flush=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ppmq-soak-") as tmp:
        figures = run_cycles(Path(tmp), args.cycles, seed, args.sync)
    for name, value in figures.items():
        print(f"{name}: {value}")
    print(f"time: {time.monotonic() - started:.0f}s")
    return 1 if figures["losses"] else 0


if __name__ == "__main__":
    sys.exit(main())
