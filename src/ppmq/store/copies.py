"""A copy's own expiry (PROTOCOL §9 PHPMQ re-queue): the copies and
copy_expiry databases (store/schema.py).

A message has one expiry, its body's, which every subscriber's copy of it
follows, except a copy that a PHPMQ re-queue gave one of its own while other
subscribers held the message too: that copy's row in `copies`, found by a walk
of the topic's few such rows when its subscriber takes a batch, and swept by
`copy_expiry`. The row goes with the copy (store/holders.py) and with the
message (store/messages.py). Almost no store has any, so each operation first
asks whether a copy may have one (the opener's `copies_seen`), and when none
may, looks no further: the paths of every ack and every batch ask.
"""

from __future__ import annotations

from typing import Protocol

import lmdb

from ppmq.store.rows import walk
from ppmq.store.schema import ETMS, TMS, U64, u32
from ppmq.store.timers import NONE_DUE, UNREAD, NextTimes, first_time


class Seen(Protocol):
    """Whether `copies` may have rows: a Store asks LMDB once and holds it true
    from a put on (a removal, or a put rolled back, leaves it true: looking
    then costs a little, never a wrong answer); a StoreReader always looks."""

    copies_seen: bool


class Copies:
    """The copies and copy_expiry databases of one transaction."""

    __slots__ = ("txn", "db", "expiry_db", "seen", "times")

    def __init__(self, txn: lmdb.Transaction[bytes], db: lmdb._Database, expiry_db: lmdb._Database, seen: Seen, times: NextTimes) -> None:
        self.txn = txn
        self.db = db
        self.expiry_db = expiry_db
        self.seen = seen
        self.times = times  # the soonest copy expiry, kept true by every write of copy_expiry (store/timers.py)

    def put(self, t: int, m: int, s: int, expires_ns: int, *, expire: bool) -> None:
        """Subscriber s's copy of m expires at expires_ns (0: never), whatever
        m's own expiry; swept then on an Expire topic."""
        self.drop(t, [m], s)
        self.seen.copies_seen = True
        self.txn.put(TMS.pack(t, m, s), U64.pack(expires_ns), db=self.db)
        if expire and expires_ns:
            self.txn.put(ETMS.pack(expires_ns, t, m, s), b"", db=self.expiry_db)
            if expires_ns < self.times.copy_expiry:
                self.times.copy_expiry = expires_ns

    def of_message(self, t: int, m: int) -> dict[int, int]:
        """The copies of m with an expiry of their own: subscriber id -> expires_ns."""
        if not self.seen.copies_seen:
            return {}
        prefix = TMS.pack(t, m, 0)[:-2]
        return {TMS.unpack(key)[2]: U64.unpack(value)[0] for key, value in walk(self.txn, self.db, prefix, prefix)}

    def of_subscriber(self, t: int, s: int) -> dict[int, int]:
        """s's copies on topic t with an expiry of their own: message id -> expires_ns."""
        if not self.seen.copies_seen:
            return {}
        prefix = u32(t)
        found = (TMS.unpack(key) + U64.unpack(value) for key, value in walk(self.txn, self.db, prefix, prefix))
        return {m: expires_ns for _, m, sub, expires_ns in found if sub == s}

    def drop(self, t: int, ms: list[int], s: int | None = None) -> None:
        """The copies of ms (of subscriber s only, if given) follow their message's expiry again."""
        if not self.seen.copies_seen:
            return  # the path of every ack, and of every message deleted
        for m in ms:
            for sub, expires_ns in self.of_message(t, m).items():
                if s is None or sub == s:
                    self.txn.delete(TMS.pack(t, m, sub), db=self.db)
                    self.txn.delete(ETMS.pack(expires_ns, t, m, sub), db=self.expiry_db)
                    if expires_ns == self.times.copy_expiry:
                        self.times.copy_expiry = UNREAD

    def due(self, now_ns: int, limit: int) -> list[tuple[int, int, int, int]]:
        """(expires_ns, t, m, s) of the copies whose own expiry is at or before now_ns, oldest first, `limit` at most."""
        out: list[tuple[int, int, int, int]] = []
        if not self.seen.copies_seen:
            return out
        with self.txn.cursor(db=self.expiry_db) as cur:
            if cur.first():
                for key in cur.iternext(values=False):
                    entry = ETMS.unpack(key)
                    if entry[0] > now_ns or len(out) >= limit:
                        break
                    out.append(entry)
        return out

    def next_ns(self) -> int | None:
        """When the soonest copy's own expiry comes; None if no copy has one."""
        if self.times.copy_expiry == UNREAD:
            self.times.copy_expiry = first_time(self.txn, self.expiry_db) if self.seen.copies_seen else NONE_DUE
        return self.times.copy_expiry if self.times.copy_expiry != NONE_DUE else None
