"""The `ppmq` Spark data source (pyspark.sql.datasource).

    spark.dataSource.register(PpmqDataSource)
    spark.read.format("ppmq").load("/var/lib/ppmq")                  # a store's messages
    df.write.format("ppmq").option("config", "/etc/ppmq/ppmq.yaml") \\
        .option("topic", "filescan").mode("append").save()           # publish rows

Reading takes one consistent snapshot, also while the broker runs (readers
never block its writer), and reads it in parallel partitions: each topic's
messages split by message id into ranges of about `rowsPerPartition` (option,
default 100,000) rows. One LMDB transaction cannot span the worker processes
the partitions run in, so the snapshot is a copy of the store made by one read
transaction, under the `snapshotDir` option (default: the temporary directory),
and kept until the Spark driver exits: snapshot.py says why and how. Writing (with mode("append"): Spark offers Python data sources only
append and overwrite, and a topic cannot be overwritten) publishes each
partition's rows through the broker's socket in confirmed batches; a batch the broker rejects fails the job with the
broker's error. Publishing is not transactional: batches confirmed before a
failure stay published, so a job that may be retried should use a dedupe
topic with stable keys.

Spark pickles these classes by reference and runs them in worker processes,
which must import ppmq (PYSPARK_PYTHON pointing at its interpreter); they hold
options, never open handles.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceWriter, InputPartition, WriterCommitMessage
from pyspark.sql.types import StructType

from ppmq.client.library import Client
from ppmq.config import load_config
from ppmq.errors import ClientError, PublishError, StoreError
from ppmq.pipeline import snapshot
from ppmq.protocol.messages import fragment_payload
from ppmq.store.counters import HEAD_KEY, load_state
from ppmq.store.reader import BodyRecord, Damaged, ReadTxn, StoreReader

SNAPSHOT_SCHEMA = (
    "topic string, key string, priority int, payload string, payload_json string, "
    "publish_time timestamp, expires timestamp, "
    "subscribers array<struct<subscriber: string, state: string, attempts: int>>"
)
MESSAGE_FIELDS = ("Key", "Payload", "Priority", "Expires", "TTL")  # PROTOCOL §2 Message
DEFAULT_BATCH = 500  # rows per confirmed publish
DEFAULT_PARTITION_ROWS = 100_000  # rows per partition of a read: a few seconds of a worker's time


class PpmqDataSource(DataSource):
    """`format("ppmq")`: read a store's snapshot, or publish rows to a topic."""

    @classmethod
    def name(cls) -> str:
        return "ppmq"

    def schema(self) -> str:
        return SNAPSHOT_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        path = self.options.get("path")
        if not path:
            raise ValueError("ppmq: load(DATA_PATH) needs the store's DataPath")
        rows = int(self.options.get("rowsPerPartition", DEFAULT_PARTITION_ROWS))
        if rows < 1:
            raise ValueError(f"ppmq: rowsPerPartition must be at least 1, not {rows}")
        return SnapshotReader(path, self.options.get("snapshotDir"), rows)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ValueError("ppmq: a topic cannot be overwritten, only published to: use mode('append')")
        return PublishWriter(self.options, schema)


# --- reading --------------------------------------------------------------------------


@dataclass
class IdRange(InputPartition):
    """Messages lo..hi-1 of topic t in the snapshot copy made at transaction txn_id."""

    directory: str
    txn_id: int
    t: int
    lo: int
    hi: int


class SnapshotReader(DataSourceReader):
    def __init__(self, path: str, snapshot_dir: str | None, partition_rows: int) -> None:
        self.path = path
        self.snapshot_dir = snapshot_dir
        self.partition_rows = partition_rows

    def partitions(self) -> list[InputPartition]:
        """Copy the store (on the driver), then split each topic of the copy into id ranges."""
        store = StoreReader(self.path)
        try:
            with store.snapshot() as txn:
                if txn.get_meta(HEAD_KEY) is None:
                    return []  # a store no broker has committed to yet: no messages
            directory = snapshot.copy(store, self.snapshot_dir)
        finally:
            store.close()
        reader = StoreReader(directory)
        try:
            with reader.snapshot() as txn:
                state = load_state(txn)
                return [
                    IdRange(directory, txn.id, t, lo, hi)
                    for name, t in sorted(state.topic_ids.items(), key=lambda item: item[1])
                    for lo, hi in _ranges(txn.message_ids(t), state.topics[name].stored, self.partition_rows)
                ]  # fmt: skip
        finally:
            reader.close()

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        if not isinstance(partition, IdRange):
            return  # Spark's one empty partition when partitions() found none
        if not os.path.isdir(partition.directory):
            raise snapshot.missing(partition.directory)
        reader = StoreReader(partition.directory)
        try:
            with reader.snapshot() as txn:
                snapshot.check(partition.directory, partition.txn_id, txn.id)
                state = load_state(txn)
                topic = {i: name for name, i in state.topic_ids.items()}[partition.t]
                subs = {i: name for name, i in state.sub_ids.items()}
                for record in _messages(txn, partition):
                    yield _row(txn, topic, record, subs)
        finally:
            reader.close()


def _ranges(ids: tuple[int, int] | None, stored: int, partition_rows: int) -> list[tuple[int, int]]:
    """[lo, hi) id ranges covering first..last in parts of about partition_rows
    messages, taking the topic's `stored` messages as spread evenly over its ids."""
    if ids is None:
        return []
    first, last = ids
    parts = max(1, -(-stored // partition_rows))
    width = -(-(last + 1 - first) // parts)
    return [(lo, min(lo + width, last + 1)) for lo in range(first, last + 1, width)]


def _messages(txn: ReadTxn, part: IdRange) -> Iterator[BodyRecord]:
    """The stored messages of one id range of one topic, by message id; none of a
    publish being staged. A row that does not decode fails the read: a snapshot
    silently short of messages would pass for a true one (`ppmq fsck` lists them all)."""
    staged = txn.staged()
    for record in txn.messages(part.t, part.lo, part.hi):
        if isinstance(record, Damaged):
            raise StoreError(f"ppmq: the store has a damaged message ({record.db} entry {record.key.hex()}: {record.reason})")
        if not (staged is not None and staged.hides(record.t, record.m)):
            yield record


def _row(txn: ReadTxn, topic: str, record: BodyRecord, subs: dict[int, str]) -> tuple:
    t, m, body, _ = record
    payload_json = fragment_payload(body.fragment).decode()
    payload = msgspec.json.decode(payload_json) if payload_json.startswith('"') else payload_json
    holders = []
    for s, (prio, pos) in sorted(txn.get_holders(t, m).items()):
        flight = txn.get_inflight(t, s, m)
        if flight is not None:
            holders.append((subs.get(s), "inflight", flight.attempts))
        else:
            holders.append((subs.get(s), "ready", txn.ready_attempts(t, s, prio, pos) or 0))
    expires = _time(body.expires_ns) if body.expires_ns else None
    return (topic, body.key.decode(), body.priority, payload, payload_json, _time(body.publish_ns), expires, holders)


def _time(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, UTC)


# --- writing --------------------------------------------------------------------------


@dataclass
class Published(WriterCommitMessage):
    rows: int


class PublishWriter(DataSourceWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        config, topic = options.get("config"), options.get("topic")
        if not config or not topic:
            raise ValueError("ppmq: writing needs .option('config', FILE) and .option('topic', TOPIC)")
        self.config, self.topic = config, topic
        self.batch = int(options.get("batch", DEFAULT_BATCH))
        self.fields = _message_fields(schema)

    def write(self, rows: Iterator[Any]) -> Published:
        """Publish this partition's rows in confirmed batches (runs in a worker)."""
        done = 0
        with Client(load_config(self.config).server_socket) as client:
            batch: list[dict[str, Any]] = []
            for row in rows:
                batch.append(self._message(row))
                if len(batch) >= self.batch:
                    done += self._publish(client, batch, done)
                    batch = []
            if batch:
                done += self._publish(client, batch, done)
        return Published(done)

    def _message(self, row: Any) -> dict[str, Any]:
        message = {}
        for column, field in self.fields.items():
            value = row[column]
            if value is not None:
                message[field] = _wire(value)
        return message

    def _publish(self, client: Client, batch: list[dict[str, Any]], before: int) -> int:
        try:
            client.publish(self.topic, batch)
        except ClientError as exc:
            raise PublishError(f"ppmq: topic {self.topic!r}: rows {before}..{before + len(batch) - 1} of this partition: {exc}") from None
        return len(batch)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every batch was confirmed as it went: nothing is left to make durable."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Confirmed batches cannot be taken back (see the module's docstring)."""


def _message_fields(schema: StructType) -> dict[str, str]:
    """DataFrame column -> Message field, matched case-insensitively (PROTOCOL §1)."""
    known = {f.lower(): f for f in MESSAGE_FIELDS}
    fields = {}
    for name in schema.fieldNames():
        if name.lower() not in known:
            raise ValueError(f"ppmq: column {name!r} is not a Message field (expected {', '.join(MESSAGE_FIELDS)})")
        fields[name] = known[name.lower()]
    if "Payload" not in fields.values():
        raise ValueError("ppmq: a Payload column is required")
    return fields


def _wire(value: Any) -> Any:
    """A Spark value as JSON: rows and maps as objects, times as RFC 3339 in UTC."""
    if isinstance(value, datetime):
        return value.astimezone(UTC)  # PySpark hands out naive local times
    if hasattr(value, "asDict"):
        return {k: _wire(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {k: _wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_wire(v) for v in value]
    return value
