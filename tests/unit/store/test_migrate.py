"""A store an older ppmq wrote is converted when it is opened (store/migrate.py), with
nothing lost: tested on stores that ppmq itself wrote with schemas 1 to 5, one
of them filled to its MaxStoreBytes (tests/data/make_old_store.py says how they
were made)."""

from __future__ import annotations

import tarfile
from collections.abc import Callable
from pathlib import Path

import lmdb
import msgspec
import pytest
import yaml

from ppmq.cli import main as cli
from ppmq.core.broker import Broker
from ppmq.errors import StoreError
from ppmq.protocol import messages as p
from ppmq.protocol.messages import fragment_payload
from ppmq.store import migrate
from ppmq.store.fsck import check, read_snapshot
from ppmq.store.reader import StoreReader
from ppmq.store.schema import GROUP_MESSAGES, HOLDER, SCHEMA_VERSION, TM, Body, body_columns, encode_body, holders_columns
from ppmq.store.state import RESERVE_IDS
from ppmq.store.store import Store
from tests.conftest import make_config
from tests.data.make_old_store import FULL_MAX_BYTES, FULL_PAYLOAD_BYTES, NOW, fixture_config, full_config, full_payload

DATA = Path(__file__).parents[2] / "data"
PUBLISHED_NS = NOW  # every message of the fixtures was published in their first step


@pytest.fixture(params=[1, 2, 3, 4, 5], ids=["schema1", "schema2", "schema3", "schema4", "schema5"])
def old_store(request, tmp_path) -> str:
    """A store an older ppmq wrote (the same operations for each schema)."""
    return unpack_store(f"schema{request.param}", tmp_path / "data")


def unpack_store(name: str, out: Path) -> str:
    """tests/data/<name>-store.tar.gz unpacked into `out`."""
    with tarfile.open(DATA / f"{name}-store.tar.gz") as tar:
        tar.extractall(out, filter="data")
    return str(out)


@pytest.fixture
def full_store(tmp_path) -> str:
    """The store a schema 4 ppmq filled until it refused a publish for want of room."""
    return unpack_store("schema4-full", tmp_path / "data")


def config_file(tmp_path: Path, data_path: str, topics: list[dict], subscribers: list[str], **extra: object) -> Path:
    """A config file naming the store at data_path, for the `ppmq` command."""
    path = tmp_path / "ppmq.yaml"
    path.write_text(yaml.safe_dump(make_config(tmp_path, topics, subscribers, DataPath=data_path, **extra)))
    return path


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


def test_the_sequences_of_an_old_store_go_on_above_any_id_its_broker_may_have_let_out(old_store):
    # Given a converted store, whose counters an older ppmq wrote without a reservation of their sequences
    store = open_store(old_store)
    broker = Broker(fixture_config(old_store), store, NOW + 3 * 10**9)
    jobs = broker.state.topics["jobs"]
    # When a message is published and pushed to a subscriber that acked everything it had
    with store.write() as txn:
        held = [str(f.m) for f in txn.inflight_of(broker.state.topic_ids["jobs"], broker.state.sub_ids["a"])]
    step = broker.step(
        [p.Request(topic="jobs", subscriber="a", acks=held), p.Request(topic="jobs", messages=[p.Message(payload=msgspec.Raw(b"1"))])],
        {"a"},
        NOW + 4 * 10**9,
    )
    # Then its key is a reservation's length above the ids the older ppmq handed out (9),
    # which its last step may have let out before a commit that never came
    (key,) = [m["Key"] for d in step.deliveries for m in msgspec.json.decode(d.frame)["Messages"] if m["Payload"] == 1]
    assert int(key) == 9 + RESERVE_IDS + 1
    # and the next start goes on above the reservation its counters now keep
    assert jobs.reserved >= jobs.seq + RESERVE_IDS // 2
    store.close()
    assert check(read_snapshot(old_store), fixture_config(old_store)) == []


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
    config = config_file(tmp_path, old_store, [{"Name": "jobs", "Subscribers": ["a", "b"], "Priorities": 2}], ["a", "b"])
    assert cli.main(["migrate", "-c", str(config)]) == 0
    assert cli.main(["migrate", "-c", str(config)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{old_store}: converted to schema {SCHEMA_VERSION}", f"{old_store}: already has schema {SCHEMA_VERSION}"]


def test_a_store_an_older_ppmq_filled_to_its_max_store_bytes_converts_within_them(full_store, tmp_path, capsys):
    # Given a store that a schema 4 ppmq filled until it refused a publish for want of room
    config = config_file(tmp_path, full_store, [{"Name": "bulk", "Subscribers": ["a"]}], ["a"], MaxStoreBytes=FULL_MAX_BYTES)
    # When ppmq migrate converts it, under the MaxStoreBytes it was filled to
    assert cli.main(["migrate", "-c", str(config)]) == 0
    # Then it is converted, with every message as it was, and fsck finds it consistent
    assert capsys.readouterr().out == f"{full_store}: converted to schema {SCHEMA_VERSION}\n"
    snap = read_snapshot(full_store, fragments=True)
    assert check(snap, full_config(full_store)) == []
    payloads = [fragment_payload(body.fragment) for _, body in sorted(snap.bodies.items())]
    assert len(payloads) * FULL_PAYLOAD_BYTES > FULL_MAX_BYTES * 0.9
    assert payloads == [full_payload(n) for n in range(len(payloads))]


def converted(path: Path, db: str, old: dict[tuple[int, int], bytes], step: Callable) -> dict[tuple[int, int], bytes]:
    """The rows of database db, a row per message (t, m) as `old` has them,
    after the conversion part `step`, a slice after another, converted every
    one; by (t, key id)."""
    env = lmdb.open(str(path), max_dbs=1)
    dbs = {db: env.open_db(db.encode())}
    with env.begin(write=True) as txn:
        for (t, m), value in old.items():
            txn.put(TM.pack(t, m), value, db=dbs[db])
        start, rewritten = b"", 0
        while start is not None:
            done, start = step(txn, dbs, start)
            rewritten += done
        assert rewritten == len(old)
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
    rows = {
        key: holders_columns(value) + (value,) for key, value in converted(tmp_path, "holders", old, migrate._holders_as_groups).items()
    }
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


@pytest.mark.parametrize("exists", [False, True], ids=["no-directory", "empty-directory"])
def test_ppmq_migrate_without_a_store_says_so_and_creates_nothing(tmp_path, capsys, exists):
    # Given a DataPath with no store in it
    data = tmp_path / "data"
    if exists:
        data.mkdir()
    config = config_file(tmp_path, str(data), [], [])
    # When ppmq migrate runs on it
    status = cli.main(["migrate", "-c", str(config)])
    # Then it exits 2 saying there is no store, and leaves the DataPath as it was
    assert status == 2
    assert capsys.readouterr().err == f"ppmq migrate: no ppmq store at {data} (no data.mdb)\n"
    assert (list(data.iterdir()) == []) if exists else not data.exists()


def test_a_slice_of_a_conversion_reads_about_convert_bytes_even_inside_one_run(tmp_path, monkeypatch):
    # Given schema 4 bodies of one topic, ids 1..300, of some 1 KiB each: one run after another of GROUP_MESSAGES
    old = {(1, m): encode_body(Body(0, NOW, 0, b"k%d" % m, b"x" * 1000)) for m in range(1, 301)}
    # When they are converted in slices of 20 KiB, a sixth of a run
    monkeypatch.setattr(migrate, "CONVERT_BYTES", 20_000)
    env = lmdb.open(str(tmp_path), max_dbs=1)
    dbs = {"bodies": env.open_db(b"bodies")}
    with env.begin(write=True) as txn:
        for (t, m), value in old.items():
            txn.put(TM.pack(t, m), value, db=dbs["bodies"])
        slices, start = [], b""
        while start is not None:
            done, start = migrate._bodies_as_groups(txn, dbs, start)
            slices.append(done)
        rows = {TM.unpack(key): value for key, value in txn.cursor(db=dbs["bodies"])}
    env.close()
    # Then each slice rewrites the messages of some 20 KiB, and together every message, once
    assert len(slices) > 10 and sum(slices) == 300
    assert all(done * len(old[1, 1]) <= 20_000 + len(old[1, 1]) for done in slices)
    # in rows that tile the ids, each keyed by its first id, with every record as it was
    ids = [list(body_columns(value)[0]) for value in rows.values()]
    assert sum(ids, []) == list(range(1, 301)) and [m0 for _, m0 in rows] == [row[0] for row in ids]
    for (t, _), value in rows.items():
        row_ids, _, base = body_columns(value)
        assert value[base:] == b"".join(old[t, m] for m in row_ids)
