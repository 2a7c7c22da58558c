"""When each timer database's soonest entry comes due, kept in memory beside
the rows (`NextTimes`): expiry, copy_expiry, deadlines and due (store/schema.py),
whose keys all begin with the time (u64 ns).

Every step asks when it next needs to run, and a cursor on each of four
databases at every step would cost more than the timers of a topic that uses
none of them. So the soonest time of each is kept here, and the tables that
write those databases keep it true:

- a put of time x makes it x if x is sooner;
- a delete of the time it holds makes it unread (another entry may be due then
  too, or the next one later): the first key is read again when next asked;
- the store makes them all unread whenever writes are undone (Store.forget),
  as it drops the flight index and the ready tails.

UNREAD is below every time, so a put leaves an unread one unread; NONE_DUE is
above every time, so a put into an empty database makes it that put's time,
and the soonest of several is their min().
"""

from __future__ import annotations

import lmdb

from ppmq.store.schema import U64

UNREAD = -1  # the database's first key is to be read
NONE_DUE = 1 << 64  # the database is empty


class NextTimes:
    """The soonest time in each timer database (UNREAD, or NONE_DUE when empty)."""

    __slots__ = ("expiry", "copy_expiry", "deadline", "due")

    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        """Writes were undone: each is read again when asked."""
        self.expiry = self.copy_expiry = self.deadline = self.due = UNREAD


def first_time(txn: lmdb.Transaction[bytes], db: lmdb._Database) -> int:
    """The time of a timer database's first entry (the u64 its key begins with); NONE_DUE if it is empty."""
    with txn.cursor(db=db) as cur:
        return U64.unpack_from(cur.key())[0] if cur.first() else NONE_DUE
