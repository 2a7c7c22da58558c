"""The `ppmq` Spark data source (pyspark.sql.datasource).

    spark.dataSource.register(PpmqDataSource)
    spark.read.format("ppmq").load("/var/lib/ppmq")                  # a store's messages
    df.write.format("ppmq").option("config", "/etc/ppmq/ppmq.yaml") \\
        .option("topic", "filescan").mode("append").save()           # publish rows

Reading opens the store read-only and takes one LMDB read transaction: one
consistent snapshot, also while the broker runs (readers never block its
writer). It is read in one partition, because one transaction cannot span
processes. Writing (with mode("append"): Spark offers Python data sources only
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

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import msgspec
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from ..client import Client, ClientError
from ..config import load_config
from ..protocol import fragment_payload
from ..state import restore
from ..reader import BodyRecord, Damaged, ReadTxn, StoreReader
from ..schema import StoreError

SNAPSHOT_SCHEMA = (
    "topic string, key string, priority int, payload string, payload_json string, "
    "publish_time timestamp, expires timestamp, "
    "subscribers array<struct<subscriber: string, state: string, attempts: int>>"
)
MESSAGE_FIELDS = ("Key", "Payload", "Priority", "Expires", "TTL")  # PROTOCOL §2 Message
DEFAULT_BATCH = 500  # rows per confirmed publish


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
        return SnapshotReader(path)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ValueError("ppmq: a topic cannot be overwritten, only published to: use mode('append')")
        return PublishWriter(self.options, schema)


# --- reading --------------------------------------------------------------------------


class SnapshotReader(DataSourceReader):
    def __init__(self, path: str) -> None:
        self.path = path

    def read(self, partition: Any) -> Iterator[tuple]:
        reader = StoreReader(self.path)
        try:
            with reader.snapshot() as txn:
                raw = txn.get_meta(b"state")
                if raw is None:
                    return
                state = restore(raw)
                topics = {i: name for name, i in state.topic_ids.items()}
                subs = {i: name for name, i in state.sub_ids.items()}
                for record in _messages(txn, topics):
                    yield _row(txn, topics[record.t], record, subs)
        finally:
            reader.close()


def _messages(txn: ReadTxn, topics: dict[int, str]) -> Iterator[BodyRecord]:
    """The stored messages of known topics, by topic id then message id; none of a
    publish being staged. A row that does not decode fails the read: a snapshot
    silently short of messages would pass for a true one (`ppmq fsck` lists them all)."""
    staged = txn.staged()
    for record in txn.records("bodies"):
        if isinstance(record, Damaged):
            raise StoreError(f"ppmq: the store has a damaged message ({record.db} entry {record.key.hex()}: {record.reason})")
        if record.t in topics and not (staged is not None and staged.hides(record.t, record.m)):
            yield record


def _row(txn: ReadTxn, topic: str, record: BodyRecord, subs: dict[int, str]) -> tuple:
    t, m, body = record
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
    return datetime.fromtimestamp(ns / 1e9, timezone.utc)


# --- writing --------------------------------------------------------------------------


@dataclass
class Published(WriterCommitMessage):
    rows: int


class PublishError(Exception):
    """The broker refused a batch; the message is the broker's."""


class PublishWriter(DataSourceWriter):
    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.config = options.get("config")
        self.topic = options.get("topic")
        if not self.config or not self.topic:
            raise ValueError("ppmq: writing needs .option('config', FILE) and .option('topic', TOPIC)")
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

    def commit(self, messages: list[Published | None]) -> None:
        """Every batch was confirmed as it went: nothing is left to make durable."""

    def abort(self, messages: list[Published | None]) -> None:
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
        return value.astimezone(timezone.utc)  # PySpark hands out naive local times
    if hasattr(value, "asDict"):
        return {k: _wire(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {k: _wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_wire(v) for v in value]
    return value
