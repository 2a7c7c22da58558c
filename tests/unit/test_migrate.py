"""A store an older ppmq wrote is converted when it is opened (migrate.py), with
nothing lost: tested on stores that ppmq itself wrote with schemas 1 and 2
(tests/data/make_old_store.py says how they were made)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import lmdb
import pytest

from ppmq import cli
from ppmq import protocol as p
from ppmq.broker import Broker
from ppmq.fsck import check, read_snapshot
from ppmq.reader import StoreReader
from ppmq.schema import SCHEMA_VERSION, StoreError
from ppmq.store import Store
from tests.data.make_old_store import NOW, fixture_config

DATA = Path(__file__).parent.parent / "data"
PUBLISHED_NS = NOW  # every message of the fixtures was published in their first step


@pytest.fixture(params=[1, 2], ids=["schema1", "schema2"])
def old_store(request, tmp_path) -> str:
    """A store an older ppmq wrote (the same operations for each schema)."""
    with tarfile.open(DATA / f"schema{request.param}-store.tar.gz") as tar:
        tar.extractall(tmp_path / "data", filter="data")
    return str(tmp_path / "data")


def open_store(path: str) -> Store:
    return Store(path, sync=False, max_bytes=1 << 26)


def test_an_old_store_is_converted_on_open_and_every_message_queue_and_counter_is_kept(old_store):
    # Given a store that an older ppmq wrote
    config = fixture_config(old_store)
    # When it is opened
    store = open_store(old_store)
    # Then it was converted, and fsck finds every index, in-flight entry and counter in agreement
    assert store.migrated
    store.close()
    snap = read_snapshot(old_store)
    assert check(snap, config) == []
    assert len(snap.bodies) == 11 and len(snap.inflight) == 6
    # and each in-flight entry now carries its message's publish time
    assert {flight.publish_ns for flight in snap.inflight.values()} == {PUBLISHED_NS}
    # and is in one row per batch: 3 to b on jobs, 1 left to a on jobs, 2 to a on latest; deadlines on jobs only
    ids = snap.state.topic_ids
    batches = sorted((t, len([k for k in snap.inflight if k[:2] == (t, s)]), bool(d)) for (t, s, _), d in snap.batches.items())
    assert batches == sorted([(ids["jobs"], 3, True), (ids["jobs"], 1, True), (ids["latest"], 2, False)])
    assert len(snap.deadlines) == 2


def test_the_broker_goes_on_where_the_old_one_stopped(old_store):
    # Given a converted store, opened by a broker
    store = open_store(old_store)
    broker = Broker(fixture_config(old_store), store, NOW + 3 * 10**9)
    subs = broker.state.subs["jobs"]
    assert (subs["a"].inflight, subs["a"].acked, subs["b"].inflight, subs["b"].ready) == (1, 2, 3, [2, 4])
    # When a acks what the old broker had in flight to it
    step = broker.step([p.Request(topic="jobs", subscriber="a", acks=["5"])], set(), NOW + 4 * 10**9)
    # Then it is applied, and journaled
    assert step.replies[0].accepted == 1
    (event,) = [e for e in step.events if e.event == "ack"]
    assert event.ids == [5]
    store.close()


def test_a_converted_store_is_not_converted_again(old_store):
    open_store(old_store).close()
    store = open_store(old_store)
    assert not store.migrated
    store.close()


def test_a_reader_refuses_an_old_store_and_says_how_to_convert_it(old_store):
    with pytest.raises(StoreError, match="ppmq migrate"):
        StoreReader(old_store)


def test_a_store_of_a_newer_schema_is_refused_and_left_as_it_was(old_store):
    # Given a store some later ppmq wrote
    open_store(old_store).close()
    env = lmdb.open(old_store, max_dbs=16)
    with env.begin(write=True, db=env.open_db(b"meta")) as txn:
        txn.put(b"schema", b"%d" % (SCHEMA_VERSION + 1))
    env.close()
    # When this ppmq opens it, it refuses, naming both versions
    with pytest.raises(StoreError, match=f"schema {SCHEMA_VERSION + 1}, this ppmq reads {SCHEMA_VERSION}"):
        open_store(old_store)
    env = lmdb.open(old_store, max_dbs=16)
    with env.begin(db=env.open_db(b"meta")) as txn:
        assert txn.get(b"schema") == b"%d" % (SCHEMA_VERSION + 1)
    env.close()


def test_ppmq_migrate_converts_once_and_then_says_there_is_nothing_to_do(old_store, tmp_path, capsys):
    config = tmp_path / "ppmq.yaml"
    config.write_text(
        f"ServerSocket: {tmp_path}/s.sock\nDataPath: {old_store}\nSubscribers: [{{Name: a, Socket: {tmp_path}/a.sock}},"
        f" {{Name: b, Socket: {tmp_path}/b.sock}}]\nTopics: [{{Name: jobs, Subscribers: [a, b], Priorities: 2}}]\n"
    )
    assert cli.main(["migrate", "-c", str(config)]) == 0
    assert cli.main(["migrate", "-c", str(config)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{old_store}: converted to schema {SCHEMA_VERSION}", f"{old_store}: already has schema {SCHEMA_VERSION}"]
