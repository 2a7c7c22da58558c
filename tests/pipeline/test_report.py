"""The fleet report on journals of real brokers, checked against what the workload did."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from ppmq.cli.main import main

from .conftest import SLOW_GROUPS, Workload


@pytest.fixture(scope="module")
def out(spark: SparkSession, workload: Workload, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`ppmq report JOURNAL... --out DIR`, run once for the module (on the session's Spark)."""
    out = tmp_path_factory.mktemp("report") / "out"
    assert main(["report", *map(str, workload.journals), "--out", str(out)]) == 0
    return out


def rows(spark: SparkSession, out: Path, name: str) -> list[dict]:
    return [r.asDict() for r in spark.read.parquet(str(out / name)).collect()]


def by_sub(spark: SparkSession, out: Path) -> dict[tuple[str, str, str], dict]:
    return {(r["host"], r["topic"], r["subscriber"]): r for r in rows(spark, out, "subscribers")}


def test_messages_and_bytes_per_host_topic_and_subscriber(spark, workload, out) -> None:
    subs = by_sub(spark, out)
    n = sum(k for k, _ in SLOW_GROUPS)
    assert {k: (r["messages"], r["acked"]) for k, r in subs.items() if k[1] == "orders"} == {
        ("alpha", "orders", "fast"): (n, n),
        ("alpha", "orders", "slow"): (n, n),
        ("beta", "orders", "fast"): (25, 25),
    }
    for key, size in workload.delivered_bytes.items():
        assert subs[key]["bytes"] == size, key
    topics = {(r["host"], r["topic"]): r for r in rows(spark, out, "topics")}
    assert {k: r["published"] for k, r in topics.items()} == workload.published


def test_publish_to_ack_percentiles_match_the_known_delays(spark, workload, out) -> None:
    """The slow subscriber acked 40 messages at once, 16 after 0.6 s and 4 after
    1.6 s; each message's true latency lies between bounds the test measured, so
    the k-th smallest latency lies between the k-th smallest bounds."""
    slow = by_sub(spark, out)[("alpha", "orders", "slow")]
    least = sorted(lo for lo, _ in workload.ack_bounds_s)
    most = sorted(hi for _, hi in workload.ack_bounds_s)
    for column, rank in (("ack_p50_s", 30), ("ack_p95_s", 57), ("ack_p99_s", 60)):
        assert least[rank - 1] <= slow[column] <= most[rank - 1], (column, slow[column], least[rank - 1], most[rank - 1])
    assert slow["ack_p95_s"] >= 1.6 > slow["ack_p50_s"]
    fast = by_sub(spark, out)[("alpha", "orders", "fast")]
    assert fast["ack_p99_s"] < slow["ack_p95_s"]
    assert 0 <= fast["deliver_p50_s"] <= fast["ack_p50_s"]


def test_redeliveries_expiries_replacements_and_rejections(spark, out) -> None:
    subs = by_sub(spark, out)
    flaky = subs[("alpha", "jobs", "flaky")]
    assert (flaky["messages"], flaky["delivered"], flaky["redelivered"], flaky["redelivery_rate"]) == (10, 20, 10, 0.5)
    away = subs[("alpha", "cache", "away")]
    assert (away["expired"], away["expired_before_delivery"], away["replaced"], away["messages"]) == (3, 3, 2, 0)
    assert subs[("alpha", "orders", "fast")]["redelivery_rate"] == 0.0
    orders = {r["host"]: r for r in rows(spark, out, "topics") if r["topic"] == "orders"}
    assert (orders["alpha"]["rejected_requests"], orders["alpha"]["rejected_messages"]) == (1, 2)
    assert orders["beta"]["rejected_requests"] == 0


def test_the_slowest_subscriber_comes_first(spark, out) -> None:
    slowest = rows(spark, out, "slowest")
    top = max(slowest, key=lambda r: r["ack_p95_s"])
    assert (top["host"], top["topic"], top["subscriber"]) == ("alpha", "orders", "slow")


def test_throughput_per_minute_adds_up_to_the_totals(spark, workload, out) -> None:
    totals: dict[tuple, int] = {}
    for r in rows(spark, out, "throughput"):
        key = (r["host"], r["topic"], r["subscriber"], r["event"])
        totals[key] = totals.get(key, 0) + r["messages"]
    assert {(h, t): totals[(h, t, None, "publish")] for h, t in workload.published} == workload.published
    assert totals[("beta", "orders", "fast", "deliver")] == totals[("beta", "orders", "fast", "ack")] == 25


def test_hosts_table_counts_what_was_read(spark, out) -> None:
    hosts = {r["host"]: r for r in rows(spark, out, "hosts")}
    assert set(hosts) == {"alpha", "beta"}
    assert hosts["beta"]["events"] == 25 * 3  # published, delivered, acked
    assert all(r["journal_dropped"] == 0 and r["unknown_version_records"] == 0 for r in hosts.values())
    assert hosts["beta"]["first"] <= hosts["beta"]["last"]


def test_the_output_directory_holds_the_tables_and_the_page(out) -> None:
    assert sorted(p.name for p in out.iterdir()) == [
        "fleet", "hosts", "records", "report.html", "slowest", "subscribers", "throughput", "topics",
    ]  # fmt: skip


def test_the_fleet_table_has_the_percentiles_of_all_hosts_together(spark, out) -> None:
    """The slow subscriber's 20 late acks are an eighth of the fleet's 155 (60 + 60 + 10
    on alpha, 25 on beta): the fleet's p95 is one of them, its p50 a prompt one."""
    (fleet,) = rows(spark, out, "fleet")
    slow = by_sub(spark, out)[("alpha", "orders", "slow")]
    assert fleet["ack_p95_s"] >= 0.6 > fleet["ack_p50_s"]
    assert fleet["ack_p99_s"] == slow["ack_p99_s"]


def test_an_empty_latency_or_rate_cell_says_why(out) -> None:
    """`away` was delivered nothing: its messages expired or were replaced first."""
    page = (out / "report.html").read_text()
    away = re.search(
        r'<tr data-host="alpha"><td class="text">alpha</td><td class="text">cache</td><td class="text">away</td>.*?</tr>', page
    )
    assert away is not None
    cells = re.findall(r"<td>([^<]*)</td>", away.group())
    assert cells.count("no acks") == 3 and cells.count("no deliveries") == 3 and cells.count("nothing delivered") == 3
    assert "-" not in cells


def test_report_html_is_one_self_contained_page_with_charts(out) -> None:
    page = (out / "report.html").read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 5
    assert all(base64.b64decode(i).startswith(b"\x89PNG\r\n\x1a\n") for i in images)
    assert '<td class="text">slow</td>' in page and '<td class="text">beta</td>' in page
    # The images' base64 is left out: "http" turns up in about one page in a hundred by chance.
    text = re.sub(r'src="data:image/png;base64,[^"]+"', "", page).replace("http-equiv", "")
    assert "http" not in text, "nothing is loaded from elsewhere"
