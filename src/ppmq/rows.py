"""What every transaction on the store stands on: the databases, the way rows
are put in key order, and the meta records (the staging record among them).

Txn (store.py) is built on it in layers: QueueRows (queue_rows.py) for a
subscription's ready and in-flight rows, HolderRows (holder_rows.py) for who
holds each message, then the messages and their indexes.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from operator import itemgetter
from typing import TYPE_CHECKING

import lmdb

from .schema import STAGED, STAGING_KEY, TM, Staged

if TYPE_CHECKING:
    from .queue_rows import FlightWatch
    from .reader import StoreReader
    from .store import Store


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


class Rows:
    """The databases of one LMDB transaction."""

    def __init__(self, store: Store | StoreReader, txn: lmdb.Transaction) -> None:
        self.store = store
        self.txn = txn
        d = store.dbs
        self._bodies, self._holders, self._ready = d["bodies"], d["holders"], d["ready"]
        self._inflight, self._deadlines = d["inflight"], d["deadlines"]
        self._delayed, self._due = d["delayed"], d["due"]
        self._expiry, self._dedupe, self._meta = d["expiry"], d["dedupe"], d["meta"]
        self._staged: Staged | None | bool = False  # False: meta `staging` not read yet
        self._index = store.flight_index  # which inflight row holds a message (queue_rows.FlightIndex)
        self._tails = store.ready_tails  # ready queues kept in memory too (ready_tails.py)
        self._watch: FlightWatch | None = None  # what left flight to some subscriptions (queue_rows.FlightWatch)

    def _put_in_order(self, key: bytes, value: bytes, db: lmdb._Database) -> None:
        """Put a key that is usually the largest in its database so far.

        MDB_APPEND fills pages to the brim where LMDB would otherwise split them
        in half, which halves the disk and page cache a backlog takes; a key that
        is not the largest is refused by it, and then put the ordinary way.
        """
        if not self.txn.put(key, value, db=db, append=True):
            self.txn.put(key, value, db=db)

    def _put_all_in_order(self, items: list[tuple[bytes, bytes]], db: lmdb._Database) -> None:
        """`_put_in_order` for a whole batch in two calls at most: the entries
        above the database's last key are appended, the others (a batch of
        several priorities, most often) put the ordinary way."""
        items.sort()
        with self.txn.cursor(db=db) as cur:
            last = cur.key() if cur.last() else b""
            i = bisect_right(items, last, key=itemgetter(0))
            if i:
                cur.putmulti(items[:i])
            if i < len(items):
                cur.putmulti(items[i:], append=True)

    def _walk(self, db: lmdb._Database, prefix: bytes, start: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The rows of db from key `start` on, as long as their keys begin with `prefix`."""
        with self.txn.cursor(db=db) as cur:
            if cur.set_range(start):
                for key, value in cur:
                    if not key.startswith(prefix):
                        break
                    yield key, value

    # --- meta ---------------------------------------------------------------------
    def get_meta(self, name: bytes) -> bytes | None:
        return self.txn.get(name, db=self._meta)

    def put_meta(self, name: bytes, value: bytes) -> None:
        self.txn.put(name, value, db=self._meta)

    def delete_meta(self, name: bytes) -> None:
        self.txn.delete(name, db=self._meta)

    def meta_items(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The meta records whose names begin with prefix, by name."""
        return self._walk(self._meta, prefix, prefix)

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

    def staged_ids(self, staged: Staged, limit: int) -> list[int]:
        """Up to `limit` ids of stored messages in the staged range, lowest first."""
        out = []
        with self.txn.cursor(db=self._bodies) as cur:
            if cur.set_range(TM.pack(staged.t, staged.first)):
                for key in cur.iternext(values=False):
                    t, m = TM.unpack(key)
                    if t != staged.t or m > staged.last or len(out) >= limit:
                        break
                    out.append(m)
        return out
