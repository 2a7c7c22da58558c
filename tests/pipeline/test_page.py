"""report.html from tables' rows, without Spark: what an empty chart and an empty cell
say, and that a figure is written one way wherever it appears."""

from __future__ import annotations

import re
from datetime import datetime

from ppmq.pipeline.report import render

MINUTE = datetime(2026, 11, 29, 12, 0)
NO_LATENCIES = {f"{kind}_p{q}_s": None for kind in ("ack", "deliver") for q in (50, 95, 99)}


def _host(name: str, **figures) -> dict:
    return {
        "host": name, "records": 1, "events": 3, "published": 3, "delivered": 0, "redelivered": 0, "redelivery_rate": None,
        "acked": 0, "first": MINUTE, "last": MINUTE, "journal_dropped": 0, "unknown_version_records": 0, **NO_LATENCIES, **figures,
    }  # fmt: skip


def _text(page: str) -> str:
    """The page's body without its images' base64, where any digits turn up by chance."""
    return re.sub(r'src="data:image/png;base64,[^"]+"', "", page.split("<body>")[1])


def _section(page: str, heading: str) -> str:
    return page.split(f"<h2>{heading}</h2>")[1].split("<h2>")[0]


def test_a_fleet_that_only_publishes_has_charts_that_say_none_and_cells_that_say_why() -> None:
    page = render(
        {
            "hosts": [_host("web1"), _host("idle1", events=1, published=0)],
            "topics": [{"host": "web1", "topic": "orders", "published": 3, "published_bytes": 120, "replaced": 0}],
            "throughput": [{"host": "web1", "topic": "orders", "subscriber": None, "event": "publish", "minute": MINUTE, "messages": 3}],
            "subscribers": [],
            "slowest": [],
            "fleet": [NO_LATENCIES],
        }
    )
    assert "data:image/png" in _section(page, "Published per minute")
    for heading, why in (
        ("Delivered per minute", "nothing delivered"),
        ("Acknowledged per minute", "nothing acked"),
        ("Slowest subscribers", "no ack with its publish in the journals"),
        ("Redeliveries and messages never delivered", "no redelivery, expiry or replacement"),
        ("Subscribers", "nothing in the journals"),
    ):
        assert f'<p class="note none">none: {why}</p>' in _section(page, heading), heading
    fleet = _section(page, "Fleet")
    assert fleet.count("none: no host has this figure") == 2  # the top-N charts by ack p99 and by redelivery rate
    for figure, why in (("ack_p99_s", "no acks"), ("deliver_p99_s", "no deliveries"), ("redelivery_rate", "nothing delivered")):
        assert f'<td class="text">{figure}</td><td>{why}</td><td>{why}</td>' in fleet, figure
    assert "<td>no acks</td>" in _section(page, "Hosts")
    panels = _section(page, "Per host: messages per minute")
    assert "ack p99 no acks, redelivered nothing delivered" in panels
    idle, web = (re.findall(rf'<figure class="multiple" data-host="{h}">.*?</figure>', panels)[0] for h in ("idle1", "web1"))
    assert ">none</text>" in idle and "<polyline" not in idle
    assert ">none</text>" not in web and "<polyline" in web


def test_a_figure_has_one_format_wherever_it_appears() -> None:
    """A rate as a percentage and seconds with their unit: in the tables, the fleet
    summary, the top-N bars and the panels' captions alike."""
    figures = {"delivered": 4, "redelivered": 1, "redelivery_rate": 0.25, "acked": 3, "ack_p99_s": 0.125, "deliver_p99_s": 0.0625}
    latencies = {**NO_LATENCIES, "ack_p99_s": 0.125, "deliver_p99_s": 0.0625}
    page = _text(
        render(
            {
                "hosts": [_host("web1", **figures)],
                "topics": [],
                "throughput": [],
                "subscribers": [],
                "slowest": [],
                "fleet": [latencies],
            }
        )
    )
    assert "0.25" not in page and set(re.findall(r"0\.0625(..)", page)) == {" s"}
    assert '<td class="text">redelivery_rate</td><td>25%</td><td>25%</td>' in page  # the fleet's, the median host's
    assert '<td class="text">ack_p99_s</td><td>0.125 s</td><td>0.125 s</td>' in page
    hosts = _section(page, "Hosts")
    assert "<td>25%</td>" in hosts and "<td>0.125 s</td>" in hosts and "<td>0.0625 s</td>" in hosts
    assert ">25%</text>" in page and ">0.125 s</text>" in page  # the top-N bars' labels
    assert "ack p99 0.125 s, redelivered 25%" in page
