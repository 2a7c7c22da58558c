"""Converting a store written by an older ppmq to the schema of this one.

Each step takes a store from one schema version to the next inside the write
transaction that opens it, so a crash during a conversion leaves the store as it
was, and the broker converts again on its next start. `ppmq migrate` runs the
same conversion without starting the broker.

The layouts of older versions live here, and nowhere else: they are only ever
read, once.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from itertools import groupby, islice

import lmdb

from .schema import BODY_HEAD, DTSM, FLIGHT_ENTRY, GROUP_MESSAGES, HOLDER, READY_ENTRY, READY_RUN, SCHEMA_VERSION, TM, TSM, TSPQ, U64, StoreError, body_row_spans, encode_body_row, encode_holders_row

log = logging.getLogger(__name__)

_FLIGHT_1 = struct.Struct(">BQQI")  # schema 1: prio, pos, deadline_ns, attempts
_FLIGHT_2 = struct.Struct(">BQQIQ")  # schema 2: prio, pos, deadline_ns, attempts, publish_ns
_READY_3 = struct.Struct(">QI")  # schema 3 and before: a ready row per entry, M, attempts
_READY_CHUNK = 1 << 16  # ready rows converted at a time, so that a backlog is not all in memory at once
# schema 3 and older: holders T M -> HOLDER entries, a row per message
_CONVERT_ROWS = 1 << 16  # old holders rows read at a time: a backlog converts in bounded memory


def _inflight_with_publish_ns(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> int:
    """1 -> 2: an in-flight entry carries its message's publish time, so an ack
    is journaled without reading the message. Returns the entries rewritten."""
    rows = []
    with txn.cursor(db=dbs["inflight"]) as cur:
        for key, value in cur:
            t, _, m = TSM.unpack(key)
            body = txn.get(TM.pack(t, m), db=dbs["bodies"])
            publish_ns = BODY_HEAD.unpack_from(body)[1] if body is not None else 0
            rows.append((key, _FLIGHT_2.pack(*_FLIGHT_1.unpack(value), publish_ns)))
    for key, value in rows:
        txn.put(key, value, db=dbs["inflight"])
    return len(rows)


def _inflight_by_batch(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> int:
    """2 -> 3: the in-flight entries of a subscription become one row per batch.
    Which batch an entry came in is not stored in schema 2; entries with one
    AckRetry deadline were pushed together (or within the same step), so they
    make one batch. The deadline index is rebuilt to name the batches. Returns
    the entries rewritten."""
    batches: dict[tuple[int, int, int], list[bytes]] = {}  # (t, s, deadline_ns) -> entries
    with txn.cursor(db=dbs["inflight"]) as cur:
        for key, value in cur:
            t, s, m = TSM.unpack(key)
            prio, pos, deadline_ns, attempts, publish_ns = _FLIGHT_2.unpack(value)
            batches.setdefault((t, s, deadline_ns), []).append(FLIGHT_ENTRY.pack(m, prio, pos, attempts, publish_ns))
    txn.drop(dbs["inflight"], delete=False)
    txn.drop(dbs["deadlines"], delete=False)
    numbers: dict[tuple[int, int], int] = {}
    for (t, s, deadline_ns), entries in sorted(batches.items()):
        f = numbers[t, s] = numbers.get((t, s), 0) + 1
        txn.put(TSM.pack(t, s, f), U64.pack(deadline_ns) + b"".join(entries), db=dbs["inflight"])
        if deadline_ns:
            txn.put(DTSM.pack(deadline_ns, t, s, f), b"", db=dbs["deadlines"])
    return sum(map(len, batches.values()))


def _ready_as_runs(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> int:
    """The ready rows of each (T, S, prio) become runs of READY_RUN entries,
    keyed by their first place (schema.py). Read _READY_CHUNK rows at a time:
    the runs written replace rows already read, and the next chunk starts past
    them. Returns the entries rewritten."""
    db, start, done = dbs["ready"], b"", 0
    while True:
        with txn.cursor(db=db) as cur:
            rows = list(islice(cur.iternext(), _READY_CHUNK)) if cur.set_range(start) else []
        if not rows:
            return done
        for key, _ in rows:
            txn.delete(key, db=db)
        for _, queue in groupby(rows, key=lambda row: row[0][:7]):  # the rows of one (T, S, prio)
            entries = [(key, READY_ENTRY.pack(TSPQ.unpack(key)[3], *_READY_3.unpack(value))) for key, value in queue]
            for i in range(0, len(entries), READY_RUN):
                run = entries[i : i + READY_RUN]
                txn.put(run[0][0], b"".join(entry for _, entry in run), db=db)
        done += len(rows)
        start = rows[-1][0] + b"\0"


def _holders_as_groups(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> int:
    """The holders rows of a run of consecutive ids of a topic (up to
    GROUP_MESSAGES of them) become one row, keyed by the run's first id and
    written over that id's old row. Returns the messages rewritten."""
    db, start, rewritten = dbs["holders"], b"", 0
    while start is not None:
        runs, start = _old_runs(txn, db, start)
        for run in runs:
            ids = [TM.unpack(key)[1] for key, _ in run]
            counts = [len(value) // HOLDER.size for _, value in run]
            txn.put(run[0][0], encode_holders_row(ids, counts, b"".join(value for _, value in run)), db=db)
            for key, _ in run[1:]:
                txn.delete(key, db=db)
            rewritten += len(run)
    return rewritten


def _old_runs(txn: lmdb.Transaction, db: lmdb._Database, start: bytes) -> tuple[list[list[tuple[bytes, bytes]]], bytes | None]:
    """Runs of consecutive ids of one topic, at most GROUP_MESSAGES long, of the
    old rows from key `start` on, about _CONVERT_ROWS of them; and the key to
    read on from (None: the end was reached). A read cut short leaves its last
    run, which may go on, to the next, and ends one run or more."""
    runs: list[list[tuple[bytes, bytes]]] = []
    with txn.cursor(db=db) as cur:
        if not cur.set_range(start):
            return runs, None
        for read, (key, value) in enumerate(cur):
            if read >= _CONVERT_ROWS and len(runs) > 1:
                return runs[:-1], runs[-1][0][0]
            last = runs[-1][-1][0] if runs else b""
            if last[:4] == key[:4] and TM.unpack(last)[1] + 1 == TM.unpack(key)[1] and len(runs[-1]) < GROUP_MESSAGES:
                runs[-1].append((key, value))
            else:
                runs.append([(key, value)])
    return runs, None


def _bodies_as_groups(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> int:
    """4 -> 5: the bodies of a run of consecutive ids of a topic (up to
    GROUP_MESSAGES of them, and BODY_ROW_BYTES as a publish would write them)
    become one row, keyed by the run's first id and written over that id's old
    row, whose value was one body's record. Returns the messages rewritten."""
    db, start, rewritten = dbs["bodies"], b"", 0
    while start is not None:
        runs, start = _old_runs(txn, db, start)
        for run in runs:
            for a, b in body_row_spans([len(value) for _, value in run]):
                row = run[a:b]
                txn.put(row[0][0], encode_body_row([TM.unpack(key)[1] for key, _ in row], [value for _, value in row]), db=db)
                for key, _ in row[1:]:
                    txn.delete(key, db=db)
            rewritten += len(run)
    return rewritten


def _3_to_4(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> int:
    """3 -> 4: a subscriber's ready queue is stored as runs of entries, and the
    holders of a run of messages share a row. Returns the entries rewritten."""
    return _ready_as_runs(txn, dbs) + _holders_as_groups(txn, dbs)


def _copies(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> int:
    """5 -> 6: the databases `copies` and `copy_expiry` (schema.py) are new,
    and empty in a converted store: schema 5 gave no copy an expiry of its
    own (a PHPMQ re-queue changed the message's). Opening the store made them,
    so nothing is rewritten."""
    return 0


# STEPS[v] converts a store of schema v to v + 1.
STEPS: dict[int, Callable[[lmdb.Transaction, dict[str, lmdb._Database]], int]] = {
    1: _inflight_with_publish_ns,
    2: _inflight_by_batch,
    3: _3_to_4,
    4: _bodies_as_groups,
    5: _copies,
}


def upgrade(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database], found: int, path: str) -> bool:
    """Convert the store under `txn` from schema `found` to SCHEMA_VERSION, step by
    step; True if there was anything to convert. A store newer than this ppmq,
    or of a version it never wrote, is refused untouched."""
    if found == SCHEMA_VERSION:
        return False
    if found > SCHEMA_VERSION or found not in STEPS:
        raise StoreError(f"store {path} has schema {found}, this ppmq reads {SCHEMA_VERSION} and converts from {min(STEPS)}")
    for version in range(found, SCHEMA_VERSION):
        rewritten = STEPS[version](txn, dbs)
        log.warning("store %s converted from schema %d to %d (%d entries rewritten)", path, version, version + 1, rewritten)
    txn.put(b"schema", b"%d" % SCHEMA_VERSION, db=dbs["meta"])
    return True
