"""Converting a store written by an older ppmq to the schema of this one.

Each step takes a store from one schema version to the next, and a step is
made of parts (STEPS), each converting the rows of one database. A part works
through its database in key order, a bounded slice (CONVERT_BYTES or so) per
write transaction, so that the conversion needs room for a few slices beside
the store, not for a second copy of it: a store its MaxStoreBytes let an older
ppmq fill converts within the map that MaxStoreBytes gives. The rows below the
key a slice stopped at are converted, the rows from it on are not, and the
meta `converting` record, written with each slice, names that key, the part
and the step.

From the first slice on, meta `schema` holds this ppmq's version, so an older
ppmq refuses the store; while `converting` is there, the readers (fsck,
reports) refuse it too, and the broker and `ppmq migrate` go on from the key it
names before anything else. So a crash during a conversion leaves a store that
the next start finishes converting, and nobody ever reads one half converted.

The layouts of older versions live here, and nowhere else: they are only ever
read, once.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from itertools import groupby, islice
from typing import TypeAlias

import lmdb

from ppmq.errors import StoreError
from ppmq.store.schema import (
    BODY_HEAD,
    CONVERTING_KEY,
    DTSM,
    FLIGHT_ENTRY,
    GROUP_MESSAGES,
    HOLDER,
    READY_ENTRY,
    READY_RUN,
    SCHEMA_VERSION,
    TM,
    TSM,
    TSPQ,
    U64,
    body_row_spans,
    encode_body_row,
    encode_holders_row,
)

log = logging.getLogger("ppmq.migrate")

_FLIGHT_1 = struct.Struct(">BQQI")  # schema 1: prio, pos, deadline_ns, attempts
_FLIGHT_2 = struct.Struct(">BQQIQ")  # schema 2: prio, pos, deadline_ns, attempts, publish_ns
_READY_3 = struct.Struct(">QI")  # schema 3 and before: a ready row per entry, M, attempts
_READY_CHUNK = 1 << 16  # ready rows converted in one transaction
# schema 3 and older: holders T M -> HOLDER entries, a row per message
_CONVERT_ROWS = 1 << 16  # old holders or bodies rows converted in one transaction, at most
# Bytes of old rows converted in one transaction, about: the pages a slice
# writes are new, and those of the rows it replaces are free for the slice
# after the next one (LMDB keeps the last commit's pages), so a conversion
# needs room for some three slices beside the store, well inside the headroom
# the map keeps beyond MaxStoreBytes (store/store.py).
CONVERT_BYTES = 4 << 20
# meta CONVERTING_KEY: the schema version of the step in progress and its part,
# followed by the key that part goes on from.
_CONVERTING = struct.Struct(">HB")

# A part of a step: converts its database's rows from key `start` on, a slice of
# them, in txn; returns the entries rewritten and the key to go on from in the
# next transaction, None once the database is done.
# (A string: lmdb's Transaction is generic in its stubs only.)
Part: TypeAlias = "Callable[[lmdb.Transaction[bytes], dict[str, lmdb._Database], bytes], tuple[int, bytes | None]]"


def _inflight_with_publish_ns(txn: lmdb.Transaction[bytes], dbs: dict[str, lmdb._Database], start: bytes) -> tuple[int, None]:
    """1 -> 2: an in-flight entry carries its message's publish time, so an ack
    is journaled without reading the message. In one slice: what is in flight
    is bounded by the subscribers' Windows."""
    rows = []
    with txn.cursor(db=dbs["inflight"]) as cur:
        for key, value in cur:
            t, _, m = TSM.unpack(key)
            body = txn.get(TM.pack(t, m), db=dbs["bodies"])
            publish_ns = BODY_HEAD.unpack_from(body)[1] if body is not None else 0
            rows.append((key, _FLIGHT_2.pack(*_FLIGHT_1.unpack(value), publish_ns)))
    for key, value in rows:
        txn.put(key, value, db=dbs["inflight"])
    return len(rows), None


def _inflight_by_batch(txn: lmdb.Transaction[bytes], dbs: dict[str, lmdb._Database], start: bytes) -> tuple[int, None]:
    """2 -> 3: the in-flight entries of a subscription become one row per batch.
    Which batch an entry came in is not stored in schema 2; entries with one
    AckRetry deadline were pushed together (or within the same step), so they
    make one batch. The deadline index is rebuilt to name the batches. In one
    slice, as 1 -> 2."""
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
    return sum(map(len, batches.values())), None


def _ready_as_runs(txn: lmdb.Transaction[bytes], dbs: dict[str, lmdb._Database], start: bytes) -> tuple[int, bytes | None]:
    """3 -> 4, first part: the ready rows of each (T, S, prio) become runs of
    READY_RUN entries, keyed by their first place (store/schema.py), _READY_CHUNK
    rows a slice: the runs written replace rows the slice read, and the next
    slice starts past them."""
    db = dbs["ready"]
    with txn.cursor(db=db) as cur:
        rows = list(islice(cur.iternext(), _READY_CHUNK)) if cur.set_range(start) else []
    if not rows:
        return 0, None
    for key, _ in rows:
        txn.delete(key, db=db)
    for _, queue in groupby(rows, key=lambda row: row[0][:7]):  # the rows of one (T, S, prio)
        entries = [(key, READY_ENTRY.pack(TSPQ.unpack(key)[3], *_READY_3.unpack(value))) for key, value in queue]
        for i in range(0, len(entries), READY_RUN):
            run = entries[i : i + READY_RUN]
            txn.put(run[0][0], b"".join(entry for _, entry in run), db=db)
    return len(rows), rows[-1][0] + b"\0"


def _holders_as_groups(txn: lmdb.Transaction[bytes], dbs: dict[str, lmdb._Database], start: bytes) -> tuple[int, bytes | None]:
    """3 -> 4, second part: the holders rows of a run of consecutive ids of a
    topic (up to GROUP_MESSAGES of them) become one row, keyed by the run's
    first id and written over that id's old row."""
    db, rewritten = dbs["holders"], 0
    runs, resume = _old_runs(txn, db, start)
    for run in runs:
        ids = [TM.unpack(key)[1] for key, _ in run]
        counts = [len(value) // HOLDER.size for _, value in run]
        txn.put(run[0][0], encode_holders_row(ids, counts, b"".join(value for _, value in run)), db=db)
        for key, _ in run[1:]:
            txn.delete(key, db=db)
        rewritten += len(run)
    return rewritten, resume


def _old_runs(txn: lmdb.Transaction[bytes], db: lmdb._Database, start: bytes) -> tuple[list[list[tuple[bytes, bytes]]], bytes | None]:
    """Runs of consecutive ids of one topic, at most GROUP_MESSAGES long, of the
    old rows from key `start` on, a slice of about _CONVERT_ROWS rows or
    CONVERT_BYTES; and the key to read on from (None: the end was reached). A
    slice cut short leaves its last run, which may go on, to the next, and ends
    one run or more; but a run that alone reaches CONVERT_BYTES ends the slice
    where it stands, and the next one begins the rest of it as a run of its own."""
    runs: list[list[tuple[bytes, bytes]]] = []
    size = run_size = 0  # bytes of the rows read, and of those of the last run
    with txn.cursor(db=db) as cur:
        if not cur.set_range(start):
            return runs, None
        for read, (key, value) in enumerate(cur):
            if read >= _CONVERT_ROWS or size >= CONVERT_BYTES:
                if run_size >= CONVERT_BYTES:
                    return runs, key
                if len(runs) > 1:
                    return runs[:-1], runs[-1][0][0]
            last = runs[-1][-1][0] if runs else b""
            if last[:4] == key[:4] and TM.unpack(last)[1] + 1 == TM.unpack(key)[1] and len(runs[-1]) < GROUP_MESSAGES:
                runs[-1].append((key, value))
                run_size += len(value)
            else:
                runs.append([(key, value)])
                run_size = len(value)
            size += len(value)
    return runs, None


def _bodies_as_groups(txn: lmdb.Transaction[bytes], dbs: dict[str, lmdb._Database], start: bytes) -> tuple[int, bytes | None]:
    """4 -> 5: the bodies of a run of consecutive ids of a topic (up to
    GROUP_MESSAGES of them, and BODY_ROW_BYTES as a publish would write them)
    become one row, keyed by the run's first id and written over that id's old
    row, whose value was one body's record."""
    db, rewritten = dbs["bodies"], 0
    runs, resume = _old_runs(txn, db, start)
    for run in runs:
        for a, b in body_row_spans([len(value) for _, value in run]):
            row = run[a:b]
            txn.put(row[0][0], encode_body_row([TM.unpack(key)[1] for key, _ in row], [value for _, value in row]), db=db)
            for key, _ in row[1:]:
                txn.delete(key, db=db)
        rewritten += len(run)
    return rewritten, resume


def _copies(txn: lmdb.Transaction[bytes], dbs: dict[str, lmdb._Database], start: bytes) -> tuple[int, bytes | None]:
    """5 -> 6: the databases `copies` and `copy_expiry` (store/schema.py) are new,
    and empty in a converted store: schema 5 gave no copy an expiry of its
    own (a PHPMQ re-queue changed the message's). Opening the store made them,
    so nothing is rewritten."""
    return 0, None


# STEPS[v]: the parts that convert a store of schema v to v + 1, in order.
STEPS: dict[int, tuple[Part, ...]] = {
    1: (_inflight_with_publish_ns,),
    2: (_inflight_by_batch,),
    3: (_ready_as_runs, _holders_as_groups),
    4: (_bodies_as_groups,),
    5: (_copies,),
}


def upgrade(env: lmdb.Environment, dbs: dict[str, lmdb._Database], path: str) -> bool:
    """Bring the store to SCHEMA_VERSION: a new one gets it; one an older ppmq
    wrote, or whose conversion a crash cut short, is converted, a slice per
    write transaction; True if anything was converted. A store newer than this
    ppmq, or of a version it never wrote, is refused untouched. LMDB's errors
    go on as they are (the store says what they mean)."""
    converted = False
    rewritten = 0  # entries rewritten by the step in progress, in this process
    while True:
        with env.begin(write=True) as txn:
            at = _resume_point(txn, dbs["meta"], path)
            if at is None:
                return converted
            version, part, start = at
            done, resume = STEPS[version][part](txn, dbs, start)
            rewritten += done
            finished = resume is None and part + 1 == len(STEPS[version])
            if resume is None:
                version, part, resume = (version + 1, 0, b"") if finished else (version, part + 1, b"")
            if version == SCHEMA_VERSION:
                txn.delete(CONVERTING_KEY, db=dbs["meta"])
            else:
                txn.put(CONVERTING_KEY, _CONVERTING.pack(version, part) + resume, db=dbs["meta"])
        converted = True
        if finished:
            log.warning("store %s converted from schema %d to %d (%d entries rewritten)", path, version - 1, version, rewritten)
            rewritten = 0


def _resume_point(txn: lmdb.Transaction[bytes], meta: lmdb._Database, path: str) -> tuple[int, int, bytes] | None:
    """Where the conversion goes on: the step (its version), its part and the
    key to start from; None if the store has this ppmq's schema, as a new store
    is given here. The first slice of a conversion marks the store with this
    ppmq's schema, so that an older ppmq refuses it from then on."""
    raw = txn.get(CONVERTING_KEY, db=meta)
    if raw is not None:
        version, part = _CONVERTING.unpack_from(raw) if len(raw) >= _CONVERTING.size else (0, 0)
        if version not in STEPS or part >= len(STEPS[version]):
            raise StoreError(f"store {path}: the record of its conversion names no step of this ppmq ({raw!r})")
        return version, part, raw[_CONVERTING.size :]
    found = txn.get(b"schema", db=meta)
    if found is None:
        txn.put(b"schema", b"%d" % SCHEMA_VERSION, db=meta)
        return None
    version = int(found) if found.isdigit() else -1
    if version == SCHEMA_VERSION:
        return None
    if version not in STEPS:
        raise StoreError(
            f"store {path} has schema {found.decode(errors='replace')}, this ppmq reads {SCHEMA_VERSION} and converts from {min(STEPS)}"
        )
    txn.put(b"schema", b"%d" % SCHEMA_VERSION, db=meta)
    return version, 0, b""
