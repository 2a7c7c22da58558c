"""Charts that stay readable with 50 hosts, as inline SVG: small multiples (one small
panel per host, the same axes and colours in each, a legend of three entries for
all of them) and top-N bar charts whose remaining hosts share one "others" bar.

SVG rather than PNG because each host's panel is its own element, which the page's
host filter can hide, and because 50 panels are a few kB of text each, drawn by
the browser, where 50 matplotlib figures would cost seconds to render.
"""

from __future__ import annotations

import html
from collections import defaultdict
from datetime import datetime
from statistics import median
from typing import Any

from ppmq.pipeline.page import figure, none

Row = dict[str, Any]
EVENTS = {"publish": "#1f77b4", "deliver": "#ff7f0e", "ack": "#2ca02c"}  # line colour per journal event
PANEL_W, PANEL_H = 250, 64  # px of one host's plot area
BAR_W, BAR_H, LABEL_W = 420, 18, 150  # px of the longest bar, of a bar's row, of the host names
TOP = 10  # hosts shown by name in a top-N chart

Series = dict[str, dict[datetime, int]]  # event -> minute -> messages


def per_host(throughput: list[Row]) -> dict[str, Series]:
    """The throughput table summed over topics and subscribers: per host, event and minute."""
    hosts: dict[str, Series] = defaultdict(lambda: defaultdict(lambda: defaultdict(int)))
    for r in throughput:
        if r["event"] in EVENTS:
            hosts[r["host"] or ""][r["event"]][r["minute"]] += r["messages"] or 0
    return hosts


def legend() -> str:
    """The one legend of every panel."""
    keys = "".join(f'<span class="key" style="border-color:{c}">{e}</span>' for e, c in EVENTS.items())
    return f'<p class="legend">messages per minute: {keys}</p>'


def panel(host: str, series: Series, span: tuple[datetime, datetime] | None, caption: str) -> str:
    """One host's panel: a line per event over the fleet's time span (shared x, so panels
    line up in time), scaled to the host's own busiest minute, which the panel states."""
    peak = max((n for s in series.values() for n in s.values()), default=0)
    lines = "".join(_line(series.get(e, {}), span, peak, c) for e, c in EVENTS.items())
    if not peak:
        lines += f'<text x="{PANEL_W / 2}" y="{PANEL_H / 2 + 4}" text-anchor="middle" fill="#666">none</text>'
    name = html.escape(host)
    return (
        f'<figure class="multiple" data-host="{name}"><figcaption><b>{name}</b> peak {peak:,}/min<br>{html.escape(caption)}</figcaption>'
        f'<svg width="{PANEL_W}" height="{PANEL_H}" viewBox="0 0 {PANEL_W} {PANEL_H}" role="img" aria-label="{name} messages per minute">'
        f'<rect width="{PANEL_W}" height="{PANEL_H}" fill="#fafafa"/>{lines}</svg></figure>'
    )


def _line(counts: dict[datetime, int], span: tuple[datetime, datetime] | None, peak: int, colour: str) -> str:
    """A polyline through the minutes the series has (the throughput table zero-fills
    them over the host's journal), each placed by its time within `span`."""
    if not counts or span is None:
        return ""
    start, end = span
    width = (end - start).total_seconds() or 1
    x = lambda t: PANEL_W * (t - start).total_seconds() / width  # noqa: E731
    points = " ".join(f"{x(t):.1f},{PANEL_H - 2 - (PANEL_H - 4) * counts[t] / (peak or 1):.1f}" for t in sorted(counts))
    return f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{points}"/>'


def top(hosts: list[Row], column: str, title: str, n: int = TOP) -> str:
    """The `n` hosts highest in `column` by name (if above 0), then one bar for all the
    others at their median: a fleet of any size is at most n + 1 bars."""
    known = sorted((r for r in hosts if r.get(column) is not None), key=lambda r: (-r[column], r["host"]))
    named = [r for r in known[:n] if r[column]]  # a host at 0 is not worth its name
    bars = [(r["host"], r[column]) for r in named]
    rest = [r[column] for r in known[len(named) :]]
    if rest:
        bars.append((f"others ({len(rest)}), median", median(rest)))
    return _bars(bars, title, column)


def _bars(bars: list[tuple[str, float]], title: str, column: str) -> str:
    """Labelled bars, each value written as the page writes `column`."""
    if not any(v for _, v in bars):
        why = "every host at 0" if bars else "no host has this figure"
        return f'<figure class="top"><figcaption>{html.escape(title)}</figcaption>{none(why)}</figure>'
    scale = BAR_W / (max(v for _, v in bars) or 1)
    height = BAR_H * len(bars) + 4
    rows = "".join(
        f'<g transform="translate(0,{i * BAR_H + 2})"><text x="{LABEL_W - 6}" y="13" text-anchor="end">{html.escape(name)}</text>'
        f'<rect x="{LABEL_W}" width="{max(v * scale, 1):.1f}" height="{BAR_H - 5}" fill="#d62728"/>'
        f'<text x="{LABEL_W + v * scale + 4:.1f}" y="13">{html.escape(figure(column, v))}</text></g>'
        for i, (name, v) in enumerate(bars)
    )
    width = LABEL_W + BAR_W + 90
    return (
        f'<figure class="top"><figcaption>{html.escape(title)}</figcaption>'
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">{rows}</svg></figure>'
    )
