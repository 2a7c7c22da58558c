"""What the delivery journal costs: tools/quick.py's fan-out with the journal on and off.

    .venv/bin/python tools/journal_cost.py [--messages 50000] [--runs 3] [--sync true|false] [--json FILE]
    .venv/bin/python tools/journal_cost.py --pool FILE [FILE ...]    # sets written with --json, pooled

Runs come in pairs, one with the journal on and one off, in the order on-off,
off-on, on-off...: a change in the machine's load hits both alike, and a run
that gains or loses from coming first or second (the previous run's files
still being written back, say) does so as often on as off. A fan-out run on a
shared 2-core machine differs from the next by up to 10%, which is larger than
the effect: so besides the ratio of the two medians this prints the median of
the pairs' ratios with a 95% bootstrap interval, and the broker's CPU per
message, which is far steadier. Tell the journal's cost from the noise with
many runs (`--runs 51`); each run is about a second.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from quick import fanout

BOOTSTRAP_SAMPLES = 2000


def interval(ratios: list[float], seed: int = 1) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of ratios (seeded: the same runs give the same interval)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(BOOTSTRAP_SAMPLES))
    return medians[int(0.025 * BOOTSTRAP_SAMPLES)], medians[int(0.975 * BOOTSTRAP_SAMPLES) - 1]


def pair_ratios(on: list, off: list) -> list[float]:
    """Each pair's throughput with the journal against without, less 1."""
    return [a[0] / b[0] - 1 for a, b in zip(on, off)]


def pool(paths: list[Path]) -> None:
    """The median of the pairs' ratios of several sets together, with its interval:
    sets of the same code taken apart move by more than a set's own interval."""
    ratios = []
    for path in paths:
        saved = json.loads(path.read_text())
        ratios += pair_ratios(saved["on"]["runs"], saved["off"]["runs"])
    low, high = interval(ratios)
    print(
        f"{len(paths)} sets, {len(ratios)} pairs: throughput {statistics.median(ratios):+.2%} (median of pairs, 95% interval {low:+.2%} to {high:+.2%})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=3, help="pairs of runs, one journal on and one off")
    ap.add_argument("--sync", choices=("true", "false"), default="true")
    ap.add_argument("--json", type=Path, help="also write every run's figures here")
    ap.add_argument("--pool", type=Path, nargs="+", metavar="JSON", help="run nothing: the pairs of sets written with --json, pooled")
    args = ap.parse_args()
    if args.pool:
        pool(args.pool)
        return
    runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for i in range(args.runs):
        for on in (True, False) if i % 2 == 0 else (False, True):
            runs[on].append(fanout(args.messages, args.sync == "true", Journal={"Enabled": on}))
    results = {}
    for on in (True, False):
        rates, cpus = zip(*runs[on])
        results["on" if on else "off"] = {
            "median_msgs_per_s": statistics.median(rates),
            "broker_cpu_s_per_10k": statistics.median(cpus),
            "runs": runs[on],
        }
    on, off = results["on"], results["off"]
    change = on["median_msgs_per_s"] / off["median_msgs_per_s"] - 1
    ratios = pair_ratios(runs[True], runs[False])
    paired = statistics.median(ratios)
    low, high = interval(ratios)
    cpu_change = on["broker_cpu_s_per_10k"] / off["broker_cpu_s_per_10k"] - 1
    print(
        f"fan-out to 2 subscribers, Sync {args.sync}, {args.runs} pairs: journal on {on['median_msgs_per_s']:,.0f} msg/s "
        f"(CPU {on['broker_cpu_s_per_10k']:.3f} s/10k), off {off['median_msgs_per_s']:,.0f} msg/s "
        f"(CPU {off['broker_cpu_s_per_10k']:.3f} s/10k): throughput {change:+.1%} (medians), "
        f"{paired:+.1%} (median of pairs, 95% interval {low:+.1%} to {high:+.1%}); broker CPU {cpu_change:+.1%}"
    )
    summary = {
        "sync": args.sync,
        "pairs": args.runs,
        **results,
        "throughput_change": change,
        "paired_change": paired,
        "paired_interval": [low, high],
        "cpu_change": cpu_change,
    }
    if args.json:
        args.json.write_text(json.dumps(summary))
    print(json.dumps({k: v for k, v in summary.items() if k not in ("on", "off")}))


if __name__ == "__main__":
    main()
