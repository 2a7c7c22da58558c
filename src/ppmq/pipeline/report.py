"""The fleet report: journals of any number of hosts -> Parquet tables and report.html.

`ppmq report` runs it on a local Spark; `submit.py` runs the same code under
spark-submit on a cluster. Tables go to OUT/<name>/ as Parquet, the page to
OUT/report.html, both through Spark's file systems, so OUT may be any URI
Spark writes (a local directory, hdfs://, s3a://...).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, NamedTuple

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from ppmq.pipeline import charts, fleet, multiples, tables
from ppmq.pipeline.page import fleet_wide, image, none, page, shown, table
from ppmq.pipeline.progress import Progress

Row = dict[str, Any]

SUBSCRIBER_COLUMNS = [
    "host", "topic", "subscriber", "messages", "bytes", "delivered", "redelivered", "redelivery_rate", "acked",
    "ack_p50_s", "ack_p95_s", "ack_p99_s", "deliver_p50_s", "deliver_p95_s", "deliver_p99_s",
    "expired", "expired_before_delivery", "overflowed", "ack_timeouts", "replaced",
    "nacks", "nack_rate", "delayed_nacks", "rejected", "reject_rate", "touches", "purged", "redriven", "pauses", "resumes",
]  # fmt: skip
HOST_COLUMNS = [
    "host", "events", "published", "delivered", "redelivery_rate", "acked", "ack_p50_s", "ack_p99_s", "deliver_p99_s",
    "first", "last", "journal_dropped", "unknown_version_records",
]  # fmt: skip


class Summary(NamedTuple):
    hosts: int
    events: int  # per-message entries of the records read, plus records without any
    seconds: float  # wall time of the whole report

    def line(self, out: str) -> str:
        return f"{self.events:,} events from {self.hosts} hosts in {self.seconds:.1f} s: {out.rstrip('/')}/report.html"


def report(spark: SparkSession, paths: Sequence[str], out: str, progress: Progress | None = None) -> Summary:
    """Parse the journals once into OUT/records, compute every table from that, write
    each as Parquet, then write report.html from them."""
    start = time.monotonic()
    base = out.rstrip("/")
    step = progress.step if progress is not None else _silent
    with step("reading journals"):
        recs = tables.records(tables.read_journal(spark, paths))
        recs.write.partitionBy(*tables.PARTITIONS).mode("overwrite").parquet(f"{base}/records")
    recs = spark.read.schema(recs.schema).parquet(f"{base}/records")
    # Per host, topic, subscriber, kind and minute: small next to the records, and read by four tables.
    rolled = tables.rollup(recs).persist(StorageLevel.MEMORY_AND_DISK)
    # Per subscriber and bucket, as small, and read by two tables: the acks' join runs once.
    histogram = tables.latency_histogram(recs).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        rows = {}
        for name, frame in (
            ("hosts", lambda: tables.hosts(rolled, histogram)),
            ("topics", lambda: tables.topics(rolled)),
            ("throughput", lambda: tables.throughput(rolled)),
            ("subscribers", lambda: tables.subscribers(rolled, histogram)),
            ("fleet", lambda: tables.fleet(histogram)),
            ("slowest", lambda: tables.slowest(spark.read.parquet(f"{base}/subscribers"))),
        ):
            with step(name):
                rows[name] = _write(spark, frame(), f"{base}/{name}")
    finally:
        rolled.unpersist()
        histogram.unpersist()
    _write_text(spark, f"{base}/report.html", render(rows))
    return Summary(len(rows["hosts"]), sum(r["events"] for r in rows["hosts"]), time.monotonic() - start)


@contextmanager
def _silent(name: str) -> Iterator[None]:
    yield


def _write(spark: SparkSession, df: DataFrame, path: str) -> list[Row]:
    """Write a table as Parquet and read it back: what the page shows is what was written."""
    df.write.mode("overwrite").parquet(path)
    return [r.asDict() for r in spark.read.parquet(path).collect()]


def _write_text(spark: SparkSession, uri: str, text: str) -> None:
    """Write a file through Hadoop's FileSystem, which knows every scheme Spark does."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None, "the driver's, while its session runs"
    path = jvm.org.apache.hadoop.fs.Path(uri)
    fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    fs.setWriteChecksum(False)
    stream = fs.create(path, True)
    try:
        stream.write(bytearray(text.encode()))
    finally:
        stream.close()


def render(rows: dict[str, list[Row]]) -> str:
    """report.html from the tables' rows: the fleet and its hosts first, then the charts
    across hosts and the per-subscriber detail."""
    key = lambda r: (r["host"] or "", r["topic"] or "", r.get("subscriber") or "")  # noqa: E731
    subs = sorted(rows["subscribers"], key=key)
    flow = sorted(rows["throughput"], key=lambda r: r["minute"])
    slowest = sorted(rows["slowest"], key=lambda r: -r["ack_p95_s"])
    hosts = sorted(rows["hosts"], key=lambda r: r["host"] or "")
    per_minute = (
        ("Published per minute", "publish", "Messages published, busiest hosts and topics", "published"),
        ("Delivered per minute", "deliver", "First deliveries, busiest subscribers", "delivered"),
        ("Acknowledged per minute", "ack", "Acks, busiest subscribers", "acked"),
    )
    sections = [
        *_fleet_sections(hosts, flow, rows["fleet"][0] if rows["fleet"] else {}),
        *(
            (heading, _chart(charts.throughput(flow, event, title), f"{verb} per minute", f"nothing {verb}"))
            for heading, event, title, verb in per_minute
        ),
        (
            "Slowest subscribers",
            _chart(charts.latency(subs), "latency per subscriber", "no ack with its publish in the journals")
            + (table(slowest, list(slowest[0])) if slowest else ""),
        ),
        (
            "Redeliveries and messages never delivered",
            _chart(charts.losses(subs), "redeliveries and losses", "no redelivery, expiry or replacement"),
        ),
        ("Subscribers", table(subs, SUBSCRIBER_COLUMNS)),
        (
            "Topics",
            table(
                sorted(rows["topics"], key=key),
                ["host", "topic", "published", "published_bytes", "replaced", "rejected_requests", "rejected_messages"],
            ),
        ),
    ]
    return page("ppmq delivery report", sections, datetime.now(UTC), [h["host"] for h in hosts if h["host"]])


def _chart(png: bytes | None, alt: str, empty: str) -> str:
    """A chart across hosts, or "none" and why when it has nothing to draw."""
    return fleet_wide(none(empty) if png is None else image(png, alt))


def _fleet_sections(hosts: list[Row], flow: list[Row], latencies: Row) -> list[tuple[str, str]]:
    """The fleet summary with its worst hosts, one row per host, one small panel per host."""
    worst = multiples.top(hosts, "ack_p99_s", "Hosts by publish-to-ack p99") + multiples.top(
        hosts, "redelivery_rate", "Hosts by redelivery rate (redeliveries per delivered message)"
    )
    series = multiples.per_host(flow)
    span = (flow[0]["minute"], flow[-1]["minute"]) if flow else None  # flow is in time order
    panels = "".join(multiples.panel(h["host"] or "", series.get(h["host"] or "", {}), span, _caption(h)) for h in hosts)
    totals = fleet.totals(hosts)

    def cell(row: Row, column: str) -> str:
        """The fleet's and the median host's value in the format of the row's figure."""
        value = row[column]
        if column not in ("fleet", "median_host"):
            return str(value)
        return shown(row["figure"], value, totals)

    summary = table(fleet.summary(hosts, latencies), ["figure", "fleet", "median_host", "worst_hosts"], cell)
    return [
        ("Fleet", fleet_wide(summary + worst)),
        ("Hosts", table(hosts, HOST_COLUMNS)),
        ("Per host: messages per minute", multiples.legend() + panels),
    ]


def _caption(host: Row) -> str:
    """A panel's figures, so that a filtered page still shows the host's latency and losses."""
    return ", ".join(
        f"{name} {shown(column, host.get(column), host)}" for name, column in (("ack p99", "ack_p99_s"), ("redelivered", "redelivery_rate"))
    )
