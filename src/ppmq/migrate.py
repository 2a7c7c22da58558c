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

import lmdb

from .schema import BODY_HEAD, FLIGHT, SCHEMA_VERSION, TM, TSM, StoreError

log = logging.getLogger(__name__)

_FLIGHT_1 = struct.Struct(">BQQI")  # schema 1: prio, pos, deadline_ns, attempts


def _inflight_with_publish_ns(txn: lmdb.Transaction, dbs: dict[str, lmdb._Database]) -> int:
    """1 -> 2: an in-flight entry carries its message's publish time, so an ack
    is journaled without reading the message. Returns the entries rewritten."""
    rows = []
    with txn.cursor(db=dbs["inflight"]) as cur:
        for key, value in cur:
            t, _, m = TSM.unpack(key)
            body = txn.get(TM.pack(t, m), db=dbs["bodies"])
            publish_ns = BODY_HEAD.unpack_from(body)[1] if body is not None else 0
            rows.append((key, FLIGHT.pack(*_FLIGHT_1.unpack(value), publish_ns)))
    for key, value in rows:
        txn.put(key, value, db=dbs["inflight"])
    return len(rows)


# STEPS[v] converts a store of schema v to v + 1.
STEPS: dict[int, Callable[[lmdb.Transaction, dict[str, lmdb._Database]], int]] = {
    1: _inflight_with_publish_ns,
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
