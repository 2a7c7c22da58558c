"""Publish-to-ack latencies of version-2 `ack` records, which carry ids only: each
acked id is joined to its publish (docs/journal.md, "Versions").

The version acked is the last publish of the id on its host and topic strictly
before the ack. A message is delivered in its publish's step at the earliest and
acked in a later one, so its publish is before its ack; a Dedupe replacement
keeps the id, and one in the ack's own step came after the ack (the ack found
the old version in flight), so it is not the version acked. Ids are never
reused otherwise, so most ids have one publish.

This is an as-of join, done as one sorted pass rather than a join: publish and
ack entries of an id meet in one window, in time order, acks before publishes
of the same instant, and each ack takes the last publish time seen. A join on
the id would pair every ack of a key with every version of it, which for a key
replaced all day is quadratic; the window keeps one id's entries at a time and
Spark's sort spills to disk, so the heap stays fixed whatever the journal size.
An ack whose publish is not in the journals read (an older segment deleted to
stay under MaxBytes, or not given to the report) has no latency; it is still
counted as acked.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from ppmq.pipeline.schema import NS_PER_S

PUBLISH, ACK = "publish", "ack"


def entries_to_join() -> Column:
    """The ids a record gives the join, null for others: every publish (of any
    version: an ack may come after an upgrade) and version-2 acks."""
    wanted = (F.col("Event") == PUBLISH) | ((F.col("Event") == ACK) & (F.col("V") >= 2))
    return F.when(wanted, F.col("Ids"))


def ack_latencies(recs: DataFrame) -> DataFrame:
    """host, topic, subscriber, event ("ack") and s, the seconds from each acked
    id's publish, for the records' `ids` (entries_to_join)."""
    entries = recs.where(F.col("ids").isNotNull()).select("host", "topic", "subscriber", "event", "ts", F.explode("ids").alias("id"))
    in_time = (
        Window.partitionBy("host", "topic", "id")
        .orderBy("ts", F.col("event") == PUBLISH)  # false first: an ack before a publish of its instant
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    published = F.last(F.when(F.col("event") == PUBLISH, F.col("ts")), ignorenulls=True).over(in_time)
    seconds = ((F.col("ts") - published) / NS_PER_S).alias("s")
    acks = entries.select("host", "topic", "subscriber", "event", seconds).where(F.col("event") == ACK)
    return acks.where(F.col("s").isNotNull())
