"""A subscription's ready queue, stored as runs of entries (store/schema.py `ready`).

A row per entry would cost a put per message and subscriber when a publish
finds its subscriber behind, and a delete per message when a batch takes it:
the path of every backlog. A run holds up to READY_RUN consecutive entries of
one priority, so a publish appends to the last run and writes a row per
READY_RUN entries beyond it, and a batch reads each run once and rewrites or
deletes it once. Entries that come back to their place (AckRetry, RECONNECT, a nack, a
delayed entry come due, a dedupe move) join the run that holds the place,
which splits once it grows past 2 x READY_RUN.

READY_RUN is 64: pushes and takes cost no less with longer runs, and a run of
64 (1.3 KiB) still shares a leaf page of LMDB's with others, where one of 128
and up takes an overflow page of its own (docs/performance.md, "Design choices
measured").

The invariant that lets a cursor find the run of a place (store/schema.py): a run's
entries ascend from its key on, and stay below the next run's key.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, groupby
from operator import itemgetter

import lmdb

from ppmq.store.meta import Meta
from ppmq.store.ready_tails import ReadyTails
from ppmq.store.rows import floor_row, put_all_in_order, walk
from ppmq.store.schema import READY_ENTRY, READY_RUN, TAKEN_PRIO, TS, TSPQ, U64, ReadyEntry, Staged, Taken, repeated

log = logging.getLogger("ppmq.store")
ENTRY = READY_ENTRY.size
_pos_m = itemgetter(2, 0)  # a Taken's (pos, m), as a ready entry begins
# What a walk does with an entry: leave it, take it (counted), delete it (not
# counted), or leave it and stop (the batch is full).
KEEP, TAKE, DROP, STOP = 0, 1, 2, 3


class ReadyQueues:
    """The ready database of one transaction: every subscription's ready queue."""

    __slots__ = ("txn", "db", "meta", "tails")

    def __init__(self, txn: lmdb.Transaction[bytes], db: lmdb._Database, meta: Meta, tails: ReadyTails) -> None:
        self.txn = txn
        self.db = db
        self.meta = meta  # the staging record: a publish being staged is hidden from walks
        self.tails = tails  # the queues kept in memory too, dropped when their rows change otherwise

    # --- entries in ---------------------------------------------------------------------
    def push(self, t: int, s: int, prio: int, pos: int, m: int, attempts: int) -> None:
        """An entry at its place, in the run that holds the place."""
        self.tails.drop(t, s)
        with self.txn.cursor(db=self.db) as cur:
            items = _joined(cur, t, s, prio, [(pos, m, attempts)])
        put_all_in_order(self.txn, items, self.db)

    def push_fresh(self, t: int, s: int, fresh: list[Taken], keep_tail: bool, start: bool) -> None:
        """Messages just published (their first deliveries, core/queues.py) into s's
        queue, after all it holds: with `keep_tail`, they start its tail
        (`start`: it holds nothing else) or join the one it has (store/ready_tails.py).
        No tail is kept while a publish is being staged, whose hidden entries
        the runs hold below the tail's, and which shows them all at once when
        it is whole."""
        fresh = sorted(fresh, key=TAKEN_PRIO)  # queue order: they come in position order, and the sort is stable
        if not keep_tail or self.meta.staged() is not None:
            self.tails.drop(t, s)
        elif start:
            self.tails.start(t, s, fresh)
        else:
            self.tails.extend(t, s, fresh)
        self._push_runs(t, s, ((prio, [(f[2], f[0], 0) for f in group]) for prio, group in groupby(fresh, key=TAKEN_PRIO)))

    def push_many(self, t: int, s: int, entries: list[tuple[int, int, int]]) -> None:
        """(prio, pos, m) entries, first attempts, into s's queue."""
        self.tails.drop(t, s)
        self._push_runs(t, s, ((prio, [(pos, m, 0) for _, pos, m in group]) for prio, group in groupby(sorted(entries), key=itemgetter(0))))

    def _push_runs(self, t: int, s: int, by_prio: Iterable[tuple[int, list[tuple[int, int, int]]]]) -> None:
        """Per priority, its (pos, m, attempts) entries in ascending pos: the run
        they join rewritten once, and a new run per READY_RUN entries past it."""
        items: list[tuple[bytes, bytes]] = []
        with self.txn.cursor(db=self.db) as cur:
            for prio, adds in by_prio:
                items += _joined(cur, t, s, prio, adds)
        put_all_in_order(self.txn, items, self.db)

    # --- single entries out -----------------------------------------------------------------
    def remove(self, t: int, s: int, prio: int, pos: int) -> bool:
        return self.pop(t, s, prio, pos) is not None

    def attempts(self, t: int, s: int, prio: int, pos: int) -> int | None:
        """Deliveries so far of the ready entry at (prio, pos), or None if there is none."""
        found = self._find(t, s, prio, pos)
        return None if found is None else READY_ENTRY.unpack_from(found[1], found[2] * ENTRY)[2]

    def restart(self, t: int, s: int, prio: int, pos: int) -> bool:
        """The ready entry at (prio, pos) starts its attempts anew where it is
        (a new version of its message took its place: PROTOCOL §3 Dedupe); its
        run is rewritten only if it had been delivered before. False if there
        is no such entry."""
        found = self._find(t, s, prio, pos)
        if found is None:
            return False
        key, raw, i = found
        at = i * ENTRY
        _, m, attempts = READY_ENTRY.unpack_from(raw, at)
        if attempts:
            self.tails.drop(t, s)
            self._rewrite(key, raw[:at] + READY_ENTRY.pack(pos, m, 0) + raw[at + ENTRY :])
        return True

    def pop(self, t: int, s: int, prio: int, pos: int) -> int | None:
        """Remove a ready entry; return its attempts so far, or None if there was none.
        Its run keeps its key, or goes with its last entry."""
        self.tails.drop(t, s)
        found = self._find(t, s, prio, pos)
        if found is None:
            return None
        key, raw, i = found
        self._rewrite(key, raw[: i * ENTRY] + raw[(i + 1) * ENTRY :])
        return READY_ENTRY.unpack_from(raw, i * ENTRY)[2]

    def _find(self, t: int, s: int, prio: int, pos: int) -> tuple[bytes, bytes, int] | None:
        """The run holding the entry at (prio, pos) and the entry's index in it; None if there is no such entry."""
        with self.txn.cursor(db=self.db) as cur:
            key = _run_at(cur, t, s, prio, pos)
            if key is None:
                return None
            raw = cur.value()
        i = bisect_left(range(len(raw) // ENTRY), pos, key=lambda i: U64.unpack_from(raw, i * ENTRY)[0])
        if i * ENTRY < len(raw) and U64.unpack_from(raw, i * ENTRY)[0] == pos:
            return key, raw, i
        return None

    def _rewrite(self, key: bytes, value: bytes) -> None:
        """A run with what is left of it; an emptied run goes."""
        if value:
            self.txn.put(key, value, db=self.db)
        else:
            self.txn.delete(key, db=self.db)

    # --- walks -------------------------------------------------------------------------------
    def pull(self, t: int, s: int, limit: int, take: Callable[[ReadyEntry], bool]) -> int:
        """Walk s's queue on t by priority then position, deleting each entry that
        `take` accepts, until `limit` are taken; return how many were taken.
        A staged publish's entries are left alone."""
        self.tails.drop(t, s)
        return self.take_runs(t, s, limit, lambda prio, pos, m, attempts: TAKE if take(ReadyEntry(prio, pos, m, attempts)) else KEEP)

    def take_runs(self, t: int, s: int, limit: int, choose: Callable[[int, int, int, int], int]) -> int:
        """Walk s's queue on t in order, asking `choose` (prio, pos, m, attempts) of
        each entry whether to KEEP, TAKE, DROP it or STOP there, until `limit` are
        taken; return how many were. Each run is read once, then rewritten or
        deleted once."""
        staged = self.meta.staged()
        first, last = (staged.first, staged.last) if staged is not None else (0, -1)  # the range staged hides
        taken = 0
        stop = False
        edits: list[tuple[bytes, bytes]] = []
        for prio, key, raw in self._walk_runs(t, s, (0, 0)):
            hidden = staged is not None and _hides_some(staged, t, raw)
            kept: list[bytes] = []
            at = 0
            for pos, m, attempts in READY_ENTRY.iter_unpack(raw):
                if taken == limit:
                    break
                what = KEEP if hidden and first <= pos <= last else choose(prio, pos, m, attempts)
                if what == STOP:
                    stop = True
                    break
                if what == KEEP:
                    kept.append(raw[at : at + ENTRY])
                else:
                    taken += what == TAKE
                at += ENTRY
            if len(kept) * ENTRY < at:
                edits.append((key, b"".join(kept) + raw[at:]))
            if taken == limit or stop:
                break
        for key, value in edits:
            self._rewrite(key, value)
        return taken

    def take_tail(self, t: int, s: int, limit: int, expired_at_ns: int, max_bytes: int = 0) -> list[Taken] | None:
        """Up to `limit` entries from the head of s's queue on t, as far as a
        batch of `max_bytes` holds them (0: no bound), taken from its
        tail (store/ready_tails.py) and their rows deleted; None, and no tail any more,
        if it has none, one of them may have expired at `expired_at_ns`, a staged
        publish may hide entries among its rows, or the rows do not hold exactly
        what the tail says (which would be a bug: logged)."""
        taken = None if self.meta.staged() is not None else self.tails.take(t, s, limit, expired_at_ns, max_bytes)
        if not taken:
            self.tails.drop(t, s)
            return None
        edits = self._head_runs(t, s, taken)
        if edits is None:
            log.error("store: the ready queue of topic %d subscriber %d is not what memory holds; read from its rows", t, s)
            self.tails.disagree(t, s)
            return None
        for key, value in edits:
            self._rewrite(key, value)
        return taken

    def _head_runs(self, t: int, s: int, taken: list[Taken]) -> list[tuple[bytes, bytes]] | None:
        """The rows to write (b"": delete) for the runs that hold `taken`, the
        head of s's queue on t, to hold them no more; None if the runs do not
        begin and end each run's part with the entries `taken` says."""
        edits: list[tuple[bytes, bytes]] = []
        for prio, group in groupby(taken, key=TAKEN_PRIO):
            want = list(group)
            start = TSPQ.pack(t, s, prio, 0)
            for key, raw in walk(self.txn, self.db, start[:7], start):
                n = min(len(raw) // ENTRY, len(want))
                first, last = READY_ENTRY.unpack_from(raw), READY_ENTRY.unpack_from(raw, (n - 1) * ENTRY)
                if first[:2] != _pos_m(want[0]) or last[:2] != _pos_m(want[n - 1]):
                    return None
                edits.append((key, raw[n * ENTRY :]))
                del want[:n]
                if not want:
                    break
            if want:
                return None
        return edits

    def of(self, t: int, s: int, start: tuple[int, int] = (0, 0)) -> Iterator[ReadyEntry]:
        """s's ready entries on t by place, from `start` (prio, pos) on, a staged
        publish's left out; reading only."""
        staged = self.meta.staged()
        for prio, _, raw in self._walk_runs(t, s, start):
            for pos, m, attempts in READY_ENTRY.iter_unpack(raw):
                if (prio, pos) >= start and (staged is None or not staged.hides(t, pos)):
                    yield ReadyEntry(prio, pos, m, attempts)

    def first(self, t: int, s: int, prio: int) -> ReadyEntry | None:
        """The head of s's queue of priority prio, a staged publish's entries left out."""
        entry = next(self.of(t, s, (prio, 0)), None)
        return entry if entry is not None and entry.prio == prio else None

    def _walk_runs(self, t: int, s: int, start: tuple[int, int]) -> Iterator[tuple[int, bytes, bytes]]:
        """(prio, key, value) of s's runs on t in queue order, from the run holding
        place `start` on. After a run a staged publish hides whole, the walk jumps
        to the run holding the staged range's last place: a publish being staged
        may be far longer than the queue in front of it."""
        prefix, staged = TS.pack(t, s), self.meta.staged()
        with self.txn.cursor(db=self.db) as cur:
            # no run holds a place before pos 0 but one keyed there, which set_range finds
            moved = (start[1] > 0 and _run_at(cur, t, s, *start) is not None) or cur.set_range(TSPQ.pack(t, s, *start))
            while moved and (key := cur.key())[:6] == prefix:
                raw = cur.value()
                yield key[6], key, raw
                if staged is not None and _hides_all(staged, t, raw):
                    moved = _run_at(cur, t, s, key[6], staged.last) != key or cur.next()
                else:
                    moved = cur.next()


def _run_at(cur: lmdb.Cursor[bytes], t: int, s: int, prio: int, pos: int) -> bytes | None:
    """Put cur on the run of (t, s, prio) that holds, or would hold, place pos:
    the one with the largest key at or below it. Its key; None when pos comes
    before the priority's first run (cur is then anywhere)."""
    return floor_row(cur, TSPQ.pack(t, s, prio, pos), 7)


def _joined(cur: lmdb.Cursor[bytes], t: int, s: int, prio: int, adds: list[tuple[int, int, int]]) -> list[tuple[bytes, bytes]]:
    """The rows to put for (pos, m, attempts) entries, sorted by pos, to join
    the runs of (t, s, prio): each run they fall in rewritten once, whatever the
    number joining it; those before the first run make runs of their own."""
    items: list[tuple[bytes, bytes]] = []
    i = 0
    while i < len(adds):
        key = _run_at(cur, t, s, prio, adds[i][0])
        raw = cur.value() if key is not None else b""
        moved = cur.next() if key is not None else cur.set_range(TSPQ.pack(t, s, prio, adds[i][0]))
        after = TSPQ.unpack(cur.key())[3] if moved and cur.key()[:7] == TSPQ.pack(t, s, prio, 0)[:7] else None
        j = len(adds) if after is None else bisect_left(adds, (after,), lo=i)
        items += _cut(t, s, prio, key, raw, adds[i:j], after is None)
        i = j
    return items


def _cut(
    t: int, s: int, prio: int, key: bytes | None, raw: bytes, adds: list[tuple[int, int, int]], last: bool
) -> list[tuple[bytes, bytes]]:
    """A run (key None: a new one) with `adds` in it, as rows: the run itself,
    then a new run per READY_RUN entries it grew past its limit. The last run of
    a priority, appended to by every publish, stops at READY_RUN (or where it
    was); another splits past 2 x READY_RUN."""
    appended = not raw or adds[0][0] > U64.unpack_from(raw, len(raw) - ENTRY)[0]
    if appended:
        body = raw + repeated(READY_ENTRY, len(adds)).pack(*chain.from_iterable(adds))
    else:
        merged = {e[0]: e for e in READY_ENTRY.iter_unpack(raw)} | {e[0]: e for e in adds}
        body = b"".join([READY_ENTRY.pack(*merged[pos]) for pos in sorted(merged)])
    size, run = len(body), READY_RUN * ENTRY
    if last and appended:
        keep = max(len(raw), run)
    else:
        keep = size if size <= 2 * run else run
    rows = [(key or TSPQ.pack(t, s, prio, adds[0][0]), body[:keep])]
    rows += [(TSPQ.pack(t, s, prio, U64.unpack_from(body, at)[0]), body[at : at + run]) for at in range(keep, size, run)]
    return rows


def _hides_some(staged: Staged, t: int, raw: bytes) -> bool:
    """Whether the staged range holds any place of the run `raw` of topic t."""
    return staged.t == t and U64.unpack_from(raw)[0] <= staged.last and U64.unpack_from(raw, len(raw) - ENTRY)[0] >= staged.first


def _hides_all(staged: Staged, t: int, raw: bytes) -> bool:
    """Whether the staged range holds every place of the run `raw` of topic t."""
    return staged.t == t and U64.unpack_from(raw)[0] >= staged.first and U64.unpack_from(raw, len(raw) - ENTRY)[0] <= staged.last
