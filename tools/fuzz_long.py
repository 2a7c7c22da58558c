"""The fuzzing of tests/wire/test_fuzz.py with a larger budget.

    .venv/bin/python tools/fuzz_long.py [--examples 5000]

Runs the module against one real broker with `PPMQ_FUZZ_EXAMPLES` examples per
fuzzing test (the default tests use 200) and prints hypothesis' statistics;
exits with pytest's status.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=5000, help="hypothesis examples per fuzzing test")
    args = parser.parse_args()
    env = {**os.environ, "PPMQ_FUZZ_EXAMPLES": str(args.examples)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--hypothesis-show-statistics", "tests/wire/test_fuzz.py"],
        cwd=ROOT,
        env=env,
    )
    print(f"{args.examples} examples per test, {time.monotonic() - started:.0f}s, exit {done.returncode}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
