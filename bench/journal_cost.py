"""What the delivery journal costs: bench/quick.py's fan-out with the journal on and off.

    .venv/bin/python bench/journal_cost.py [--messages 50000] [--runs 3] [--sync true|false]

Runs alternate on, off, on, off... so that a change in the machine's load hits
both alike; each figure is the median of `--runs` runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from quick import fanout  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sync", choices=("true", "false"), default="true")
    args = ap.parse_args()
    runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for _ in range(args.runs):
        for on in (True, False):
            runs[on].append(fanout(args.messages, args.sync == "true", Journal={"Enabled": on}))
    results = {}
    for on in (True, False):
        rates, cpus = zip(*runs[on])
        results["on" if on else "off"] = {"median_msgs_per_s": statistics.median(rates), "broker_cpu_s_per_10k": statistics.median(cpus), "runs": rates}
    on, off = results["on"], results["off"]
    change = on["median_msgs_per_s"] / off["median_msgs_per_s"] - 1
    print(
        f"fan-out to 2 subscribers, Sync {args.sync}: journal on {on['median_msgs_per_s']:,.0f} msg/s "
        f"(CPU {on['broker_cpu_s_per_10k']:.2f} s/10k), off {off['median_msgs_per_s']:,.0f} msg/s "
        f"(CPU {off['broker_cpu_s_per_10k']:.2f} s/10k): throughput {change:+.1%}"
    )
    print(json.dumps({"sync": args.sync, **results, "throughput_change": change}))


if __name__ == "__main__":
    main()
