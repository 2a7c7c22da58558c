"""A subscription's delayed entries (PROTOCOL §8 Delay, NotBefore, nacks with a
Delay): queue entries that keep their place but are not to be delivered before
their due time.

They live apart from the ready rows, so that a batch's walk of the ready queue
never steps over entries it may not take, and a topic that delays nothing pays
nothing for them. The `due` index orders them by time; the timer moves each into
the ready queue, at its place, when it comes due.
"""

from __future__ import annotations

from collections.abc import Iterator

import lmdb

from ppmq.store.rows import walk
from ppmq.store.schema import DELAYED_VAL, DUE, TS, TSPQ, Delayed
from ppmq.store.timers import NONE_DUE, UNREAD, NextTimes, first_time


class DelayedEntries:
    """The delayed and due databases of one transaction."""

    __slots__ = ("txn", "db", "due_db", "times")

    def __init__(self, txn: lmdb.Transaction[bytes], db: lmdb._Database, due_db: lmdb._Database, times: NextTimes) -> None:
        self.txn = txn
        self.db = db
        self.due_db = due_db
        self.times = times  # the soonest due time, kept true by every write of due (store/timers.py)

    def push(self, t: int, s: int, entry: Delayed) -> None:
        self.txn.put(TSPQ.pack(t, s, entry.prio, entry.pos), DELAYED_VAL.pack(entry.msg, entry.attempts, entry.due_ns), db=self.db)
        self.txn.put(DUE.pack(entry.due_ns, t, s, entry.prio, entry.pos), b"", db=self.due_db)
        if entry.due_ns < self.times.due:
            self.times.due = entry.due_ns

    def pop(self, t: int, s: int, prio: int, pos: int) -> Delayed | None:
        """Remove the delayed entry at (prio, pos), with its due entry."""
        raw = self.txn.pop(TSPQ.pack(t, s, prio, pos), db=self.db)
        if raw is None:
            return None
        m, attempts, due_ns = DELAYED_VAL.unpack(raw)
        self.txn.delete(DUE.pack(due_ns, t, s, prio, pos), db=self.due_db)
        if due_ns == self.times.due:
            self.times.due = UNREAD
        return Delayed(prio, pos, m, attempts, due_ns)

    def of(self, t: int, s: int, start: tuple[int, int] = (0, 0)) -> Iterator[Delayed]:
        """s's delayed entries on t by place, from `start` (prio, pos) on."""
        for key, raw in walk(self.txn, self.db, TS.pack(t, s), TSPQ.pack(t, s, *start)):
            _, _, prio, pos = TSPQ.unpack(key)
            yield Delayed(prio, pos, *DELAYED_VAL.unpack(raw))

    def due(self, now_ns: int, limit: int) -> list[tuple[int, int, int, int]]:
        """Up to `limit` (t, s, prio, pos) of delayed entries due at now_ns, earliest first."""
        out: list[tuple[int, int, int, int]] = []
        with self.txn.cursor(db=self.due_db) as cur:
            if cur.first():
                for key in cur.iternext(values=False):
                    due_ns, t, s, prio, pos = DUE.unpack(key)
                    if due_ns > now_ns or len(out) >= limit:
                        break
                    out.append((t, s, prio, pos))
        return out

    def next_due_ns(self) -> int | None:
        """When the soonest delayed entry comes due; None if none waits."""
        if self.times.due == UNREAD:
            self.times.due = first_time(self.txn, self.due_db)
        return self.times.due if self.times.due != NONE_DUE else None
