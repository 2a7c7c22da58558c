"""`ppmq fsck`: a store the broker wrote is clean; every kind of damage is reported."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import msgspec
import pytest
import yaml

from ppmq.config import Config, SubscriberConfig, TopicConfig
from ppmq.core.broker import Broker
from ppmq.errors import FsckError
from ppmq.protocol import messages as p
from ppmq.store.counters import Ledger, load_state
from ppmq.store.fsck import check, read_snapshot
from ppmq.store.schema import ETMS, HOLDER, TM, TMS, U64, body_columns, encode_body_row, encode_holders_row, holders_columns, u32
from ppmq.store.state import NS, State
from ppmq.store.store import Store, Txn
from tests.unit.conftest import writing

NOW = 1_800_000_000 * NS


def make_config(path: Path) -> Config:
    """`d`: dedupe, expiry, two priorities, AckRetry, two subscribers; `g`: generated keys."""
    return Config(
        server_socket=str(path / "ppmq.sock"),
        data_path=str(path / "data"),
        sync=False,
        subscribers=[SubscriberConfig(name=n, socket=str(path / f"{n}.sock"), batch_size=2) for n in ("a", "b")],
        topics=[
            TopicConfig(name="d", subscribers=["a", "b"], dedupe=True, expire=True, priorities=2, ack_retry=60),
            TopicConfig(name="g", subscribers=["a"]),
        ],
    )


def publish(topic: str, *messages: dict) -> p.Request:
    return p.Request(topic=topic, messages=[msgspec.convert(m, p.Message) for m in messages], id=msgspec.Raw(b"1"))


class Built:
    """A store on disk, closed: py-lmdb opens an environment once per process,
    so damage is done through a Store opened and closed again around it."""

    def __init__(self, config: Config, ids: dict[str, int]) -> None:
        self.config, self.path, self.ids = config, config.data_path, ids

    def write(self) -> AbstractContextManager[Txn]:
        return writing(self.path)


@pytest.fixture
def store(tmp_path: Path) -> Built:
    """A store as the broker leaves it: queued, in flight with deadlines, acked,
    replaced, expiring, delayed."""
    config = make_config(tmp_path)
    store = Store(config.data_path, sync=False, max_bytes=1 << 24)
    broker = Broker(config, store, NOW)
    raw = lambda v: msgspec.Raw(msgspec.json.encode(v))  # noqa: E731
    d = [{"Key": f"k{i}", "Payload": raw(i), "Priority": i % 2, "Expires": NOW // NS + 100 + i} for i in range(6)]
    broker.step([publish("d", *d), publish("g", *({"Payload": raw(i)} for i in range(4)))], set(), NOW)
    broker.step([], {"a"}, NOW)  # two of each topic in flight to a
    broker.step([p.Request(topic="g", subscriber="a", acks=["1"]), publish("d", {"Key": "k3", "Payload": raw("new")})], set(), NOW)
    broker.step([publish("g", {"Payload": raw("later"), "Delay": 60})], set(), NOW)  # message 5 waits for a and b
    store.close()
    return Built(config, {**broker.state.topic_ids, **broker.state.sub_ids})


def problems(store: Built) -> list[str]:
    return check(read_snapshot(store.path), store.config)


def test_a_store_the_broker_wrote_is_clean(store):
    snap = read_snapshot(store.path)
    assert check(snap, store.config) == []
    assert len(snap.bodies) == 6 + 4 and snap.inflight and snap.deadlines and snap.expiry and snap.dedupe and snap.delayed and snap.due


def test_payloads_of_any_json_number_are_clean(tmp_path):
    # Given payloads the broker passes on as they came: numbers no float holds
    config = make_config(tmp_path)
    store = Store(config.data_path, sync=False, max_bytes=1 << 24)
    broker = Broker(config, store, NOW)
    payloads = [b"1e999", b"-1e999", b"9" * 400, b"1.5e-400"]
    reply = broker.step([publish("g", *({"Payload": msgspec.Raw(x)} for x in payloads))], set(), NOW).replies[0]
    store.close()
    # Then fsck finds nothing wrong with them
    assert reply.status == 200
    assert check(read_snapshot(config.data_path), config) == []


def first_entry(txn: Txn, db: str) -> tuple[bytes, bytes]:
    return next(iter(txn.txn.cursor(db=txn.store.dbs[db])))


def with_txn(change: Callable[[Txn, dict[str, int]], object]) -> Callable[[Built], None]:
    def apply(store: Built) -> None:
        with store.write() as txn:
            change(txn, store.ids)

    return apply


def drop_first(db: str) -> Callable[[Built], None]:
    return with_txn(lambda txn, _: txn.txn.delete(first_entry(txn, db)[0], db=txn.store.dbs[db]))


def truncate_first(db: str) -> Callable[[Built], None]:
    def cut(txn: Txn, _: dict) -> None:
        key, value = first_entry(txn, db)
        txn.txn.put(key, value[:5], db=txn.store.dbs[db])

    return with_txn(cut)


def with_state(change: Callable[[State], None]) -> Callable[[Built], None]:
    def apply(txn: Txn, _: dict) -> None:
        state = load_state(txn)
        change(state)
        Ledger(state).save(txn, everything=True)

    return with_txn(apply)


def copy_first_body_to(m: int) -> Callable[[Txn, dict[str, int]], None]:
    """A row of its own holding message m, a copy of the first stored message."""

    def put(txn: Txn, ids: dict[str, int]) -> None:
        row = first_entry(txn, "bodies")[1]
        _, ends, base = body_columns(row)
        txn.txn.put(
            ids["g"].to_bytes(4, "big") + m.to_bytes(8, "big"),
            encode_body_row([m], [row[base : base + ends[0]]]),
            db=txn.store.dbs["bodies"],
        )

    return put


def shift_first_flight_publish_ns(txn: Txn, _: dict) -> None:
    key, value = first_entry(txn, "inflight")
    txn.txn.put(key, value[:-8] + (int.from_bytes(value[-8:], "big") + 1).to_bytes(8, "big"), db=txn.store.dbs["inflight"])


def copy_first_flight_to_a_new_batch(txn: Txn, _: dict) -> None:
    key, value = first_entry(txn, "inflight")
    txn.txn.put(key[:-8] + (10**6).to_bytes(8, "big"), value, db=txn.store.dbs["inflight"])


def empty_first_flight(txn: Txn, _: dict) -> None:
    key, value = first_entry(txn, "inflight")
    txn.txn.put(key, value[:8], db=txn.store.dbs["inflight"])


def rerun_first_ready(change: Callable[[bytes, bytes], tuple[bytes, bytes]], keep: bool) -> Callable[[Built], None]:
    """The first ready run put again as `change` makes it (key, value), the original kept or not."""

    def apply(txn: Txn, _: dict) -> None:
        key, value = first_entry(txn, "ready")
        if not keep:
            txn.txn.delete(key, db=txn.store.dbs["ready"])
        txn.txn.put(*change(key, value), db=txn.store.dbs["ready"])

    return with_txn(apply)


def shift_key(key: bytes, by: int) -> bytes:
    return key[:-8] + (int.from_bytes(key[-8:], "big") + by).to_bytes(8, "big")


def past_first_entry(key: bytes, value: bytes) -> tuple[bytes, bytes]:
    """The run keyed one place above its first entry's."""
    return key[:-8] + (int.from_bytes(value[:8], "big") + 1).to_bytes(8, "big"), value


def holders_row(txn: Txn, t: int, m0: int) -> tuple[bytes, bytes]:
    key = TM.pack(t, m0)
    return key, txn.txn.get(key, db=txn.store.dbs["holders"])


def copy_row(db: str, m0: int, to: int, *, move: bool = False) -> Callable[[Txn, dict[str, int]], None]:
    """Topic g's row of db (holders, bodies) keyed m0, put under the key `to` (and gone from m0, `move`)."""

    def put(txn: Txn, ids: dict[str, int]) -> None:
        key = TM.pack(ids["g"], m0)
        raw = txn.txn.get(key, db=txn.store.dbs[db])
        if move:
            txn.txn.delete(key, db=txn.store.dbs[db])
        txn.txn.put(TM.pack(ids["g"], to), raw, db=txn.store.dbs[db])

    return put


def unhold_first_of_holders_row(txn: Txn, ids: dict[str, int]) -> None:
    """The first message of topic g's first row (message 2: 1 was acked) keeps its place but loses its holders."""
    key, raw = holders_row(txn, ids["g"], 1)
    ms, counts, start = holders_columns(raw)
    txn.txn.put(key, encode_holders_row(ms, (0, *counts[1:]), raw[start + HOLDER.size * counts[0] :]), db=txn.store.dbs["holders"])


DAMAGES = {
    "a message body deleted": (with_txn(lambda txn, i: txn.delete_messages(i["g"], [2], dedupe=False)), "is not stored"),
    "a ready entry deleted": (drop_first("ready"), "neither queued at"),
    "a batch in flight deleted": (drop_first("inflight"), "matches no batch in flight"),
    "a message in two batches in flight": (with_txn(copy_first_flight_to_a_new_batch), "is in two batches in flight"),
    "a batch in flight with no message": (with_txn(empty_first_flight), "holds no message"),
    "a deadline entry deleted": (drop_first("deadlines"), "missing from the deadline index"),
    "a delayed entry deleted": (drop_first("delayed"), "matches no delayed entry due then"),
    "a due entry deleted": (drop_first("due"), "missing from the due index"),
    "a delayed counter off": (with_state(lambda s: setattr(s.subs["g"]["a"], "delayed", 3)), "counts 3 delayed"),
    "an expiry entry deleted": (drop_first("expiry"), "missing from the expiry index"),
    "a dedupe entry deleted": (drop_first("dedupe"), "missing from the dedupe index"),
    "a holders entry deleted": (drop_first("holders"), "is held by no subscriber"),
    "a queue entry for a message never stored": (
        with_txn(lambda txn, i: txn.push_ready(i["g"], i["a"], 0, 99, 99, 0)),
        "-> topic 'g' message 99 is not stored",
    ),
    "a message both queued and in flight": (with_txn(lambda txn, i: txn.push_ready(i["g"], i["a"], 0, 2, 2, 0)), "is also in flight"),
    "a queue entry at another place than its holders say": (
        with_txn(lambda txn, i: txn.push_ready(i["g"], i["a"], 0, 50, 3, 0)),
        "does not hold this place",
    ),
    "a dedupe key pointing at another message": (
        with_txn(lambda txn, i: txn.txn.put(u32(i["d"]) + b"k0", U64.pack(2), db=txn.store.dbs["dedupe"])),
        "not stored under that key",
    ),
    "an expiry entry at the wrong time": (
        with_txn(lambda txn, i: txn.add_expiry(NOW, i["d"], 1)),
        "matches no stored message expiring then",
    ),
    "a body above the topic's sequence": (with_txn(copy_first_body_to(10**6)), "above the topic's sequence"),
    "an in-flight entry with another publish time": (with_txn(shift_first_flight_publish_ns), "its message at"),
    "a truncated body": (truncate_first("bodies"), "bodies: entry"),
    "a truncated in-flight entry": (truncate_first("inflight"), "inflight: entry"),
    "a ready run cut mid-entry": (truncate_first("ready"), "not a run of whole entries"),
    "a ready run keyed above its first entry": (rerun_first_ready(past_first_entry, keep=False), "is below the key"),
    "a ready run out of order": (rerun_first_ready(lambda k, v: (k, v + v[:20]), keep=True), "comes after the entry at"),
    "ready runs that overlap": (rerun_first_ready(lambda k, v: (shift_key(k, -1), v), keep=True), "but the run before holds"),
    "a holders row cut short": (truncate_first("holders"), "holders: entry"),
    "a holders row keyed above its first message": (with_txn(copy_row("holders", 1, 3, move=True)), "holds message 2, below its key"),
    "a message in two holders rows": (with_txn(copy_row("holders", 5, 4)), "holds message 5, not below the next row's key 5"),
    "a bodies row keyed above its first message": (
        with_txn(copy_row("bodies", 1, 3, move=True)),
        "bodies: row 3 of topic 'g' holds message 2, below its key",
    ),
    "a message in two bodies rows": (
        with_txn(copy_row("bodies", 5, 4)),
        "bodies: row 4 of topic 'g' holds message 5, not below the next row's key 5",
    ),
    "a message left in its holders row without a holder": (
        with_txn(unhold_first_of_holders_row),
        "message 2 is in row 1 but held by no subscriber",
    ),
    "a sequence above its reservation": (with_state(lambda s: setattr(s.topics["g"], "reserved", 1)), "above its reservation 1"),
    "a stored counter off by one": (with_state(lambda s: setattr(s.topics["d"], "stored", 7)), "counts 7 stored"),
    "a stored-bytes counter off": (with_state(lambda s: setattr(s.topics["g"], "stored_bytes", 1)), "counts 1 stored bytes"),
    "a ready counter off": (with_state(lambda s: s.subs["d"]["b"].ready.__setitem__(0, 9)), "counts [9, 2] ready"),
    "an in-flight counter off": (with_state(lambda s: setattr(s.subs["g"]["a"], "inflight", 5)), "counts 5 in flight"),
    "rows of a subscription that is gone": (with_state(lambda s: s.subs["g"].pop("a")), "which it does not take"),
    "holders naming a subscription that is gone": (with_state(lambda s: s.subs["d"].pop("b")), "which does not take that topic"),
    "a copy's own expiry for a copy not held": (
        with_txn(lambda txn, i: txn.put_copy_expiry(i["g"], 99, i["a"], 0, expire=True)),
        "has an expiry of its own but is not held",
    ),
    "a copy's own expiry missing from its index": (
        with_txn(lambda txn, i: txn.txn.put(TMS.pack(i["d"], 1, i["a"]), U64.pack(NOW), db=txn.store.dbs["copies"])),
        "missing from the copy_expiry index",
    ),
    "a copy expiry entry without its copy": (
        with_txn(lambda txn, i: txn.txn.put(ETMS.pack(NOW, i["d"], 1, i["a"]), b"", db=txn.store.dbs["copy_expiry"])),
        "matches no copy expiring then",
    ),
}


@pytest.mark.parametrize("damage", DAMAGES, ids=list(DAMAGES))
def test_each_kind_of_damage_is_reported_on_a_line_that_names_it(store, damage):
    # Given a clean store, damaged behind the broker's back
    do, expected = DAMAGES[damage]
    do(store)
    # When fsck reads it
    found = problems(store)
    # Then a line names the damage
    assert any(expected in line for line in found), found


def test_a_store_of_another_schema_or_with_unreadable_counters_cannot_be_checked(store):
    with store.write() as txn:
        txn.put_meta(b"state", b"\xc1garbage")
    with pytest.raises(FsckError, match="do not decode"):
        read_snapshot(store.path)
    with store.write() as txn:
        txn.put_meta(b"schema", b"99")
    with pytest.raises(FsckError, match="schema"):
        read_snapshot(store.path)


def fsck_cli(config: Config | dict, tmp: Path) -> subprocess.CompletedProcess:
    path = tmp / "fsck.yaml"
    data = (
        config
        if isinstance(config, dict)
        else {
            "ServerSocket": config.server_socket,
            "DataPath": config.data_path,
            "Subscribers": [{"Name": s.name, "Socket": s.socket} for s in config.subscribers],
            "Topics": [
                {"Name": t.name, "Subscribers": t.subscribers, "Dedupe": t.dedupe, "Expire": t.expire, "Priorities": t.priorities}
                for t in config.topics
            ],
        }
    )
    path.write_text(yaml.safe_dump(data))
    return subprocess.run([sys.executable, "-m", "ppmq.cli", "fsck", "-c", str(path)], capture_output=True, text=True, timeout=60)


def test_the_command_exits_0_on_a_clean_store_and_1_with_one_line_per_problem(store, tmp_path):
    clean = fsck_cli(store.config, tmp_path)
    assert (clean.returncode, clean.stdout) == (0, ""), clean.stderr
    assert "clean (10 messages" in clean.stderr
    drop_first("inflight")(store)
    drop_first("expiry")(store)
    damaged = fsck_cli(store.config, tmp_path)
    assert damaged.returncode == 1, damaged.stderr
    lines = damaged.stdout.splitlines()
    assert any("deadline" in line for line in lines) and any("expiry index" in line for line in lines), lines
    assert f"{len(lines)} problems" in damaged.stderr


@pytest.mark.parametrize("data_path", ["mem", "missing", "not-lmdb"])
def test_the_command_exits_2_and_says_why_when_there_is_no_store_to_check(tmp_path, data_path):
    (tmp_path / "not-lmdb").mkdir()
    (tmp_path / "not-lmdb" / "data.mdb").write_bytes(b"not an LMDB file" * 512)
    path = data_path if data_path == "mem" else str(tmp_path / data_path)
    done = fsck_cli({"ServerSocket": str(tmp_path / "s.sock"), "DataPath": path}, tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert {"mem": "throwaway", "missing": "no ppmq store", "not-lmdb": "cannot open"}[data_path] in done.stderr
