"""A store an older ppmq wrote is converted when it is opened (migrate.py), with
nothing lost: tested on a store that ppmq itself wrote with schema 1
(tests/data/make_schema1_store.py says how it was made)."""

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
from tests.data.make_schema1_store import NOW, fixture_config

FIXTURE = Path(__file__).parent.parent / "data" / "schema1-store.tar.gz"
PUBLISHED_NS = NOW  # every message of the fixture was published in its first step


@pytest.fixture
def schema1(tmp_path) -> str:
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path / "data", filter="data")
    return str(tmp_path / "data")


def open_store(path: str) -> Store:
    return Store(path, sync=False, max_bytes=1 << 26)


def test_a_schema_1_store_is_converted_on_open_and_every_message_queue_and_counter_is_kept(schema1):
    # Given a store that ppmq wrote with schema 1
    config = fixture_config(schema1)
    # When it is opened
    store = open_store(schema1)
    # Then it was converted, and fsck finds every index, in-flight entry and counter in agreement
    assert store.migrated
    store.close()
    snap = read_snapshot(schema1)
    assert check(snap, config) == []
    assert len(snap.bodies) == 11 and len(snap.inflight) == 6
    # and each in-flight entry now carries its message's publish time
    assert {flight.publish_ns for flight in snap.inflight.values()} == {PUBLISHED_NS}


def test_the_broker_goes_on_where_the_old_one_stopped(schema1):
    # Given a converted schema 1 store, opened by a broker
    store = open_store(schema1)
    broker = Broker(fixture_config(schema1), store, NOW + 3 * 10**9)
    subs = broker.state.subs["jobs"]
    assert (subs["a"].inflight, subs["a"].acked, subs["b"].inflight, subs["b"].ready) == (1, 2, 3, [2, 4])
    # When a acks what the old broker had in flight to it
    step = broker.step([p.Request(topic="jobs", subscriber="a", acks=["5"])], set(), NOW + 4 * 10**9)
    # Then it is applied, and the journal has its publish time from the converted entry
    assert step.replies[0].accepted == 1
    (event,) = [e for e in step.events if e.event == "ack"]
    assert (event.ids, event.pub_ns, event.attempts) == ([5], [PUBLISHED_NS], [1])
    store.close()


def test_a_converted_store_is_not_converted_again(schema1):
    open_store(schema1).close()
    store = open_store(schema1)
    assert not store.migrated
    store.close()


def test_a_reader_refuses_a_schema_1_store_and_says_how_to_convert_it(schema1):
    with pytest.raises(StoreError, match="ppmq migrate"):
        StoreReader(schema1)


def test_a_store_of_a_newer_schema_is_refused_and_left_as_it_was(schema1):
    # Given a store some later ppmq wrote
    open_store(schema1).close()
    env = lmdb.open(schema1, max_dbs=16)
    with env.begin(write=True, db=env.open_db(b"meta")) as txn:
        txn.put(b"schema", b"%d" % (SCHEMA_VERSION + 1))
    env.close()
    # When this ppmq opens it, it refuses, naming both versions
    with pytest.raises(StoreError, match=f"schema {SCHEMA_VERSION + 1}, this ppmq reads {SCHEMA_VERSION}"):
        open_store(schema1)
    env = lmdb.open(schema1, max_dbs=16)
    with env.begin(db=env.open_db(b"meta")) as txn:
        assert txn.get(b"schema") == b"%d" % (SCHEMA_VERSION + 1)
    env.close()


def test_ppmq_migrate_converts_once_and_then_says_there_is_nothing_to_do(schema1, tmp_path, capsys):
    config = tmp_path / "ppmq.yaml"
    config.write_text(
        f"ServerSocket: {tmp_path}/s.sock\nDataPath: {schema1}\nSubscribers: [{{Name: a, Socket: {tmp_path}/a.sock}},"
        f" {{Name: b, Socket: {tmp_path}/b.sock}}]\nTopics: [{{Name: jobs, Subscribers: [a, b], Priorities: 2}}]\n"
    )
    assert cli.main(["migrate", "-c", str(config)]) == 0
    assert cli.main(["migrate", "-c", str(config)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{schema1}: converted to schema {SCHEMA_VERSION}", f"{schema1}: already has schema {SCHEMA_VERSION}"]
