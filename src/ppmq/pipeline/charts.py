"""The report's charts: matplotlib figures rendered to PNG bytes, for embedding.

Each chart answers one question an operator asks first: is traffic flowing,
who is slow, and where are messages lost or repeated.
"""

from __future__ import annotations

import io
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: render to memory
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

MAX_SERIES = 8  # lines per chart; the busiest are kept
Row = dict[str, Any]


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _label(row: Row) -> str:
    sub = row.get("subscriber")
    return f"{row['host']} {row['topic']}" + (f" -> {sub}" if sub else "")


def throughput(rows: list[Row], event: str, title: str) -> bytes | None:
    """Messages per minute of one event kind, one line per (host, topic, subscriber);
    None without a message of that kind."""
    series: dict[str, dict[datetime, int]] = defaultdict(dict)
    for r in rows:
        if r["event"] == event:
            series[_label(r)][r["minute"]] = r["messages"]
    if not any(any(s.values()) for s in series.values()):
        return None
    busiest = sorted(series, key=lambda k: -sum(series[k].values()))[:MAX_SERIES]
    fig, ax = plt.subplots(figsize=(10, 3.6))
    minutes = sorted({t for name in busiest for t in series[name]})
    for name in busiest:
        # each series over its own minutes, which the table zero-fills over its host's journal
        own = sorted(series[name])
        # matplotlib's stubs leave out what its units registry converts, datetimes among them (matplotlib#27140)
        ax.plot(own, [series[name][t] for t in own], marker="o", markersize=3, label=name)  # type: ignore[arg-type]
    ax.set_title(title)
    ax.set_ylabel("messages / minute")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    if minutes:
        ax.set_xlim(minutes[0] - timedelta(minutes=1), minutes[-1] + timedelta(minutes=1))  # type: ignore[arg-type]  # as plot's
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(ax.xaxis.get_major_locator()))
        ax.legend(fontsize=8, loc="upper left")
    return _png(fig)


def latency(subs: list[Row]) -> bytes | None:
    """Publish-to-ack p50 / p95 / p99 per subscriber, slowest at the top; None if no
    subscriber has them."""
    rows = sorted((r for r in subs if r.get("ack_p95_s") is not None), key=lambda r: r["ack_p95_s"])[-2 * MAX_SERIES :]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(rows) + 1.2))
    y = list(range(len(rows)))
    for offset, key, color in ((-0.27, "ack_p50_s", "#1f77b4"), (0, "ack_p95_s", "#ff7f0e"), (0.27, "ack_p99_s", "#d62728")):
        ax.barh([i + offset for i in y], [r[key] for r in rows], height=0.27, color=color, label=key.split("_")[1])
    ax.set_yticks(y, [_label(r) for r in rows])
    ax.set_xscale("symlog", linthresh=0.01)
    ax.set_xlabel("seconds from publish to ack")
    ax.set_title("Publish-to-ack latency per subscriber")
    ax.legend(fontsize=8, loc="lower right", reverse=True)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def losses(subs: list[Row]) -> bytes | None:
    """Per subscriber: share of deliveries that were redeliveries, and messages lost to
    expiry or replaced; None if no subscriber has any."""
    if not any(r["redelivery_rate"] or r["expired_before_delivery"] or r["replaced"] for r in subs):
        return None
    # the worst by redelivery, then by losses: with a fleet's subscribers, those are the ones to show
    worst = sorted(subs, key=lambda r: (-(r["redelivery_rate"] or 0), -(r["expired_before_delivery"] + (r["replaced"] or 0))))
    rows = sorted(worst[: 2 * MAX_SERIES], key=_label)
    names = [_label(r) for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.45 * len(rows) + 1.2), sharey=True)
    y = list(range(len(rows)))
    left.barh(y, [100 * (r["redelivery_rate"] or 0) for r in rows], color="#9467bd")
    left.set_yticks(y, names)
    left.set_xlabel("% of deliveries that were redeliveries")
    left.set_title("Redelivery rate")
    right.barh(
        [i - 0.2 for i in y], [r["expired_before_delivery"] for r in rows], height=0.4, label="expired before delivery", color="#8c564b"
    )
    right.barh([i + 0.2 for i in y], [r["replaced"] or 0 for r in rows], height=0.4, label="replaced by dedupe (topic)", color="#17becf")
    right.set_xlabel("messages")
    right.set_title("Never delivered")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.grid(axis="x", alpha=0.3)
    return _png(fig)
