"""The fleet summary: the hosts table's rows folded into one row per figure.

With 50 hosts nobody reads 50 rows first; an operator wants the fleet's totals,
what a typical host looks like (the median, which one bad host cannot move) and
which hosts are worst, to open their rows next. Plain Python: the hosts table
has one row per host, so it is small whatever the journals' size.
"""

from __future__ import annotations

from collections.abc import Callable
from statistics import median
from typing import Any, NamedTuple

Row = dict[str, Any]
WORST = 3  # hosts named per figure


class Figure(NamedTuple):
    column: str  # of the hosts table
    # the fleet's value from the hosts'; None for a percentile, which the hosts' do not
    # give: the fleet table has it, from the latency histograms of all hosts together
    fleet: Callable[[list[Row], str], float | int | None] | None
    high_is_bad: bool  # worst hosts are those with the highest value


def _sum(hosts: list[Row], column: str) -> int:
    return sum(r.get(column) or 0 for r in hosts)


def _rate(hosts: list[Row], column: str) -> float | None:
    """The fleet's redeliveries per delivered message, not a mean of the hosts' rates,
    so that a quiet host weighs what it delivered; None if nothing was delivered, as
    a host's rate is then."""
    delivered = _sum(hosts, "delivered")
    return _sum(hosts, "redelivered") / delivered if delivered else None


FIGURES = [
    Figure("events", _sum, False),
    Figure("published", _sum, False),
    Figure("delivered", _sum, False),
    Figure("acked", _sum, False),
    Figure("redelivery_rate", _rate, True),
    Figure("ack_p99_s", None, True),
    Figure("deliver_p99_s", None, True),
    Figure("journal_dropped", _sum, True),
]


def summary(hosts: list[Row], latencies: Row) -> list[Row]:
    """One row per figure: the fleet's value, the median host's, and the worst hosts;
    `latencies` is the fleet table's row, with the fleet's percentiles."""
    return [_row(hosts, f, latencies) for f in FIGURES]


def totals(hosts: list[Row]) -> Row:
    """The fleet's counts that say why a figure of the fleet is empty (page.why_empty)."""
    return {c: _sum(hosts, c) for c in ("acked", "delivered")}


def _row(hosts: list[Row], figure: Figure, latencies: Row) -> Row:
    known = [r for r in hosts if r.get(figure.column) is not None]
    values = [r[figure.column] for r in known]
    return {
        "figure": figure.column,
        "fleet": figure.fleet(hosts, figure.column) if figure.fleet else latencies.get(figure.column),
        "median_host": median(values) if values else None,
        "worst_hosts": ", ".join(r["host"] for r in worst(known, figure.column)) if figure.high_is_bad else "",
    }


def worst(hosts: list[Row], column: str, n: int = WORST) -> list[Row]:
    """The `n` hosts with the highest nonzero value of `column`, highest first; ties by name."""
    bad = [r for r in hosts if r.get(column)]
    return sorted(bad, key=lambda r: (-r[column], r["host"]))[:n]
