"""StoreReader's records: the one decoding of a store, for fsck and the Spark data source."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from ppmq.config import Config, SubscriberConfig, TopicConfig
from ppmq.core.broker import Broker
from ppmq.protocol import messages as p
from ppmq.store.reader import (
    BodyRecord,
    Damaged,
    DeadlineRecord,
    DedupeRecord,
    FlightRecord,
    HoldersRecord,
    ReadyRecord,
    StoreReader,
)
from ppmq.store.schema import Flight, body_columns, encode_body_row
from ppmq.store.state import NS
from ppmq.store.store import Store

NOW = 1_800_000_000 * NS
ACK_RETRY_S = 60


@pytest.fixture
def stored(tmp_path: Path) -> tuple[str, dict[str, int]]:
    """One message of dedupe topic `t`, in flight to `a` (with an AckRetry deadline) and ready for `b`."""
    config = Config(
        server_socket=str(tmp_path / "ppmq.sock"),
        data_path=str(tmp_path / "data"),
        sync=False,
        subscribers=[SubscriberConfig(name=n, socket=str(tmp_path / f"{n}.sock")) for n in ("a", "b")],
        topics=[TopicConfig(name="t", subscribers=["a", "b"], dedupe=True, ack_retry=ACK_RETRY_S)],
    )
    store = Store(config.data_path, sync=False, max_bytes=1 << 24)
    broker = Broker(config, store, NOW)
    message = p.Message(key="k", payload=msgspec.Raw(b'{"n":1}'))
    broker.step([p.Request(topic="t", messages=[message], id=msgspec.Raw(b"1"))], set(), NOW)
    broker.step([], {"a"}, NOW)
    store.close()
    return config.data_path, {**broker.state.topic_ids, **broker.state.sub_ids}


def read(data_path: str, db: str) -> list:
    reader = StoreReader(data_path)
    try:
        with reader.snapshot() as txn:
            return list(txn.records(db))
    finally:
        reader.close()


def test_the_records_of_a_message_ready_for_one_subscriber_and_in_flight_for_another(stored):
    data_path, ids = stored
    t, a, b, m = ids["t"], ids["a"], ids["b"], 1
    deadline_ns = NOW + ACK_RETRY_S * NS
    [body] = read(data_path, "bodies")
    assert isinstance(body, BodyRecord) and (body.t, body.m, body.body.key) == (t, m, b"k")
    assert p.fragment_payload(body.body.fragment) == b'{"n":1}'
    assert read(data_path, "holders") == [HoldersRecord(t, m, {a: (0, m), b: (0, m)}, row=m)]
    assert read(data_path, "ready") == [ReadyRecord(t, b, 0, m, m, 0, m)]  # a run of one, keyed by its place
    batch = 1  # the subscription's first batch in flight
    assert read(data_path, "inflight") == [FlightRecord(t, a, batch, deadline_ns, [Flight(m, 0, m, 1, NOW)])]
    assert read(data_path, "deadlines") == [DeadlineRecord(deadline_ns, t, a, batch)]
    assert read(data_path, "dedupe") == [DedupeRecord(t, b"k", m)]
    assert read(data_path, "expiry") == []


def test_a_row_that_does_not_decode_comes_back_as_damaged_among_the_others(stored):
    data_path, _ = stored
    # Given the in-flight row cut short and a body whose key runs past its end
    store = Store(data_path, sync=False, max_bytes=1 << 24)
    with store.write() as txn:
        ((flight_key, flight),) = txn.txn.cursor(db=store.dbs["inflight"])
        txn.txn.put(flight_key, flight[:5], db=store.dbs["inflight"])
        ((body_key, row),) = txn.txn.cursor(db=store.dbs["bodies"])
        _, ends, base = body_columns(row)
        record = row[base : base + ends[0]][:17] + b"\xff\xff"  # key length 65535
        txn.txn.put(body_key[:4] + (2).to_bytes(8, "big"), encode_body_row([2], [record]), db=store.dbs["bodies"])
    store.close()
    # When the reader walks them, then each damaged row is a Damaged record, the sound body still a BodyRecord
    [damaged] = read(data_path, "inflight")
    assert isinstance(damaged, Damaged) and (damaged.db, damaged.key) == ("inflight", flight_key)
    sound, cut = read(data_path, "bodies")
    assert isinstance(sound, BodyRecord)
    assert cut.db == "bodies" and "runs past the end" in cut.reason
