"""A store an older ppmq wrote is converted when it is opened (migrate.py), with
nothing lost: tested on stores that ppmq itself wrote with schemas 1 to 5
(tests/data/make_old_store.py says how they were made)."""

from __future__ import annotations

import tarfile
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest

from ppmq import cli, migrate
from ppmq import protocol as p
from ppmq.broker import Broker
from ppmq.fsck import check, read_snapshot
from ppmq.reader import StoreReader
from ppmq.schema import GROUP_MESSAGES, HOLDER, SCHEMA_VERSION, TM, Body, StoreError, body_columns, encode_body, holders_columns
from ppmq.store import Store
from tests.data.make_old_store import NOW, fixture_config

DATA = Path(__file__).parent.parent / "data"
PUBLISHED_NS = NOW  # every message of the fixtures was published in their first step


@pytest.fixture(params=[1, 2, 3, 4, 5], ids=["schema1", "schema2", "schema3", "schema4", "schema5"])
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
    # and the holders of each topic's run of messages share one row, keyed by its first id
    assert snap.holder_rows == {(ids["jobs"], 1): list(range(1, 10)), (ids["latest"], 1): [1, 2]}
    # and so do their bodies
    assert snap.body_rows == snap.holder_rows
    # and no copy has an expiry of its own yet (schema 6)
    assert (snap.copies, snap.copy_expiry) == ({}, set())


def test_the_broker_goes_on_where_the_old_one_stopped(old_store, request):
    # Given a converted store, opened by a broker
    store = open_store(old_store)
    broker = Broker(fixture_config(old_store), store, NOW + 3 * 10**9)
    subs = broker.state.subs["jobs"]
    assert (subs["a"].inflight, subs["a"].acked, subs["b"].inflight, subs["b"].ready) == (1, 2, 3, [2, 4])
    # When a acks what the old broker had in flight to it (message 5; from schema 5 on, a
    # publish numbers its messages by priority first, and the one left is message 3)
    with store.write() as txn:
        [m] = [f.m for f in txn.inflight_of(broker.state.topic_ids["jobs"], broker.state.sub_ids["a"])]
    assert m == (3 if request.node.callspec.params["old_store"] == 5 else 5)
    step = broker.step([p.Request(topic="jobs", subscriber="a", acks=[str(m)])], set(), NOW + 4 * 10**9)
    # Then it is applied, and journaled
    assert step.replies[0].accepted == 1
    (event,) = [e for e in step.events if e.event == "ack"]
    assert event.ids == [m]
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


def converted(path: Path, db: str, old: dict[tuple[int, int], bytes], step: Callable) -> dict[tuple[int, int], bytes]:
    """The rows of database db, a row per message (t, m) as `old` has them,
    after the conversion `step` converted every one; by (t, key id)."""
    env = lmdb.open(str(path), max_dbs=1)
    dbs = {db: env.open_db(db.encode())}
    with env.begin(write=True) as txn:
        for (t, m), value in old.items():
            txn.put(TM.pack(t, m), value, db=dbs[db])
        assert step(txn, dbs) == len(old)
        rows = {TM.unpack(key): value for key, value in txn.cursor(db=dbs[db])}
    env.close()
    return rows


@pytest.mark.parametrize("convert_rows", [200, 7])
def test_holders_rows_become_one_row_per_run_of_consecutive_ids_however_the_reads_are_cut(tmp_path, monkeypatch, convert_rows):
    # Given schema 3 holders rows, a row per message: topic 1's ids 1..300 but 50, topic 2's 5 and 6
    old = {(1, m): HOLDER.pack(1, m % 3, m) + HOLDER.pack(2, m % 3, m) for m in range(1, 301) if m != 50}
    old.update({(2, m): HOLDER.pack(4, 0, m) for m in (5, 6)})
    # When they are converted, read 200 rows at a time (a read cuts a run), or 7 (shorter than a run)
    monkeypatch.setattr(migrate, "_CONVERT_ROWS", convert_rows)
    rows = {key: holders_columns(value) + (value,) for key, value in converted(tmp_path, "holders", old, migrate._holders_as_groups).items()}
    # Then each run of consecutive ids of a topic, up to GROUP_MESSAGES long, is one row keyed by its first id
    runs = [(1, list(range(1, 50))), (1, list(range(51, 51 + GROUP_MESSAGES))), (1, list(range(51 + GROUP_MESSAGES, 301))), (2, [5, 6])]
    assert [(t, list(ids)) for (t, _), (ids, _, _, _) in rows.items()] == runs
    assert [m0 for _, m0 in rows] == [ids[0] for _, ids in runs]
    # with every message's holders as they were
    for (t, _), (ids, counts, start, value) in rows.items():
        assert value[start:] == b"".join(old[t, m] for m in ids) and set(counts) == {len(old[t, ids[0]]) // HOLDER.size}


@pytest.mark.parametrize("convert_rows", [200, 7])
def test_bodies_become_one_row_per_run_of_consecutive_ids_cut_where_a_publish_would_cut_it(tmp_path, monkeypatch, convert_rows):
    # Given schema 4 bodies, a row per message: topic 1's ids 1..300 but 50 (of 100 bytes, but 10 of 40 KiB), topic 2's 5 and 6
    def record(m: int, size: int) -> bytes:
        return encode_body(Body(m % 3, NOW, 0, b"k%d" % m, b"x" * size))

    old = {(1, m): record(m, 40_000 if 200 <= m < 210 else 100) for m in range(1, 301) if m != 50}
    old.update({(2, m): record(m, 10) for m in (5, 6)})
    # When they are converted, read 200 rows at a time (a read cuts a run), or 7 (shorter than a run)
    monkeypatch.setattr(migrate, "_CONVERT_ROWS", convert_rows)
    rows = converted(tmp_path, "bodies", old, migrate._bodies_as_groups)
    # Then each run of consecutive ids of a topic, up to GROUP_MESSAGES long, is one row keyed by its first id,
    # and a row ends once its records reach BODY_ROW_BYTES, as a publish ends it: after two of 40 KiB
    rest = 51 + GROUP_MESSAGES
    big = [(1, [m, m + 1]) for m in range(202, 210, 2)]
    runs = [(1, list(range(1, 50))), (1, list(range(51, rest))), (1, list(range(rest, 202))), *big, (1, list(range(210, 301))), (2, [5, 6])]
    assert [(t, list(body_columns(value)[0])) for (t, _), value in rows.items()] == runs
    assert [m0 for _, m0 in rows] == [ids[0] for _, ids in runs]
    # with every message's record as it was
    for (t, _), value in rows.items():
        ids, ends, base = body_columns(value)
        assert value[base:] == b"".join(old[t, m] for m in ids) and ends[-1] == len(value) - base
