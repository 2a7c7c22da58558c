"""Reading a store from another process: one snapshot, every record decoded.

The one decoder of the schema (store/schema.py) for whoever reads a whole store:
fsck, reports and the Spark data source. LMDB readers never block the writer.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Literal, NamedTuple, overload

import lmdb

from ppmq.errors import StoreError
from ppmq.protocol.messages import fragment_payload
from ppmq.store.flight_index import FlightIndex
from ppmq.store.ready_tails import ReadyTails
from ppmq.store.room import Room
from ppmq.store.rows import floor_row
from ppmq.store.schema import (
    BODY_HEAD,
    CONVERTING_KEY,
    DBS,
    DELAYED_VAL,
    DTSM,
    DUE,
    ETM,
    ETMS,
    FLIGHT_ENTRY,
    HOLDER,
    READY_ENTRY,
    SCHEMA_VERSION,
    TM,
    TMS,
    TSM,
    TSPQ,
    U64,
    Body,
    Flight,
    body_columns,
    decode_body,
    holders_columns,
)
from ppmq.store.store import missing_store
from ppmq.store.tables import Tables
from ppmq.store.timers import NextTimes


class StoreReader:
    """A read-only view of a store, for another process (fsck, a report, a Spark
    job) while the broker runs: LMDB readers never block the writer, and one
    `snapshot()` is one consistent read transaction, whose records are decoded
    by ReadTxn (below) and nowhere else. The process needs write access to
    lock.mdb, where LMDB registers its readers."""

    copies_seen = True  # a reader always looks for a copy's own expiry (copies.Seen)

    def __init__(self, path: str) -> None:
        missing = missing_store(path)
        if missing is not None:
            raise StoreError(missing)
        try:
            self.env = lmdb.open(path, readonly=True, lock=True, max_dbs=len(DBS), readahead=False)
        except lmdb.Error as exc:
            raise StoreError(f"cannot open the store at {path} read-only: {exc}") from None
        try:
            self.dbs = self._open_dbs(path, [b"meta"])
            self._check_schema(path)  # before the others: an older schema may not have them all
            self.dbs = self._open_dbs(path, DBS)
        except BaseException:
            self.env.close()
            raise

    def _open_dbs(self, path: str, names: Iterable[bytes]) -> dict[str, lmdb._Database]:
        try:
            return {name.decode(): self.env.open_db(name, create=False) for name in names}
        except lmdb.NotFoundError:
            raise StoreError(f"{path} is an LMDB environment but not a ppmq store (databases missing)") from None
        except lmdb.Error as exc:
            raise StoreError(f"cannot open the store at {path} read-only: {exc}") from None

    def _check_schema(self, path: str) -> None:
        """Compared as bytes: a damaged record is refused with what it holds, not a ValueError."""
        with self.env.begin() as txn:
            found = txn.get(b"schema", db=self.dbs["meta"])
            converting = txn.get(CONVERTING_KEY, db=self.dbs["meta"])
        if found != b"%d" % SCHEMA_VERSION:
            older = found is not None and found.isdigit() and int(found) < SCHEMA_VERSION
            hint = ": start the broker, or run `ppmq migrate`, to convert it" if older else ""
            raise StoreError(f"store {path} has schema {found!r}, this ppmq reads {SCHEMA_VERSION}{hint}")
        if converting is not None:
            raise StoreError(
                f"store {path} is part converted to schema {SCHEMA_VERSION}: start the broker, or run `ppmq migrate`, to finish"
            )

    @property
    def flight_index(self) -> FlightIndex:
        """A new one for every read transaction: each sees rows of its own moment."""
        return FlightIndex()

    @property
    def ready_tails(self) -> ReadyTails:
        """None kept: a reader takes nothing."""
        return ReadyTails()

    @property
    def room(self) -> Room:
        """Never told of a write: a reader writes nothing."""
        return Room(0)

    @property
    def times(self) -> NextTimes:
        """A new one for every read transaction: each sees rows of its own moment."""
        return NextTimes()

    @contextmanager
    def snapshot(self) -> Iterator[ReadTxn]:
        with self.env.begin() as txn:
            yield ReadTxn(self, txn)

    def close(self) -> None:
        self.env.close()


# One decoder of the schema for whoever reads a whole store (fsck, the Spark data
# source): a record per database row, or Damaged where a row does not decode.


class BodyRecord(NamedTuple):
    """bodies: message m of topic t; one per message of a bodies row."""

    t: int
    m: int
    body: Body
    row: int  # the key id of the row it is in (store/schema.py: rows tile a topic's ids)


class HoldersRecord(NamedTuple):
    """holders: the subscribers not done with message m of topic t, each with its
    queue place; one per message of a holders row."""

    t: int
    m: int
    holders: dict[int, tuple[int, int]]  # S -> (prio, pos)
    row: int  # the key id of the row it is in (store/schema.py: rows tile a topic's ids)


class ReadyRecord(NamedTuple):
    """ready: message m queued for subscriber s of topic t at (prio, pos), an
    entry of the run whose key is `run` (one record per entry)."""

    t: int
    s: int
    prio: int
    pos: int
    m: int
    attempts: int
    run: int  # the first place the run's key names (store/schema.py: at most pos)


class FlightRecord(NamedTuple):
    """inflight: batch f delivered to subscriber s of topic t, with its messages not acked yet."""

    t: int
    s: int
    f: int
    deadline_ns: int  # 0: no AckRetry
    flights: list[Flight]


class DeadlineRecord(NamedTuple):
    """deadlines: the AckRetry deadline of batch f in flight."""

    deadline_ns: int
    t: int
    s: int
    f: int


class DelayedRecord(NamedTuple):
    """delayed: message m queued for subscriber s of topic t at (prio, pos), not before due_ns."""

    t: int
    s: int
    prio: int
    pos: int
    m: int
    attempts: int
    due_ns: int


class DueRecord(NamedTuple):
    """due: when the delayed entry at (prio, pos) of subscriber s of topic t comes due."""

    due_ns: int
    t: int
    s: int
    prio: int
    pos: int


class ExpiryRecord(NamedTuple):
    """expiry: when message m of topic t expires."""

    expires_ns: int
    t: int
    m: int


class CopyRecord(NamedTuple):
    """copies: subscriber s's copy of message m of topic t expires at expires_ns (0: never), not with m."""

    t: int
    m: int
    s: int
    expires_ns: int


class CopyExpiryRecord(NamedTuple):
    """copy_expiry: when subscriber s's copy of message m of topic t expires."""

    expires_ns: int
    t: int
    m: int
    s: int


class DedupeRecord(NamedTuple):
    """dedupe: the newest message of topic t stored under key."""

    t: int
    key: bytes
    m: int


class Damaged(NamedTuple):
    """A row that does not decode: yielded, not raised, so one damaged row neither
    hides the others nor stops a reader that reports damage (fsck)."""

    db: str
    key: bytes
    reason: str


Record = (
    BodyRecord
    | HoldersRecord
    | ReadyRecord
    | FlightRecord
    | DeadlineRecord
    | DelayedRecord
    | DueRecord
    | ExpiryRecord
    | DedupeRecord
    | CopyRecord
    | CopyExpiryRecord
)


def _body_records(key: bytes, value: bytes) -> list[BodyRecord]:
    """A row's messages, decoded whole before any is yielded. A body decodes
    when its key fits in its record and its fragment is the JSON object the
    broker delivers, read as the broker reads it (numbers of any size pass)."""
    t, row = TM.unpack(key)
    ids, ends, base = body_columns(value)
    if not ids:
        raise ValueError("a row of no message")
    if list(ends) != sorted(ends) or len(value) != base + ends[-1]:
        raise ValueError(f"{len(value) - base} bytes of records where its ends say {ends[-1]}")
    records, start = [], base
    for m, end in zip(ids, ends):
        record = value[start : base + end]
        klen = BODY_HEAD.unpack_from(record)[3]
        if BODY_HEAD.size + klen > len(record):
            raise ValueError(f"message {m}: key length {klen} runs past the end of its record")
        body = decode_body(record)
        fragment_payload(body.fragment)
        records.append(BodyRecord(t, m, body, row))
        start = base + end
    return records


def _holders_records(key: bytes, value: bytes) -> list[HoldersRecord]:
    """A row's messages, decoded whole before any is yielded: a row whose
    columns and entries disagree is one Damaged, not some records and then one."""
    t, row = TM.unpack(key)
    ids, counts, start = holders_columns(value)
    if not ids:
        raise ValueError("a row of no message")
    if len(value) != start + HOLDER.size * sum(counts):
        raise ValueError(f"{len(value) - start} bytes of entries where its counts say {sum(counts)} holders")
    records = []
    for m, n in zip(ids, counts):
        end = start + HOLDER.size * n
        records.append(HoldersRecord(t, m, {s: (p, pos) for s, p, pos in HOLDER.iter_unpack(value[start:end])}, row))
        start = end
    return records


def _ready_records(key: bytes, value: bytes) -> list[ReadyRecord]:
    """A run, as a record per entry: a run decodes whole, or not at all."""
    if not value or len(value) % READY_ENTRY.size:
        raise ValueError(f"{len(value)} bytes is not a run of whole entries")
    t, s, prio, run = TSPQ.unpack(key)
    return [ReadyRecord(t, s, prio, pos, m, attempts, run) for pos, m, attempts in READY_ENTRY.iter_unpack(value)]


def _flight_record(key: bytes, value: bytes) -> FlightRecord:
    if len(value) < U64.size or (len(value) - U64.size) % FLIGHT_ENTRY.size:
        raise ValueError(f"{len(value)} bytes is not a deadline and whole entries")
    entries = [Flight._make(entry) for entry in FLIGHT_ENTRY.iter_unpack(value[U64.size :])]
    t, s, f = TSM.unpack(key)
    return FlightRecord(t, s, f, U64.unpack_from(value)[0], entries)


def _dedupe_record(key: bytes, value: bytes) -> DedupeRecord:
    if len(key) < 4:
        raise ValueError("key shorter than a topic id")
    return DedupeRecord(int.from_bytes(key[:4], "big"), key[4:], U64.unpack(value)[0])


_RECORDS: dict[str, Callable[[bytes, bytes], Record | list[BodyRecord] | list[HoldersRecord] | list[ReadyRecord]]] = {
    "bodies": _body_records,  # a row per group of messages: a record per message
    "holders": _holders_records,  # a row per group of messages: a record per message
    "ready": _ready_records,  # a row per run: a record per entry
    "inflight": _flight_record,
    "deadlines": lambda key, value: DeadlineRecord._make(DTSM.unpack(key)),
    "delayed": lambda key, value: DelayedRecord(*TSPQ.unpack(key), *DELAYED_VAL.unpack(value)),
    "due": lambda key, value: DueRecord._make(DUE.unpack(key)),
    "expiry": lambda key, value: ExpiryRecord._make(ETM.unpack(key)),
    "dedupe": _dedupe_record,
    "copies": lambda key, value: CopyRecord(*TMS.unpack(key), *U64.unpack(value)),
    "copy_expiry": lambda key, value: CopyExpiryRecord._make(ETMS.unpack(key)),
}


class ReadTxn:
    """A StoreReader's read transaction: the tables of a write transaction
    (store/tables.py) over a read-only one, for their reads, and whole
    databases walked as records."""

    def __init__(self, reader: StoreReader, txn: lmdb.Transaction[bytes]) -> None:
        self.store = reader
        self.txn = txn
        self.tables = tables = Tables(reader, txn)  # `messages` here is a walk of the bodies (below): its table is tables.messages
        self.meta, self.copies, self.bodies = tables.meta, tables.copies, tables.bodies
        self.delayed, self.ready, self.flights, self.holders = tables.delayed, tables.ready, tables.flights, tables.holders
        # the reads a whole-store reader makes (fsck, counters.load_state, the Spark data source), by a write transaction's names
        self.staged, self.get_meta, self.meta_items = self.meta.staged, self.meta.get, self.meta.items
        self.get_body, self.get_holders = self.bodies.get, self.holders.get
        self.ready_attempts, self.get_inflight = self.ready.attempts, self.flights.get

    @overload
    def records(self, db: Literal["bodies"], start: bytes = b"", stop: bytes | None = None) -> Iterator[BodyRecord | Damaged]: ...
    @overload
    def records(self, db: str, start: bytes = b"", stop: bytes | None = None) -> Iterator[Record | Damaged]: ...
    def records(self, db: str, start: bytes = b"", stop: bytes | None = None) -> Iterator[Record | Damaged]:
        """The records of every row of database db (a name in the schema above,
        but meta; one record a row, a holders row's one a message) with a key
        from `start` up to `stop` (excluded; None: to the end), in key order,
        staged rows included: Staged.hides tells them apart. A key range is how
        a reader in parallel parts (the Spark data source) splits a database.
        A ready run is a record per entry, in the order it holds them."""
        decode = _RECORDS[db]
        with self.txn.cursor(db=self.store.dbs[db]) as cur:
            if not cur.set_range(start):
                return
            for key, value in cur:
                if stop is not None and key >= stop:
                    return
                try:
                    decoded = decode(key, value)
                except (struct.error, ValueError) as exc:  # msgspec.DecodeError is a ValueError
                    yield Damaged(db, key, str(exc))
                    continue
                if isinstance(decoded, list):  # a row of several messages (bodies, holders) or entries (a ready run)
                    yield from decoded
                else:
                    yield decoded

    def message_ids(self, t: int) -> tuple[int, int] | None:
        """Bounds of the message ids of topic t in bodies (staged ones included):
        the key of its first row, at or below its lowest id, and its highest id,
        from its last row (that row's key if it does not decode: reading it then
        names the damage); None when it has none."""
        with self.txn.cursor(db=self.store.dbs["bodies"]) as cur:
            if not cur.set_range(TM.pack(t, 0)) or TM.unpack(cur.key())[0] != t:
                return None
            first = TM.unpack(cur.key())[1]
            if not (cur.prev() if cur.set_range(TM.pack(t + 1, 0)) else cur.last()):
                return None
            last = TM.unpack(cur.key())[1]
            try:
                return first, max(last, body_columns(cur.value())[0][-1])
            except (struct.error, IndexError):
                return first, last

    def messages(self, t: int, lo: int, hi: int) -> Iterator[BodyRecord | Damaged]:
        """The records of topic t's messages with ids from lo up to hi (excluded),
        staged ones included: those of the rows whose ranges meet [lo, hi)."""
        with self.txn.cursor(db=self.store.dbs["bodies"]) as cur:
            start = floor_row(cur, TM.pack(t, lo), 4) or TM.pack(t, lo)
        for record in self.records("bodies", start, TM.pack(t, hi)):
            if isinstance(record, Damaged) or lo <= record.m < hi:
                yield record

    @property
    def id(self) -> int:
        """The transaction id of this snapshot: the same id, the same store state."""
        return self.txn.id()
