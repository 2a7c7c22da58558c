"""Journal records -> the report's tables; docs/journal.md defines every field used.

The JSON is parsed once: `records` turns each journal record into one row of
per-record figures (its array sizes and sums, taken with Spark's higher-order
functions on the record itself) plus the latencies it carries, and the ids of
publishes and version-2 acks, and the report writes that as Parquet partitioned
by host and date. Everything else reads that columnar copy, which is cheap to
scan twice and prunable by host and date: `rollup` sums the figures per host,
topic, subscriber, kind and minute (every count of every table comes from it),
and `latency_histogram` counts latencies in buckets a fixed ratio wide, per
subscriber: those records carry, and those of version-2 acks, whose ids are
joined to their publishes (ack_latency.py).

Percentiles come from those histograms, not from percentile_approx: its
per-group buffers (tens of thousands of boxed doubles each, per task) ran the
JVM out of heap with a few hundred subscribers, whereas a histogram is a plain
count per (group, bucket) that Spark aggregates in its spillable hash maps. A
bucket spans a ratio of GAMMA, so a percentile is within RELATIVE_ERROR of the
true value, and histograms of hosts add up to the fleet's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ppmq.pipeline.ack_latency import ack_latencies, entries_to_join
from ppmq.pipeline.schema import JOURNAL_SCHEMA, JOURNAL_VERSIONS, NS_PER_S

QUANTILES = [0.5, 0.95, 0.99]
RELATIVE_ERROR = 0.01  # of a percentile, from the histogram's bucket width
GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)  # ratio of a bucket's upper to lower bound
FLOOR_S = 1e-6  # latencies at or below this share the lowest bucket
SLOWEST = 10  # rows of the slowest-subscribers table
PER_SUBSCRIBER = ["host", "topic", "subscriber"]
PER_TOPIC = ["host", "topic"]
PARTITIONS = ["host", "date"]  # of the records table
RATES = {
    "redelivery": "redelivered",
    "nack": "nacks",
    "reject": "rejected",
}  # <name>_rate of the subscribers table: count per delivered message


def read_journal(spark: SparkSession, paths: Iterable[str]) -> DataFrame:
    """Every record under `paths` (files, or directories searched recursively; any
    URI Spark reads), with the declared schema: no inference pass over the files.
    Gzipped segments are read by their suffix; a line that does not parse, such as
    the cut-off last line of a segment being written, is skipped."""
    return (
        spark.read.schema(JOURNAL_SCHEMA)
        .option("mode", "DROPMALFORMED")
        .option("recursiveFileLookup", "true")
        .option("pathGlobFilter", "*.{jsonl,jsonl.gz}")
        .json(list(paths))
    )


def _size(array: Column) -> Column:
    """Entries in an array; 0 for an absent one (Spark's size() gives -1 or null)."""
    return F.when(array.isNull(), 0).otherwise(F.size(array))


def _sum(array: Column) -> Column:
    """The sum of an array of longs whose entries may be null."""
    return F.aggregate(array, F.lit(0).cast("long"), lambda a, b: a + F.coalesce(b, F.lit(0)))


def _column(name: str) -> Column:
    """A per-message column with one entry per id: version 2 writes a column whose
    entries are all equal once, which this repeats (version 1 never does, and a
    record of one message is the same either way)."""
    column = F.col(name)
    return F.when(F.size(column) == 1, F.array_repeat(F.element_at(column, 1), F.size("Ids"))).otherwise(column)


def _first(array: str) -> Column:
    """Entries of `array` for first deliveries (Attempts 1), others null."""
    return F.zip_with(_column("Attempts"), _column(array), lambda a, x: F.when(a == 1, x))


def _is(kind: str) -> Column:
    return F.col("Event") == kind


def _delayed() -> Column:
    """Entries of a nack that had a Delay (DelayNs is per record, absent without one)."""
    return F.when(_is("nack") & (F.col("DelayNs") > 0), _size(F.col("Ids"))).otherwise(0)


def _latencies() -> Column:
    """Seconds from publish that a record carries: every entry of a version-1 `ack`
    (a version-2 one is joined to its publishes), first deliveries of a `deliver`."""
    since_publish = lambda pub: F.filter(F.transform(pub, lambda p: (F.col("Ts") - p) / NS_PER_S), lambda s: s.isNotNull())  # noqa: E731
    return F.when(_is("ack") & (F.col("V") == 1), since_publish(F.col("PubNs"))).when(_is("deliver"), since_publish(_first("PubNs")))


def records(journal: DataFrame) -> DataFrame:
    """One row per journal record: where and when, and its per-message arrays reduced
    to the figures the tables add up, plus host and date to partition by."""
    deliver = _is("deliver")
    return journal.select(
        F.col("Host").alias("host"),
        F.to_date(F.timestamp_seconds(F.col("Ts") / NS_PER_S)).cast("string").alias("date"),
        F.col("V").alias("v"),
        F.col("Event").alias("event"),
        F.col("Ts").alias("ts"),
        F.col("Topic").alias("topic"),
        F.col("Subscriber").alias("subscriber"),
        F.col("Reason").alias("reason"),
        _size(F.col("Ids")).alias("entries"),
        F.when(F.col("Ids").isNull(), 1).otherwise(F.size("Ids")).alias("events"),
        F.when(deliver, _size(F.filter(_column("Attempts"), lambda a: a == 1))).otherwise(_size(F.col("Ids"))).alias("first"),
        _size(F.filter(_column("Attempts"), lambda a: a > 1)).alias("redelivered"),
        F.when(deliver, _sum(_first("Bytes"))).when(_is("publish"), _sum(_column("Bytes"))).otherwise(0).alias("bytes"),
        _size(F.filter(_column("Replaced"), lambda r: r)).alias("replaced"),
        _size(F.filter(_column("Delivered"), lambda d: ~d)).alias("undelivered"),
        _delayed().alias("delayed"),
        F.col("Count").alias("count"),
        _latencies().alias("latencies"),
        entries_to_join().alias("ids"),
    )


def rollup(recs: DataFrame) -> DataFrame:
    """Per host, topic, subscriber, kind, reason, version and minute: every sum the tables need."""
    minute = F.date_trunc("minute", F.timestamp_seconds(F.col("ts") / NS_PER_S)).alias("minute")
    sums = ["entries", "events", "first", "redelivered", "bytes", "replaced", "undelivered", "delayed", "count"]
    return recs.groupBy("host", "topic", "subscriber", "event", "reason", "v", minute).agg(
        F.count("*").alias("records"),
        F.min("ts").alias("first_ts"),
        F.max("ts").alias("last_ts"),
        *[F.sum(c).alias(c) for c in sums],
    )


def latency_histogram(recs: DataFrame) -> DataFrame:
    """Per subscriber and kind (`ack`, `deliver`): latencies counted per bucket, with the
    largest in each, so that a percentile can be read off as a bucket's largest value."""
    seconds = F.explode("latencies").alias("s")
    carried = known(recs).where(F.col("latencies").isNotNull()).select(*PER_SUBSCRIBER, "event", seconds)
    rows = carried.unionByName(ack_latencies(known(recs)))
    bucket = F.when(F.col("s") <= FLOOR_S, F.lit(None)).otherwise(F.ceil(F.log(F.col("s")) / math.log(GAMMA)))
    return rows.groupBy(*PER_SUBSCRIBER, "event", bucket.alias("bucket")).agg(F.count("*").alias("n"), F.max("s").alias("top"))


def percentiles(histogram: DataFrame, keys: list[str]) -> DataFrame:
    """ack_p50_s ... deliver_p99_s per `keys`: the largest latency of the first bucket
    whose running count reaches the quantile's rank (as percentile_approx ranks)."""
    merged = histogram.groupBy(*keys, "event", "bucket").agg(F.sum("n").alias("n"), F.max("top").alias("top"))
    group = Window.partitionBy(*keys, "event")
    running = merged.withColumn("below", F.sum("n").over(group.orderBy(F.col("bucket").asc_nulls_first()))).withColumn(
        "total", F.sum("n").over(group)
    )
    columns = [
        F.min(F.when((F.col("event") == kind) & (F.col("below") >= q * F.col("total")), F.col("top"))).alias(f"{kind}_p{round(q * 100)}_s")
        for kind in ("ack", "deliver")
        for q in QUANTILES
    ]
    return running.groupBy(*keys).agg(*columns)


def _total(column: str, kind: str, where: Column | None = None) -> Column:
    """The sum of a rollup column over rows of one kind (and a further condition)."""
    wanted = _rolled(kind) if where is None else _rolled(kind) & where
    return F.sum(F.when(wanted, F.col(column)).otherwise(0))


def _rolled(kind: str) -> Column:
    return F.col("event") == kind


def known(rows: DataFrame) -> DataFrame:
    """Rows (of the records or the rollup) of record versions this reader understands."""
    return rows.where(F.col("v").isin(*JOURNAL_VERSIONS))


def topics(rolled: DataFrame) -> DataFrame:
    """Per host and topic: publishes, bytes, dedupe replacements, rejections."""
    return (
        known(rolled)
        .where(F.col("topic").isNotNull())
        .groupBy(*PER_TOPIC)
        .agg(
            _total("entries", "publish").alias("published"),
            _total("bytes", "publish").alias("published_bytes"),
            _total("replaced", "publish").alias("replaced"),
            _total("records", "reject").alias("rejected_requests"),
            _total("count", "reject").alias("rejected_messages"),
        )
    )


def subscribers(rolled: DataFrame, histogram: DataFrame) -> DataFrame:
    """Per host, topic and subscriber: messages, bytes, redeliveries, expiries, what the
    subscriber and operators did to its deliveries (PROTOCOL §8), latencies."""
    counts = (
        known(rolled)
        .where(F.col("subscriber").isNotNull())
        .groupBy(*PER_SUBSCRIBER)
        .agg(
            (_total("first", "deliver") - _total("entries", "return")).alias("messages"),
            _total("bytes", "deliver").alias("bytes"),
            (_total("entries", "deliver") - _total("entries", "return")).alias("delivered"),
            _total("redelivered", "deliver").alias("redelivered"),
            _total("entries", "ack").alias("acked"),
            _total("entries", "expire").alias("expired"),
            _total("undelivered", "expire").alias("expired_before_delivery"),
            _total("entries", "overflow").alias("overflowed"),
            _total("entries", "requeue", F.col("reason") == "AckRetry").alias("ack_timeouts"),
            *_delivery_control(),
        )
        .withColumns({f"{name}_rate": _per_delivered(count) for name, count in RATES.items()})
    )
    replaced = topics(rolled).select(*PER_TOPIC, "replaced")
    return counts.join(percentiles(histogram, PER_SUBSCRIBER), PER_SUBSCRIBER, "left").join(replaced, PER_TOPIC, "left")


def _delivery_control() -> list[Column]:
    """The sums of PROTOCOL §8's records: entries, except for pauses and resumes,
    which carry no message and are counted as records."""
    return [
        _total("entries", "nack").alias("nacks"),
        _total("delayed", "nack").alias("delayed_nacks"),
        _total("entries", "rejected").alias("rejected"),
        _total("entries", "touch").alias("touches"),
        _total("entries", "purge").alias("purged"),
        _total("entries", "redrive").alias("redriven"),
        _total("records", "pause").alias("pauses"),
        _total("records", "resume").alias("resumes"),
    ]


def _per_delivered(count: str) -> Column:
    """A count per delivered message; null for a subscriber that was delivered nothing,
    whose rate is unknown rather than 0."""
    return F.when(F.col("delivered") > 0, F.col(count) / F.col("delivered"))


def slowest(subs: DataFrame, n: int = SLOWEST) -> DataFrame:
    """The subscribers that keep messages longest before acking them."""
    return (
        subs.where(F.col("ack_p95_s").isNotNull())
        .orderBy(F.col("ack_p95_s").desc(), F.col("ack_p99_s").desc())
        .limit(n)
        .select(*PER_SUBSCRIBER, "ack_p50_s", "ack_p95_s", "ack_p99_s", "messages", "redelivery_rate")
    )


def throughput(rolled: DataFrame) -> DataFrame:
    """Messages and bytes per minute: published per topic, first deliveries and acks per
    subscriber. Zero-filled: a series has a row for every minute of its host's journal,
    from the host's first record to its last, 0 where the series had no record, so
    that a chart drawn from it falls to 0 rather than running straight across a
    quiet minute. Minutes outside the host's journal are left out: a journal that
    begins later (older segments deleted, or not collected) or ends sooner says
    nothing about them, and the next host's may cover them."""
    series = ["host", "topic", "subscriber", "event"]
    counts = (
        known(rolled)
        .where(F.col("event").isin("publish", "deliver", "ack"))
        .groupBy(*series, "minute")
        .agg(F.sum("first").alias("messages"), F.sum("bytes").alias("bytes"))
    )
    span = rolled.groupBy("host").agg(F.min("minute").alias("start"), F.max("minute").alias("end"))
    journal = span.select("host", F.explode(F.sequence("start", "end", F.expr("INTERVAL 1 MINUTE"))).alias("minute"))
    zero = F.lit(0).cast("long")
    zeros = counts.select(*series).distinct().join(journal, "host").select(*series, "minute", zero.alias("messages"), zero.alias("bytes"))
    sums = (F.sum(c).alias(c) for c in ("messages", "bytes"))
    return counts.unionByName(zeros).groupBy(*series, "minute").agg(*sums)


def fleet(histogram: DataFrame) -> DataFrame:
    """One row: the latency percentiles of every host's subscribers together, which the
    hosts' own percentiles do not give; null where the fleet has no such latency."""
    return percentiles(histogram, [])


def hosts(rolled: DataFrame, histogram: DataFrame) -> DataFrame:
    """Per host: what was read, the time it covers, what the journal itself lost, and
    the host's key figures (messages, redelivery rate, latencies over all its
    subscribers), so that 50 hosts compare on one row each."""
    read = rolled.groupBy("host").agg(
        F.sum("records").alias("records"),
        F.sum("events").alias("events"),
        F.timestamp_seconds(F.min("first_ts") / NS_PER_S).alias("first"),
        F.timestamp_seconds(F.max("last_ts") / NS_PER_S).alias("last"),
        _total("count", "dropped").alias("journal_dropped"),
        F.sum(F.when(F.col("v").isin(*JOURNAL_VERSIONS), 0).otherwise(F.col("records"))).alias("unknown_version_records"),
    )
    figures = (
        known(rolled)
        .groupBy("host")
        .agg(
            _total("entries", "publish").alias("published"),
            (_total("entries", "deliver") - _total("entries", "return")).alias("delivered"),
            _total("redelivered", "deliver").alias("redelivered"),
            _total("entries", "ack").alias("acked"),
        )
        .withColumn("redelivery_rate", _per_delivered("redelivered"))
    )
    return read.join(figures, "host", "left").join(percentiles(histogram, ["host"]), "host", "left")
