"""The report's charts: matplotlib figures rendered to PNG bytes, for embedding.

Each chart answers one question an operator asks first: is traffic flowing,
who is slow, and where are messages lost or repeated.
"""

from __future__ import annotations

import io
from collections import defaultdict
from datetime import datetime
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: render to memory
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

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


def throughput(rows: list[Row], event: str, title: str) -> bytes:
    """Messages per minute of one event kind, one line per (host, topic, subscriber)."""
    series: dict[str, dict[datetime, int]] = defaultdict(dict)
    for r in rows:
        if r["event"] == event:
            series[_label(r)][r["minute"]] = r["messages"]
    busiest = sorted(series, key=lambda k: -sum(series[k].values()))[:MAX_SERIES]
    fig, ax = plt.subplots(figsize=(10, 3.6))
    for name in busiest:
        points = sorted(series[name].items())
        ax.plot([t for t, _ in points], [n for _, n in points], marker="o", markersize=3, label=name)
    ax.set_title(title)
    ax.set_ylabel("messages / minute")
    ax.grid(alpha=0.3)
    if busiest:
        ax.legend(fontsize=8, loc="upper left")
    fig.autofmt_xdate()
    return _png(fig)


def latency(subs: list[Row]) -> bytes:
    """Publish-to-ack p50 / p95 / p99 per subscriber, slowest at the top."""
    rows = sorted((r for r in subs if r.get("ack_p95_s") is not None), key=lambda r: r["ack_p95_s"])[-2 * MAX_SERIES :]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.2))
    names = [_label(r) for r in rows]
    for key, color in (("ack_p99_s", "#d62728"), ("ack_p95_s", "#ff7f0e"), ("ack_p50_s", "#1f77b4")):
        ax.barh(names, [r[key] for r in rows], color=color, label=key.split("_")[1])
    ax.set_xscale("symlog", linthresh=0.01)
    ax.set_xlabel("seconds from publish to ack")
    ax.set_title("Publish-to-ack latency per subscriber")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def losses(subs: list[Row]) -> bytes:
    """Per subscriber: share of deliveries that were redeliveries, and messages lost to expiry or replaced."""
    rows = sorted(subs, key=_label)[: 2 * MAX_SERIES]
    names = [_label(r) for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.45 * len(rows) + 1.2), sharey=True)
    y = list(range(len(rows)))
    left.barh(y, [100 * (r["redelivery_rate"] or 0) for r in rows], color="#9467bd")
    left.set_yticks(y, names)
    left.set_xlabel("% of deliveries that were redeliveries")
    left.set_title("Redelivery rate")
    right.barh([i - 0.2 for i in y], [r["expired_before_delivery"] for r in rows], height=0.4, label="expired before delivery", color="#8c564b")
    right.barh([i + 0.2 for i in y], [r["replaced"] or 0 for r in rows], height=0.4, label="replaced by dedupe (topic)", color="#17becf")
    right.set_xlabel("messages")
    right.set_title("Never delivered")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.grid(axis="x", alpha=0.3)
    return _png(fig)
