"""How the tables of a transaction (store/tables.py) find and put rows: a
cursor on the row whose range holds a key, where rows tile a topic's ids
(bodies, holders) or a queue's places (ready runs); puts in key order; group
rows changed in one pass; walks of a key prefix. Plain functions over an LMDB
transaction or cursor, so that no table is built on another to share them.

Put in key order: a row whose key is usually the largest in its database so
far (a publish's bodies and holders rows, a batch's inflight row) is put with
`append=True` first, and the ordinary way when that is refused (its key is not
the largest). MDB_APPEND fills pages to the brim where LMDB would otherwise
split them in half, which halves the disk and page cache a backlog takes.

The calls every ack makes pass LMDB's arguments by position
(`get(key, None, db)`, `put(key, value, True, True, False, db)`,
`delete(key, b"", db)`): py-lmdb parses keyword arguments at a cost close to
the operation's own.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import Any

import lmdb

from ppmq.store.schema import TM

END = 1 << 64  # above every message id: the bound of a topic's last group row
# Changes a group row (raw) for the wanted ids in its range (ascending), given
# what its caller gives it (a subscriber, a tally): the new row, b"" when it
# empties, and the wanted ids that leave it or that it does not hold. The
# caller's part is an argument rather than bound in a partial, which costs
# more to make and to call than the change itself where a row holds one message.
Change = Callable[[Any, bytes, list[int]], tuple[bytes, list[int]]]


def floor_row(cur: lmdb.Cursor[bytes], key: bytes, prefix: int) -> bytes | None:
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


def at_row(cur: lmdb.Cursor[bytes], t: int, m: int) -> bool:
    """Put cur on the group row of t whose range holds m; False if t has none."""
    return floor_row(cur, TM.pack(t, m), 4) is not None


def next_row(cur: lmdb.Cursor[bytes], t: int) -> int:
    """The first id of the group row after cur's (END if it is t's last): where cur's range ends."""
    return TM.unpack(cur.key())[1] if cur.next() and TM.unpack(cur.key())[0] == t else END


def first_row(cur: lmdb.Cursor[bytes], t: int) -> int:
    """The key id of t's first group row (END if t has none)."""
    return TM.unpack(cur.key())[1] if cur.set_range(TM.pack(t, 0)) and TM.unpack(cur.key())[0] == t else END


def put_all_in_order(txn: lmdb.Transaction[bytes], items: list[tuple[bytes, bytes]], db: lmdb._Database) -> None:
    """Put a whole batch in key order in two calls at most: the entries
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


def change_rows(
    txn: lmdb.Transaction[bytes],
    db: lmdb._Database,
    t: int,
    ms: list[int],
    change: Change,
    given: Any,
    read: tuple[bytes, bytes | None] | None = None,
) -> list[int]:
    """Apply `change` to each group row of t in db (a database whose rows tile
    a topic's ids: holders, bodies) that ms (ascending, each once) fall in,
    with `given` and the ms in its range; return the ids it lets go, and those
    in no row's range.

    A row keyed by the id sought is read with a get, no cursor: the row of a
    publish's first message, which is every message's own row where a publish
    carries one; a cursor is opened only to find a row below the id, or where
    a row ends when ids are left after it. `read` is the key of ms[0] and
    what its get gave (None: no row has that key), where the caller made
    that get already."""
    out: list[int] = []
    if not ms:
        return out
    last, i, cur = ms[-1], 0, None
    while True:
        m = ms[i]
        if read is None:
            key = TM.pack(t, m)
            raw = txn.get(key, None, db)
        else:
            (key, raw), read = read, None
        if raw is not None and m == last:  # the last id left, in the row it begins
            j = None
        else:
            if cur is None:
                cur = txn.cursor(db=db)
            if floor_row(cur, key, 4) is None:  # below t's first row: no row holds these
                j = bisect_left(ms, first_row(cur, t), i)
                out += ms[i:j]
                if ms[j - 1] == last:
                    return out
                i = j
                continue
            key, raw = cur.item()
            # the last id left is in this row: no need to find where it ends
            j = None if m == last else bisect_left(ms, next_row(cur, t), i)
        new, gone = change(given, raw, ms[i:j])
        if new:
            txn.put(key, new, True, True, False, db)
        else:
            txn.delete(key, b"", db)
        out += gone
        if j is None or ms[j - 1] == last:
            return out
        i = j


def walk(txn: lmdb.Transaction[bytes], db: lmdb._Database, prefix: bytes, start: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The rows of db from key `start` on, as long as their keys begin with `prefix`."""
    with txn.cursor(db=db) as cur:
        if cur.set_range(start):
            for key, value in cur:
                if not key.startswith(prefix):
                    break
                yield key, value
