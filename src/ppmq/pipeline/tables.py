"""Journal records -> the report's tables; docs/journal.md defines every field used.

A record is one batch with per-message arrays, so counts are sums of array
sizes and per-message figures come from Spark's higher-order functions
(`filter`, `zip_with`) on the record itself; only latencies are exploded, one
row per message, for `percentile_approx`.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from .schema import JOURNAL_SCHEMA, JOURNAL_VERSION

NS_PER_S = 1e9
QUANTILES = [0.5, 0.95, 0.99]
ACCURACY = 10_000  # percentile_approx: relative rank error 1/ACCURACY
SLOWEST = 10  # rows of the slowest-subscribers table
PER_SUBSCRIBER = ["host", "topic", "subscriber"]
PER_TOPIC = ["host", "topic"]


def read_journal(spark: SparkSession, paths: Iterable[str]) -> DataFrame:
    """Every record under `paths` (files, or directories searched recursively; any
    URI Spark reads). Gzipped segments are read by their suffix; a line that does
    not parse, such as the cut-off last line of a segment being written, is skipped."""
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


def _count(kind: str, array: Column | None = None) -> Column:
    """Messages in records of one kind: the sum of an array's sizes (Ids by default)."""
    return F.sum(F.when(F.col("Event") == kind, _size(F.col("Ids") if array is None else array)).otherwise(0))


def _first(array: str) -> Column:
    """Entries of `array` for first deliveries (Attempts 1), others null."""
    return F.zip_with("Attempts", array, lambda a, x: F.when(a == 1, x))


def _latencies(records: DataFrame) -> DataFrame:
    """Publish-to-ack and publish-to-first-delivery percentiles per subscriber, in one pass:
    one row per message of `ack` and `deliver` records, the other kind's column null
    (percentile_approx skips nulls)."""
    since_publish = lambda pub: F.transform(pub, lambda p: (F.col("Ts") - p) / NS_PER_S)  # noqa: E731
    seconds = F.explode(F.when(F.col("Event") == "ack", since_publish(F.col("PubNs"))).otherwise(since_publish(_first("PubNs"))))
    rows = records.where(F.col("Event").isin("ack", "deliver")).select(
        *[F.col(c.capitalize()).alias(c) for c in PER_SUBSCRIBER], F.col("Event"), seconds.alias("s")
    )
    columns = []
    for kind in ("ack", "deliver"):
        p = F.percentile_approx(F.when(F.col("Event") == kind, F.col("s")), QUANTILES, ACCURACY)
        columns += [p[i].alias(f"{kind}_p{round(q * 100)}_s") for i, q in enumerate(QUANTILES)]
    return rows.groupBy(*PER_SUBSCRIBER).agg(*columns)


def topics(records: DataFrame) -> DataFrame:
    """Per host and topic: publishes, bytes, dedupe replacements, rejections."""
    return (
        records.where(F.col("Topic").isNotNull())
        .groupBy(F.col("Host").alias("host"), F.col("Topic").alias("topic"))
        .agg(
            _count("publish").alias("published"),
            F.sum(F.when(F.col("Event") == "publish", _sum(F.col("Bytes"))).otherwise(0)).alias("published_bytes"),
            _count("publish", F.filter("Replaced", lambda r: r)).alias("replaced"),
            F.sum(F.when(F.col("Event") == "reject", 1).otherwise(0)).alias("rejected_requests"),
            F.sum(F.when(F.col("Event") == "reject", F.col("Count")).otherwise(0)).alias("rejected_messages"),
        )
    )


def subscribers(records: DataFrame) -> DataFrame:
    """Per host, topic and subscriber: messages, bytes, redeliveries, expiries, latencies."""
    first_bytes = _sum(_first("Bytes"))
    counts = (
        records.where(F.col("Subscriber").isNotNull())
        .groupBy(*[F.col(c.capitalize()).alias(c) for c in PER_SUBSCRIBER])
        .agg(
            (_count("deliver", F.filter("Attempts", lambda a: a == 1)) - _count("return")).alias("messages"),
            F.sum(F.when(F.col("Event") == "deliver", first_bytes).otherwise(0)).alias("bytes"),
            (_count("deliver") - _count("return")).alias("delivered"),
            _count("deliver", F.filter("Attempts", lambda a: a > 1)).alias("redelivered"),
            _count("ack").alias("acked"),
            _count("expire").alias("expired"),
            _count("expire", F.filter("Delivered", lambda d: ~d)).alias("expired_before_delivery"),
            _count("overflow").alias("overflowed"),
            F.sum(F.when((F.col("Event") == "requeue") & (F.col("Reason") == "AckRetry"), _size(F.col("Ids"))).otherwise(0)).alias("ack_timeouts"),
        )
        .withColumn("redelivery_rate", F.when(F.col("delivered") > 0, F.col("redelivered") / F.col("delivered")))
    )
    replaced = topics(records).select(*PER_TOPIC, "replaced")
    return counts.join(_latencies(records), PER_SUBSCRIBER, "left").join(replaced, PER_TOPIC, "left")


def slowest(subs: DataFrame, n: int = SLOWEST) -> DataFrame:
    """The subscribers that keep messages longest before acking them."""
    return (
        subs.where(F.col("ack_p95_s").isNotNull())
        .orderBy(F.col("ack_p95_s").desc(), F.col("ack_p99_s").desc())
        .limit(n)
        .select(*PER_SUBSCRIBER, "ack_p50_s", "ack_p95_s", "ack_p99_s", "messages", "redelivery_rate")
    )


def throughput(records: DataFrame) -> DataFrame:
    """Messages and bytes per minute: published per topic, first deliveries and acks per subscriber."""
    minute = F.date_trunc("minute", F.timestamp_seconds(F.col("Ts") / NS_PER_S)).alias("minute")
    wanted = records.where(F.col("Event").isin("publish", "deliver", "ack"))
    deliver = F.col("Event") == "deliver"
    messages = F.when(deliver, _size(F.filter("Attempts", lambda a: a == 1))).otherwise(_size(F.col("Ids")))
    size = F.when(deliver, _sum(_first("Bytes"))).when(F.col("Event") == "publish", _sum(F.col("Bytes"))).otherwise(0)
    return wanted.groupBy(
        F.col("Host").alias("host"), F.col("Topic").alias("topic"), F.col("Subscriber").alias("subscriber"), F.col("Event").alias("event"), minute
    ).agg(F.sum(messages).alias("messages"), F.sum(size).alias("bytes"))


def hosts(records: DataFrame) -> DataFrame:
    """Per host: what was read, the time it covers, and what the journal itself lost."""
    return records.groupBy(F.col("Host").alias("host")).agg(
        F.count("*").alias("records"),
        F.sum(F.when(F.col("Ids").isNull(), 1).otherwise(F.size("Ids"))).alias("events"),
        F.timestamp_seconds(F.min("Ts") / NS_PER_S).alias("first"),
        F.timestamp_seconds(F.max("Ts") / NS_PER_S).alias("last"),
        F.sum(F.when(F.col("Event") == "dropped", F.col("Count")).otherwise(0)).alias("journal_dropped"),
        F.sum(F.when(F.col("V") != JOURNAL_VERSION, 1).otherwise(0)).alias("unknown_version_records"),
    )


def known(records: DataFrame) -> DataFrame:
    """Records of the version this reader understands."""
    return records.where(F.col("V") == JOURNAL_VERSION)
