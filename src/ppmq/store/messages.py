"""Messages with their indexes: the expiry and dedupe databases
(store/schema.py), kept with the bodies (store/bodies.py) and the copies' own
expiries (store/copies.py).

The rule that ties them together lives here: a message put, replaced or
deleted takes its expiry and dedupe entries with it, and a message replaced
or deleted takes its copies' own expiries (a new version's expiry is every
copy's again).
"""

from __future__ import annotations

from collections.abc import Sequence

import lmdb

from ppmq.store.bodies import Bodies
from ppmq.store.copies import Copies
from ppmq.store.meta import Meta
from ppmq.store.ready_tails import ReadyTails
from ppmq.store.schema import ETM, U64, Body, body_records, u32
from ppmq.store.timers import NONE_DUE, UNREAD, NextTimes, first_time


class Messages:
    """The expiry and dedupe databases of one transaction, and the operations
    that keep a message's body, its index entries and its copies' own expiries
    together."""

    __slots__ = ("txn", "expiry_db", "dedupe_db", "bodies", "copies", "meta", "tails", "times")

    def __init__(
        self,
        txn: lmdb.Transaction[bytes],
        expiry_db: lmdb._Database,
        dedupe_db: lmdb._Database,
        bodies: Bodies,
        copies: Copies,
        meta: Meta,
        tails: ReadyTails,
        times: NextTimes,
    ) -> None:
        self.txn = txn
        self.expiry_db = expiry_db
        self.dedupe_db = dedupe_db
        self.bodies = bodies
        self.copies = copies
        self.meta = meta  # the staging record: a publish being staged is left out of the sweep
        self.tails = tails  # the ready queues kept in memory, bodies included: a new version is not in them
        self.times = times  # the soonest expiry, kept true by every write of the expiry index (store/timers.py)

    def put(
        self,
        t: int,
        first: int,
        prios: Sequence[int],
        publish_ns: int,
        expiries: Sequence[int],
        keys: Sequence[bytes],
        fragments: Sequence[bytes],
        *,
        dedupe: bool,
        expire: bool,
    ) -> None:
        """New messages, ids first, first + 1, ..., from their publish's columns:
        their records (schema.body_records) and, from the same columns, their
        index entries: the dedupe key of each on a Dedupe topic, its expiry on
        an Expire topic."""
        self.bodies.put_records(t, first, body_records(prios, publish_ns, expiries, keys, fragments))
        if dedupe:
            ids = range(first, first + len(keys))
            with self.txn.cursor(db=self.dedupe_db) as cur:
                cur.putmulti(zip(map(u32(t).__add__, keys), map(U64.pack, ids)))
        if expire and any(expiries):
            with self.txn.cursor(db=self.expiry_db) as cur:
                cur.putmulti([(ETM.pack(expires_ns, t, m), b"") for m, expires_ns in enumerate(expiries, first) if expires_ns])
            self.times.expiry = min(self.times.expiry, *filter(None, expiries))

    def replace(self, t: int, m: int, body: Body, *, expire: bool) -> Body | None:
        """A new version of m (its dedupe key is the same), whose expiry every
        copy follows; returns the old one."""
        self.tails.drop_topic(t)
        old = self.bodies.put(t, m, body)
        if old is not None and old.expires_ns:
            self.remove_expiry(old.expires_ns, t, m)
        if expire and body.expires_ns:
            self.add_expiry(body.expires_ns, t, m)
        self.copies.drop(t, [m])
        return old

    def delete(self, t: int, ms: list[int], *, dedupe: bool) -> tuple[int, int]:
        """Delete each of ms with its index entries; return how many were stored
        and the bytes of their delivered JSON, which is all the counters need."""
        popped = self.bodies.pop(t, ms, keys=dedupe)
        if popped.expiries:  # the index entries of a message that has none cost nothing
            delete, expiry, pack, times = self.txn.delete, self.expiry_db, ETM.pack, self.times
            for expires_ns, m in popped.expiries:
                delete(pack(expires_ns, t, m), b"", expiry)
                if expires_ns == times.expiry:
                    times.expiry = UNREAD
        if popped.keys:
            delete, prefix, dedupe_db = self.txn.delete, u32(t), self.dedupe_db
            for key in popped.keys:
                delete(prefix + key, b"", dedupe_db)
        if self.copies.seen.copies_seen:  # a deleted message's copies' own expiries go with it
            self.copies.drop(t, ms)
        return popped.count, popped.size

    # --- expiry index ---------------------------------------------------------------
    def add_expiry(self, expires_ns: int, t: int, m: int) -> None:
        self.txn.put(ETM.pack(expires_ns, t, m), b"", db=self.expiry_db)
        if expires_ns < self.times.expiry:
            self.times.expiry = expires_ns

    def remove_expiry(self, expires_ns: int, t: int, m: int) -> None:
        self.txn.delete(ETM.pack(expires_ns, t, m), db=self.expiry_db)
        if expires_ns == self.times.expiry:
            self.times.expiry = UNREAD

    def due_expiries(self, now_ns: int, limit: int) -> list[tuple[int, int, int]]:
        """(expires_ns, t, m) with expires_ns <= now_ns, oldest first, among the first
        `limit` due entries. Those of a staged publish count toward the limit but are
        left out: they wait (a delivery still checks expiry) rather than let one
        sweep read a whole staged publish."""
        out = []
        staged = self.meta.staged()
        seen = 0
        with self.txn.cursor(db=self.expiry_db) as cur:
            if cur.first():
                for key in cur.iternext(values=False):
                    entry = ETM.unpack(key)
                    if entry[0] > now_ns or seen >= limit:
                        break
                    seen += 1
                    if staged is None or not staged.hides(entry[1], entry[2]):
                        out.append(entry)
        return out

    def next_expiry_ns(self) -> int | None:
        """When the soonest message expires; None if none does."""
        if self.times.expiry == UNREAD:
            self.times.expiry = first_time(self.txn, self.expiry_db)
        return self.times.expiry if self.times.expiry != NONE_DUE else None

    # --- dedupe index -----------------------------------------------------------------
    def dedupe_id(self, t: int, key: bytes) -> int | None:
        """The newest message of topic t stored under key, if any."""
        raw = self.txn.get(u32(t) + key, db=self.dedupe_db)
        return U64.unpack(raw)[0] if raw is not None else None

    def dedupe_ids(self, t: int, keys: list[bytes | None]) -> list[int | None]:
        """dedupe_id of each key (None for a None key), in one pass: what a
        publish or an ack of a Dedupe topic looks up a message."""
        prefix, get, db, unpack = u32(t), self.txn.get, self.dedupe_db, U64.unpack
        found = [None if key is None else get(prefix + key, db=db) for key in keys]
        return [None if raw is None else unpack(raw)[0] for raw in found]
