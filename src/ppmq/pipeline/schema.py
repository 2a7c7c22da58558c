"""The journal's record layout as Spark reads it (docs/journal.md), declared, not inferred:
inference would read every file twice and guess types from whatever it saw first."""

from __future__ import annotations

from pyspark.sql.types import ArrayType, BooleanType, IntegerType, LongType, StringType, StructField, StructType

JOURNAL_VERSIONS = (1, 2)  # the record versions this reader understands
NS_PER_S = 1e9  # Ts and the other times of a record are ns since the Unix epoch


def _longs() -> ArrayType:
    return ArrayType(LongType())


JOURNAL_SCHEMA = StructType(
    [
        StructField("V", IntegerType()),
        StructField("Host", StringType()),
        StructField("Event", StringType()),
        StructField("Ts", LongType()),
        StructField("Topic", StringType()),
        StructField("Subscriber", StringType()),
        StructField("Reason", StringType()),
        StructField("Ids", _longs()),
        StructField("PubNs", _longs()),
        StructField("Attempts", ArrayType(IntegerType())),
        StructField("Bytes", _longs()),
        StructField("Prio", ArrayType(IntegerType())),
        StructField("ExpiresNs", _longs()),
        StructField("Replaced", ArrayType(BooleanType())),
        StructField("Delivered", ArrayType(BooleanType())),
        StructField("DelayNs", LongType()),
        StructField("Status", IntegerType()),
        StructField("Error", StringType()),
        StructField("Count", LongType()),
    ]
)
