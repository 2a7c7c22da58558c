"""The meta database: the store's named records (store/schema.py `meta`), the
staging record among them. A record is put with the transaction's own put
into this database (Txn.put_meta), which the counters' records take at every
step.

The staging record names the range a publish in progress hides
(core/staging.py): the walks of a delivery, an expiry or a drop ask for it at
every step, so it is read once and kept, across the writer's transactions,
until it is written again or writes are undone (Store.forget).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import lmdb

from ppmq.store.rows import walk
from ppmq.store.schema import STAGED, STAGING_KEY, Staged


class Meta:
    """The meta database of one transaction."""

    __slots__ = ("txn", "db", "_staged")

    def __init__(self, txn: lmdb.Transaction[bytes], db: lmdb._Database) -> None:
        self.txn = txn
        self.db = db
        self._staged: Staged | None | Literal[False] = False  # False: the staging record not read yet

    def get(self, name: bytes) -> bytes | None:
        return self.txn.get(name, db=self.db)

    def delete(self, name: bytes) -> None:
        self.txn.delete(name, db=self.db)

    def items(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The records whose names begin with prefix, by name."""
        return walk(self.txn, self.db, prefix, prefix)

    def staged(self) -> Staged | None:
        """The range a publish in progress hides, read once and kept (above)."""
        if self._staged is False:
            raw = self.txn.get(STAGING_KEY, db=self.db)
            self._staged = Staged._make(STAGED.unpack(raw)) if raw is not None else None
        return self._staged

    def put_staged(self, staged: Staged | None) -> None:
        if staged is None:
            self.txn.delete(STAGING_KEY, db=self.db)
        else:
            self.txn.put(STAGING_KEY, STAGED.pack(*staged), db=self.db)
        self._staged = staged

    def forget_staged(self) -> None:
        """Writes were undone, or may have changed the record: it is read again when asked for."""
        self._staged = False
