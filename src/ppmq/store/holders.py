"""Which subscribers still hold a message, and at which place in their queue:
the holders database, a row per group of messages (store/schema.py).

A publish's messages are held by the same subscribers, and an ack lets go of a
run of them; with a row per message, both cost a row operation per message and
subscriber. Here a publish writes a row per GROUP_MESSAGES of its messages, and
an ack reads, decodes and writes each row its messages are in once. Rows tile a
topic's ids, so the row of message m is the one with the largest key at or
below m: one cursor move finds it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from functools import cache
from itertools import accumulate, chain, islice
from struct import Struct

import lmdb

from ppmq.store.copies import Copies
from ppmq.store.rows import at_row, change_rows
from ppmq.store.schema import (
    GROUP_MESSAGES,
    HOLDER,
    ONE_HOLDERS_HEAD,
    TM,
    U16_BYTES,
    encode_holders_row,
    holders_columns,
    new_holders_row,
)

SIZE = HOLDER.size  # bytes of one (S, prio, pos) entry
ONE = ONE_HOLDERS_HEAD.size  # where the entries of a row of one message begin

Places = dict[int, tuple[int, int]]  # a message's holders: S -> (prio, pos), its place in S's queue


class Holders:
    """The holders database of one transaction. A copy's own expiry
    (store/copies.py) goes with the copy: with its subscriber's entry, when it
    leaves a message's holders."""

    __slots__ = ("txn", "db", "copies")

    def __init__(self, txn: lmdb.Transaction[bytes], db: lmdb._Database, copies: Copies) -> None:
        self.txn = txn
        self.db = db
        self.copies = copies

    def get(self, t: int, m: int) -> Places:
        with self.txn.cursor(db=self.db) as cur:
            if not at_row(cur, t, m):
                return {}
            raw = cur.value()
        ids, counts, base = holders_columns(raw)
        i = bisect_left(ids, m)
        if i == len(ids) or ids[i] != m:
            return {}
        start = base + SIZE * sum(counts[:i])
        return _decode(raw[start : start + SIZE * counts[i]])

    def put(self, t: int, m: int, holders: Places) -> None:
        """m's holders become `holders` (none: m leaves its row), and the copies
        of those that are no longer among them lose their own expiries. A
        message no row holds joins the row whose range it is in, or starts one
        below them."""
        with self.txn.cursor(db=self.db) as cur:
            key, raw = cur.item() if at_row(cur, t, m) else (TM.pack(t, m), None)
        if raw is None:
            ids, counts, entries = [], [], b""
        else:
            columns = holders_columns(raw)
            ids, counts, entries = list(columns[0]), list(columns[1]), raw[columns[2] :]
        i = bisect_left(ids, m)
        present = int(i < len(ids) and ids[i] == m)
        start = SIZE * sum(counts[:i])
        end = start + SIZE * counts[i] if present else start
        ids[i : i + present] = [m] if holders else []
        counts[i : i + present] = [len(holders)] if holders else []
        self._write_row(key, ids, counts, entries[:start] + _encode(holders) + entries[end:])
        own = self.copies.of_message(t, m)
        if own:
            for s in own.keys() - holders.keys():
                self.copies.drop(t, [m], s)

    def _write_row(self, key: bytes, ids: list[int], counts: list[int], entries: bytes) -> None:
        """Put a row, or delete it when empty; one that an insert took past
        GROUP_MESSAGES is split in two, its upper half keyed by its first id."""
        if not ids:
            self.txn.delete(key, db=self.db)
            return
        if len(ids) > GROUP_MESSAGES:
            half = len(ids) // 2
            cut = SIZE * sum(counts[:half])
            self._write_row(key[:4] + ids[half].to_bytes(8, "big"), ids[half:], counts[half:], entries[cut:])
            ids, counts, entries = ids[:half], counts[:half], entries[:cut]
        self.txn.put(key, encode_holders_row(ids, counts, entries), db=self.db)

    def put_new(self, t: int, subs: list[int], first: int, prios: Sequence[int]) -> None:
        """Every subscriber in subs holds each new message first, first + 1, ...,
        of priority prios[i], at its id as position. The ids are new, so above
        those of t's rows: they start rows of their own, GROUP_MESSAGES messages
        a row at most, each put in key order (store/rows.py), the way a
        publish's bodies rows are."""
        if not subs:
            return
        put, db = self.txn.put, self.db
        for i in range(0, len(prios), GROUP_MESSAGES):
            group = prios[i : i + GROUP_MESSAGES]
            key, row = TM.pack(t, first + i), new_holders_row(subs, first + i, group)
            if not put(key, row, True, True, True, db):  # by position (dupdata, overwrite, append, db): parsed for less
                put(key, row, True, True, False, db)

    def release(self, t: int, s: int, ms: list[int]) -> list[int]:
        """Remove s from the holders of each of ms, and its copies' own
        expiries; return, ascending, those nobody holds any more (and any no
        row holds). The path of every ack: each row is read, decoded and
        written once, however many of ms it holds. One message in a row of
        its own, as every message of a publish of one is, is let go of here,
        read by its head alone rather than by the rows' general change."""
        sub = U16_BYTES[s]
        done: list[int]  # those of ms nobody holds any more
        if len(ms) == 1:
            key, db = TM.pack(t, ms[0]), self.db
            raw = self.txn.get(key, None, db)
            if raw is not None:
                n, m, count = ONE_HOLDERS_HEAD.unpack_from(raw)
            if raw is not None and n == 1 and m == ms[0]:
                row = _release_one(sub, raw, count)
                if row:
                    self.txn.put(key, row, True, True, False, db)
                    done = []
                elif row is None:  # s does not hold it: nothing changes
                    done = []
                else:  # its last holder: the row goes
                    self.txn.delete(key, b"", db)
                    done = ms
            else:
                done = change_rows(self.txn, db, t, ms, _release, sub, (key, raw))
        else:
            done = change_rows(self.txn, self.db, t, sorted(set(ms)), _release, sub)
        if self.copies.seen.copies_seen:  # a copy's own expiry goes with its hold: none without copies
            self.copies.drop(t, ms, s)
        return done

    def pop(self, t: int, ms: list[int]) -> dict[int, Places]:
        """Remove ms from their rows; return the holders each had (none for one no row holds)."""
        popped: dict[int, Places] = {}
        change_rows(self.txn, self.db, t, sorted(set(ms)), _take, popped)
        return popped


def _bounds(counts: tuple[int, ...], base: int) -> tuple[list[int], islice]:
    """Where each message's entries begin, and where they end."""
    starts = list(accumulate(map(SIZE.__mul__, counts), initial=base))
    return starts, islice(starts, 1, None)


def _decode(entries: bytes) -> Places:
    return {s: (prio, pos) for s, prio, pos in HOLDER.iter_unpack(entries)}


def _encode(holders: Places) -> bytes:
    return b"".join([HOLDER.pack(s, prio, pos) for s, (prio, pos) in holders.items()])


def _row(ids: Sequence[int], counts: Sequence[int], entries: bytes) -> bytes:
    """A holders row; b"" for one of no message, which is deleted."""
    return encode_holders_row(ids, counts, entries) if ids else b""


def _take(popped: dict[int, Places], raw: bytes, wanted: list[int]) -> tuple[bytes, list[int]]:
    """`raw` without the messages `wanted`, whose holders go into popped."""
    ids, counts, base = holders_columns(raw)
    want, kept, kept_counts, entries = set(wanted), [], [], []
    for m, n, start, end in zip(ids, counts, *_bounds(counts, base)):
        if m in want:
            popped[m] = _decode(raw[start:end])
        else:
            kept.append(m)
            kept_counts.append(n)
            entries.append(raw[start:end])
    return _row(kept, kept_counts, b"".join(entries)), wanted


def _release(sub: bytes, raw: bytes, wanted: list[int]) -> tuple[bytes, list[int]]:
    """`raw` with subscriber `sub` (2 bytes) removed from each of `wanted`; and
    those of wanted that nobody holds any more, or that the row does not hold."""
    n, m, count = ONE_HOLDERS_HEAD.unpack_from(raw)
    if n == 1 and wanted == [m]:
        row = _release_one(sub, raw, count)
        if row is not None:
            return row, [] if row else wanted
    ids, counts, base = holders_columns(raw)
    run = _release_run(raw, sub, wanted, ids, counts, base)
    if run is not None:
        return run
    want, kept, kept_counts, entries, done = set(wanted), [], [], [], []
    for m, start, end in zip(ids, *_bounds(counts, base)):
        held = raw[start:end]
        if m in want:
            held = held[SIZE:] if held[:2] == sub else _without(held, sub)
            if not held:
                done.append(m)
                continue
        kept.append(m)
        kept_counts.append(len(held) // SIZE)
        entries.append(held)
    missing = want.difference(ids)
    if missing:
        done = sorted(done + list(missing))
    return _row(kept, kept_counts, b"".join(entries)), done


def _release_one(sub: bytes, raw: bytes, count: int) -> bytes | None:
    """`raw`, a row of one message that `count` subscribers hold, without
    subscriber sub's entry, read and written without its columns: b"" when
    sub was its last holder (the row goes), None when sub is not one."""
    place = raw.find(sub, ONE)
    if place >= 0 and (place - ONE) % SIZE:  # two bytes of another entry's fields: look on
        place = _place(raw, sub, place + 1, len(raw), ONE)
    if place < 0:
        return None
    if count == 1:
        return b""
    return raw[: ONE - 2] + U16_BYTES[count - 1] + raw[ONE:place] + raw[place + SIZE :]  # n and m as they were


def _release_run(
    raw: bytes, sub: bytes, wanted: list[int], ids: tuple[int, ...], counts: tuple[int, ...], base: int
) -> tuple[bytes, list[int]] | None:
    """`_release` without a step per message, for what an ack most often is: a
    run of the row's messages with as many holders each, `sub` at the same
    place among them. None if `wanted` is not such a run."""
    lo = bisect_left(ids, wanted[0])
    hi = lo + len(wanted)
    if ids[lo:hi] != tuple(wanted):
        return None
    n, each = counts[lo], SIZE * counts[lo]
    if counts[lo:hi].count(n) != hi - lo:
        return None
    start = base + SIZE * sum(counts[:lo])
    end = start + each * (hi - lo)
    place = _place(raw, sub, start, start + each)
    if place < 0 or raw[place:end:each] != sub[:1] * (hi - lo) or raw[place + 1 : end : each] != sub[1:] * (hi - lo):
        return None
    if n == 1:  # the run's last holder: it leaves the row (the whole row, often)
        return (b"" if hi - lo == len(ids) else _row(ids[:lo] + ids[hi:], counts[:lo] + counts[hi:], raw[base:start] + raw[end:])), wanted
    cut = _cutter(each, place - start)
    kept = b"".join(chain.from_iterable(cut.iter_unpack(raw[start:end])))
    return encode_holders_row(ids, counts[:lo] + (n - 1,) * (hi - lo) + counts[hi:], raw[base:start] + kept + raw[end:]), []


def _place(raw: bytes, sub: bytes, start: int, end: int, entries: int | None = None) -> int:
    """Where, among the entries between `entries` (start, if not given) and end,
    subscriber sub's begins, looking from start on; -1 if none."""
    first = start if entries is None else entries
    at = raw.find(sub, start, end)
    while at >= 0 and (at - first) % SIZE:  # two bytes of an entry's other fields
        at = raw.find(sub, at + 1, end)
    return at


@cache
def _cutter(each: int, at: int) -> Struct:
    """Splits `each` bytes of entries around the one at offset `at`, dropping it."""
    return Struct(f">{at}s{SIZE}x{each - at - SIZE}s")


def _without(held: bytes, sub: bytes) -> bytes:
    """A message's entries without subscriber sub's (unchanged if it has none)."""
    for i in range(0, len(held), SIZE):
        if held[i : i + 2] == sub:
            return held[:i] + held[i + SIZE :]
    return held
