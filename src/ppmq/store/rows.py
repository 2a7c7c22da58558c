"""What every transaction on the store stands on: the databases, the way rows
are put in key order, and the meta records (the staging record among them).

Txn (store/store.py) is built on it in layers: BodyRows (store/bodies.py) for the
messages, QueueRows (store/flights.py) for a subscription's ready and in-flight
rows, HolderRows (store/holders.py) for who holds each message, then the
messages' indexes.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import Protocol

import lmdb

from ppmq.store.flight_index import FlightIndex, FlightWatch
from ppmq.store.ready_tails import ReadyTails
from ppmq.store.schema import STAGED, STAGING_KEY, TM, Staged

END = 1 << 64  # above every message id: the bound of a topic's last group row
# Changes a group row (raw) for the wanted ids in its range (ascending): the new
# row, b"" when it empties, and the wanted ids that leave it or that it does not hold.
Change = Callable[[bytes, list[int]], tuple[bytes, list[int]]]


class Opened(Protocol):
    """What the rows of a transaction need of whatever opened it: a Store, or a StoreReader."""

    dbs: dict[str, lmdb._Database]
    flight_index: FlightIndex
    ready_tails: ReadyTails


def floor_row(cur: lmdb.Cursor, key: bytes, prefix: int) -> bytes | None:
    """Put cur on the row with the largest key at or below `key` among those
    sharing its first `prefix` bytes: the row whose range holds `key`, where a
    row stands for the keys up to the next one (ready runs, holders groups).
    Its key; None when there is none (cur is then anywhere)."""
    if cur.set_range(key):
        if cur.key() == key:
            return key
        moved = cur.prev()
    else:
        moved = cur.last()
    return cur.key() if moved and cur.key()[:prefix] == key[:prefix] else None


def at_row(cur: lmdb.Cursor, t: int, m: int) -> bool:
    """Put cur on the group row of t whose range holds m; False if t has none."""
    return floor_row(cur, TM.pack(t, m), 4) is not None


def next_row(cur: lmdb.Cursor, t: int) -> int:
    """The first id of the group row after cur's (END if it is t's last): where cur's range ends."""
    return TM.unpack(cur.key())[1] if cur.next() and TM.unpack(cur.key())[0] == t else END


def first_row(cur: lmdb.Cursor, t: int) -> int:
    """The key id of t's first group row (END if t has none)."""
    return TM.unpack(cur.key())[1] if cur.set_range(TM.pack(t, 0)) and TM.unpack(cur.key())[0] == t else END


def put_in_order(txn: lmdb.Transaction, key: bytes, value: bytes, db: lmdb._Database) -> None:
    """Put a key that is usually the largest in its database so far.

    MDB_APPEND fills pages to the brim where LMDB would otherwise split them
    in half, which halves the disk and page cache a backlog takes; a key that
    is not the largest is refused by it, and then put the ordinary way.
    """
    if not txn.put(key, value, db=db, append=True):
        txn.put(key, value, db=db)


def put_all_in_order(txn: lmdb.Transaction, items: list[tuple[bytes, bytes]], db: lmdb._Database) -> None:
    """`put_in_order` for a whole batch in two calls at most: the entries
    above the database's last key are appended, the others (a batch of
    several priorities, most often) put the ordinary way."""
    items.sort()
    with txn.cursor(db=db) as cur:
        last = cur.key() if cur.last() else b""
        i = bisect_right(items, last, key=itemgetter(0))
        if i:
            cur.putmulti(items[:i])
        if i < len(items):
            cur.putmulti(items[i:], append=True)


def change_rows(txn: lmdb.Transaction, db: lmdb._Database, t: int, ms: list[int], change: Change) -> list[int]:
    """Apply `change` to each group row of t in db (a database whose rows tile
    a topic's ids: holders, bodies) that ms (ascending) fall in, with the ms
    in its range; return the ids it lets go, and those in no row's range."""
    out: list[int] = []
    i = 0
    with txn.cursor(db=db) as cur:
        while i < len(ms):
            if at_row(cur, t, ms[i]):
                key, raw = cur.item()
                # the last id left is in this row: no need to find where it ends (an ack of one message)
                j = i + 1 if i + 1 == len(ms) else bisect_left(ms, next_row(cur, t), i)
                new, gone = change(raw, ms[i:j])
                if new:
                    txn.put(key, new, db=db)
                else:
                    txn.delete(key, db=db)
                out += gone
            else:  # below t's first row: no row holds these
                j = bisect_left(ms, first_row(cur, t), i)
                out += ms[i:j]
            i = j
    return out


def walk(txn: lmdb.Transaction, db: lmdb._Database, prefix: bytes, start: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The rows of db from key `start` on, as long as their keys begin with `prefix`."""
    with txn.cursor(db=db) as cur:
        if cur.set_range(start):
            for key, value in cur:
                if not key.startswith(prefix):
                    break
                yield key, value


class Rows:
    """The databases of one LMDB transaction."""

    def __init__(self, store: Opened, txn: lmdb.Transaction) -> None:
        self.store = store
        self.txn = txn
        d = store.dbs
        self._bodies, self._holders, self._ready = d["bodies"], d["holders"], d["ready"]
        self._inflight, self._deadlines = d["inflight"], d["deadlines"]
        self._delayed, self._due = d["delayed"], d["due"]
        self._expiry, self._dedupe, self._meta = d["expiry"], d["dedupe"], d["meta"]
        self._copies, self._copy_expiry = d["copies"], d["copy_expiry"]
        self._staged: Staged | None | bool = False  # False: meta `staging` not read yet
        self._index = store.flight_index  # which inflight row holds a message (queue_rows.FlightIndex)
        self._tails = store.ready_tails  # ready queues kept in memory too (store/ready_tails.py)
        self._watch: FlightWatch | None = None  # what left flight to some subscriptions (queue_rows.FlightWatch)

    # --- meta ---------------------------------------------------------------------
    def get_meta(self, name: bytes) -> bytes | None:
        return self.txn.get(name, db=self._meta)

    def put_meta(self, name: bytes, value: bytes) -> None:
        self.txn.put(name, value, db=self._meta)

    def delete_meta(self, name: bytes) -> None:
        self.txn.delete(name, db=self._meta)

    def meta_items(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The meta records whose names begin with prefix, by name."""
        return walk(self.txn, self._meta, prefix, prefix)

    # --- the staging record ------------------------------------------------------
    def staged(self) -> Staged | None:
        """The range a publish in progress hides, read once per transaction: the
        walks below ask for it at every step."""
        if self._staged is False:
            raw = self.get_meta(STAGING_KEY)
            self._staged = Staged._make(STAGED.unpack(raw)) if raw is not None else None
        return self._staged

    def put_staged(self, staged: Staged | None) -> None:
        if staged is None:
            self.txn.delete(STAGING_KEY, db=self._meta)
        else:
            self.put_meta(STAGING_KEY, STAGED.pack(*staged))
        self._staged = staged
