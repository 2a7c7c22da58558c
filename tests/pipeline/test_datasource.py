"""The `ppmq` data source against a real broker: snapshots of its store while it runs,
and DataFrames published through its socket."""

from __future__ import annotations

import time

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from ppmq.store.store import Store

from ..conftest import wait_for


def snapshot(spark: SparkSession, data_path: str) -> dict[tuple[str, str], dict]:
    df = spark.read.format("ppmq").load(data_path)
    df = df.withColumn("publish_s", F.col("publish_time").cast("double")).withColumn("expires_s", F.col("expires").cast("double"))
    return {(r["topic"], r["key"]): r.asDict(recursive=True) for r in df.collect()}


def test_a_snapshot_of_a_running_brokers_store(spark, broker_factory) -> None:
    """Given messages ready for one subscriber and in flight or acked for another,
    when the store is read while the broker runs, then every unfinished message
    is there with its state per subscriber; a later read sees later publishes."""
    b = broker_factory(
        [
            {"Name": "q", "Priorities": 2, "Subscribers": ["r", "idle"]},
            {"Name": "d", "Dedupe": True, "Expire": True, "Subscribers": ["idle"]},
        ],
        ["r", "idle"],
    )
    r = broker_factory.subscriber(b, "r", ack=None)
    before = time.time()
    with b.client() as c:
        c.publish("q", [{"Payload": f"p{i}", "Priority": i % 2} for i in range(5)])
        c.publish("d", [{"Key": "k1", "Payload": {"a": [1, 2]}, "Expires": "2099-01-01T00:00:00Z"}])
        keys = [m["Key"] for m in r.wait_messages(5)]
        c.ack("q", "r", keys[:1])
    after = time.time()
    rows = snapshot(spark, b.config["DataPath"])
    assert set(rows) == {("q", k) for k in keys} | {("d", "k1")}
    by_payload = {row["payload"]: row for row in rows.values()}
    for i in range(5):
        row = by_payload[f"p{i}"]
        assert (row["priority"], row["payload_json"], row["expires"]) == (i % 2, f'"p{i}"', None)
        assert before - 1 <= row["publish_s"] <= after + 1
    first = rows[("q", keys[0])]
    assert first["subscribers"] == [{"subscriber": "idle", "state": "ready", "attempts": 0}], "acked by r, only idle holds it"
    for key in keys[1:]:
        assert rows[("q", key)]["subscribers"] == [
            {"subscriber": "r", "state": "inflight", "attempts": 1},
            {"subscriber": "idle", "state": "ready", "attempts": 0},
        ]
    cached = rows[("d", "k1")]
    assert cached["payload"] == cached["payload_json"] == '{"a":[1,2]}'
    assert cached["expires_s"] == 4070908800.0
    assert b.alive()
    with b.client() as c:
        c.publish("q", [{"Payload": "later"}])
    assert len(snapshot(spark, b.config["DataPath"])) == 7


def rows_of(df) -> list[tuple]:
    """Every row as a comparable tuple, sorted: the order of partitions is not the rows'."""
    return sorted((*r[:-1], tuple(tuple(h) for h in r[-1])) for r in df.collect())


def test_several_partitions_read_exactly_the_rows_of_one_per_topic(spark, broker_factory, tmp_path) -> None:
    """Given two topics with messages ready, in flight and acked (holes in the ids),
    when the store is read in ranges of 3 rows, then the rows are those of a read
    in one partition per topic, no row twice and none missing."""
    b = broker_factory([{"Name": "q", "Priorities": 2, "Subscribers": ["r", "idle"]}, {"Name": "p", "Subscribers": ["r"]}], ["r", "idle"])
    r = broker_factory.subscriber(b, "r", ack=None)
    with b.client() as c:
        for topic in ("q", "p"):
            c.publish(topic, [{"Payload": f"{topic}{i}", "Priority": i % 2 if topic == "q" else 0} for i in range(17)])
        got = r.wait_messages(34)
        for topic in ("q", "p"):
            c.ack(topic, "r", [m["Key"] for m in got if m["Topic"] == topic][::3])  # p's are deleted: 6 holes
    b.stop()
    whole = spark.read.format("ppmq").option("snapshotDir", str(tmp_path)).load(b.config["DataPath"])
    split = spark.read.format("ppmq").option("snapshotDir", str(tmp_path)).option("rowsPerPartition", 3).load(b.config["DataPath"])
    assert (whole.rdd.getNumPartitions(), split.rdd.getNumPartitions()) == (2, 6 + 4)
    expected = rows_of(whole)
    assert len(expected) == 17 + 11 and rows_of(split) == expected


def test_a_read_is_one_snapshot_for_every_action_on_it(spark, broker_factory, tmp_path) -> None:
    """Given a DataFrame read from a running broker's store, when more messages are
    published, then the DataFrame still shows the snapshot it was planned on, in
    every partition, and a new read shows the new messages."""
    b = broker_factory([{"Name": "q", "Subscribers": ["idle"]}], ["idle"])
    with b.client() as c:
        c.publish("q", [{"Payload": i} for i in range(10)])
    df = spark.read.format("ppmq").option("snapshotDir", str(tmp_path)).option("rowsPerPartition", 4).load(b.config["DataPath"])
    assert df.count() == 10
    with b.client() as c:
        c.publish("q", [{"Payload": i} for i in range(10, 15)])
    assert sorted(r["payload"] for r in df.collect()) == [str(i) for i in range(10)]
    assert spark.read.format("ppmq").load(b.config["DataPath"]).count() == 15


def test_a_missing_store_is_named(spark, tmp_path) -> None:
    with pytest.raises(Exception, match="no ppmq store at"):
        spark.read.format("ppmq").load(str(tmp_path)).collect()


def test_a_damaged_message_fails_the_read_and_is_named(spark, broker_factory) -> None:
    """A snapshot short of a message would pass for a whole one: the read fails instead."""
    b = broker_factory([{"Name": "q", "Subscribers": ["idle"]}], ["idle"])
    with b.client() as c:
        c.publish("q", [{"Payload": "p"}])
    b.stop()
    store = Store(b.config["DataPath"], sync=False, max_bytes=1 << 24)
    with store.write() as txn:
        ((key, body),) = txn.txn.cursor(db=store.dbs["bodies"])
        txn.txn.put(key, body[:5], db=store.dbs["bodies"])
    store.close()
    with pytest.raises(Exception, match=f"damaged message \\(bodies entry {key.hex()}"):
        spark.read.format("ppmq").load(b.config["DataPath"]).collect()


def test_rows_are_published_through_the_broker(spark, broker_factory) -> None:
    """Given a DataFrame of Key, Payload, Priority and TTL, when it is saved to a
    topic, then a subscriber receives every row as a message, by priority."""
    b = broker_factory([{"Name": "in", "Priorities": 3, "Dedupe": True, "Subscribers": ["s"]}], ["s"])
    rows = [(f"k{i}", f"row {i}", i % 3, 600.0) for i in range(40)]
    df = spark.createDataFrame(rows, "key string, Payload string, PRIORITY int, ttl double").repartition(2)
    df.write.format("ppmq").option("config", str(b.config_path)).option("topic", "in").option("batch", "7").mode("append").save()
    assert b.status()["Topics"]["in"]["Published"] == 40
    sub = broker_factory.subscriber(b, "s")
    got = sub.wait_messages(40)
    assert sorted((m["Key"], m["Payload"], m["Priority"]) for m in got) == sorted(r[:3] for r in rows)
    assert all("Expires" in m for m in got)
    wait_for(lambda: b.sub_status("in", "s")["Acked"] == 40, what="acks")


def test_a_batch_the_broker_rejects_fails_the_job_with_its_error(spark, broker_factory) -> None:
    b = broker_factory([{"Name": "in", "Subscribers": ["s"]}], ["s"])
    df = spark.createDataFrame([("ok", 0), ("too low", 4)], "Payload string, Priority int").coalesce(1)
    with pytest.raises(Exception, match=r"Messages\[1\]\.Priority: 4 is out of range 0\.\.0 for topic 'in'"):
        df.write.format("ppmq").option("config", str(b.config_path)).option("topic", "in").mode("append").save()
    assert b.status()["Topics"]["in"]["Published"] == 0, "the rejected batch was applied whole or not at all"


def test_a_column_that_is_not_a_message_field_is_named(spark, broker_factory) -> None:
    b = broker_factory([{"Name": "in"}], [])
    df = spark.createDataFrame([("x", "y")], "Payload string, colour string")
    with pytest.raises(Exception, match="column 'colour' is not a Message field"):
        df.write.format("ppmq").option("config", str(b.config_path)).option("topic", "in").mode("append").save()
