"""Instructions per message of tools/writer_cost.py's workload, counted by callgrind.

    .venv/bin/python tools/instructions.py [writer_cost.py's options, e.g. --journal off]

Runs writer_cost.py under valgrind's callgrind twice, with 2,500 and with 7,500
messages, and prints the difference divided by 5,000: what one more message
costs, start-up and imports cancelled out. Unlike CPU time on a shared machine
the count does not vary from run to run (hash seed fixed), so it tells apart
changes of a few hundred instructions a message, which timing runs cannot: the
journal's whole cost is about 3% of a message's. It includes writer_cost.py's
own decoding of the batches it acks, the same for every variant. Needs valgrind.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SMALL, LARGE = 2_500, 7_500
WRITER_COST = Path(__file__).with_name("writer_cost.py")
CALLGRIND = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]  # the count only, no profile file


def collected(stderr: str) -> int | None:
    """The instructions callgrind counted, from what it wrote to stderr; None if it did not run."""
    found = re.search(r"Collected : (\d+)", stderr)
    return int(found.group(1)) if found else None


def instructions(messages: int, options: list[str]) -> int:
    """Instructions callgrind counts for one run of writer_cost.py."""
    run = subprocess.run(
        [*CALLGRIND, sys.executable, str(WRITER_COST), "--messages", str(messages), *options],
        env={**os.environ, "PYTHONHASHSEED": "0"}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    count = collected(run.stderr)
    if count is None:
        sys.exit(f"callgrind counted nothing:\n{run.stderr}")
    return count


def main() -> None:
    options = sys.argv[1:]
    if "--messages" in options:
        sys.exit("instructions.py sets --messages itself")
    per_message = (instructions(LARGE, options) - instructions(SMALL, options)) / (LARGE - SMALL)
    print(f"{per_message:,.0f} instructions a message ({' '.join(options) or 'writer_cost.py defaults'})")


if __name__ == "__main__":
    main()
