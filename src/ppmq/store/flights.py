"""The batches in flight to each subscription: the inflight and deadlines
databases (store/schema.py), a row per batch pushed, and the walk that takes
a batch from a ready queue (store/ready.py) into flight, its messages read from
their bodies rows (store/bodies.py).

Only a Queue (core/queues.py) changes them, with the counters that count them; the
state machine's other parts read them through it, and fsck through store/reader.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from itertools import repeat

import lmdb

from ppmq.store.bodies import Bodies, BodyFinder
from ppmq.store.flight_index import FlightIndex, FlightWatch, SubFlights
from ppmq.store.ready import DROP, KEEP, STOP, TAKE, ReadyQueues
from ppmq.store.rows import walk
from ppmq.store.schema import BATCH_ENTRY_BYTES, BODY_HEAD, DTSM, FLIGHT_ENTRY, TAKEN_FLIGHT, TAKEN_M, TS, TSM, U64, Flight, Taken
from ppmq.store.timers import NONE_DUE, UNREAD, NextTimes, first_time

log = logging.getLogger("ppmq.store")
HEAD = U64.size  # an inflight row's deadline_ns, before its entries
NO_DEADLINE = bytes(HEAD)  # the deadline_ns of a batch with no AckRetry


class Flights:
    """The inflight and deadlines databases of one transaction, and the walk that
    moves ready entries into flight."""

    __slots__ = ("txn", "db", "deadlines_db", "ready", "bodies", "index", "times", "watching")

    def __init__(
        self,
        txn: lmdb.Transaction[bytes],
        db: lmdb._Database,
        deadlines_db: lmdb._Database,
        ready: ReadyQueues,
        bodies: Bodies,
        index: FlightIndex,
        times: NextTimes,
    ) -> None:
        self.txn = txn
        self.db = db
        self.deadlines_db = deadlines_db
        self.ready = ready  # where a batch is taken from
        self.bodies = bodies  # what a batch taken from the ready rows reads
        self.index = index  # which row holds each message in flight, kept in memory across transactions
        self.times = times  # the soonest deadline, kept true by every write of deadlines (store/timers.py)
        self.watching: FlightWatch | None = None  # what left flight to some subscriptions, if asked

    def take_ready(
        self,
        t: int,
        s: int,
        limit: int,
        deadline_ns: int,
        expired_at_ns: int,
        own_expiry: dict[int, int] | None = None,
        max_bytes: int = 0,
    ) -> tuple[list[Taken], list[int], list[int]]:
        """A batch for s: up to `limit` entries of its queue on t, by priority then
        position, as far as a batch of `max_bytes` holds them (0: no bound),
        moved into flight with the AckRetry deadline `deadline_ns`.
        Returns what was taken; the ids of messages expired at `expired_at_ns`
        (0: none expire), left where they are; and the priorities of entries
        whose message is missing (a damaged store), deleted. A message in
        `own_expiry` (id -> expires_ns, store/schema.py `copies`) is judged, and
        taken, with that expiry rather than its body's. One walk of the
        ready runs and one in-flight row: the path of every backlog."""
        taken = self.ready.take_tail(t, s, limit, expired_at_ns, max_bytes)
        if taken is not None:  # the queue was in memory too: its bodies are not read
            self._into_flight(t, s, taken, deadline_ns)
            return taken, [], []
        head_size, head, entry = BODY_HEAD.size, BODY_HEAD.unpack_from, FLIGHT_ENTRY.pack
        taken = []
        expired: list[int] = []
        missing: list[int] = []
        room = max_bytes  # left in the batch, when bounded

        def choose(prio: int, pos: int, m: int, attempts: int) -> int:
            nonlocal room
            found = find(m)
            if found is None:
                missing.append(prio)
                return DROP
            raw, start, end = found
            _, publish_ns, expires_ns, klen = head(raw, start)
            if own_expiry:
                expires_ns = own_expiry.get(m, expires_ns)
            if 0 < expires_ns <= expired_at_ns:
                expired.append(m)
                return KEEP
            if max_bytes:
                room -= end - start - head_size - klen + BATCH_ENTRY_BYTES
                if taken and room < 0:
                    return STOP
            attempts += 1  # this delivery
            flight = entry(m, prio, pos, attempts, publish_ns)
            taken.append((m, prio, pos, attempts, publish_ns, raw[start + head_size + klen : end], flight, expires_ns))
            return TAKE

        with self.bodies.cursor() as cur:
            find = BodyFinder(cur, t).find
            self.ready.take_runs(t, s, limit, choose)
        self._into_flight(t, s, taken, deadline_ns)
        return taken, expired, missing

    def _into_flight(self, t: int, s: int, taken: list[Taken], deadline_ns: int) -> None:
        if taken:
            self.put(t, s, list(map(TAKEN_FLIGHT, taken)), deadline_ns, list(map(TAKEN_M, taken)))

    # --- in flight --------------------------------------------------------------------
    def watch(self, watch: FlightWatch) -> None:
        """From now on, note in `watch` what leaves flight to its subscriptions."""
        self.watching = watch

    def _read_flights(self, t: int, s: int) -> SubFlights:
        """The index of s's batches in flight on t, from its rows, now in the index."""
        flights = self.index.subs[t, s] = SubFlights()
        prefix = TS.pack(t, s)
        for key, raw in walk(self.txn, self.db, prefix, prefix):
            ms = [entry[0] for entry in FLIGHT_ENTRY.iter_unpack(raw[HEAD:])]
            flights.where.update(zip(ms, repeat(key)))
            flights.batches[key] = (ms, raw[:HEAD])
            flights.next_f = TSM.unpack(key)[2] + 1
        return flights

    def _of(self, t: int, s: int) -> SubFlights:
        """The index of s's batches in flight on t."""
        return self.index.subs.get((t, s)) or self._read_flights(t, s)

    def _rows(self, t: int, s: int) -> Iterator[tuple[int, int, bytes]]:
        """(F, deadline_ns, value) of every batch in flight to s on t."""
        prefix = TS.pack(t, s)
        for key, raw in walk(self.txn, self.db, prefix, prefix):
            yield TSM.unpack(key)[2], U64.unpack_from(raw)[0], raw

    def put(self, t: int, s: int, entries: list[bytes], deadline_ns: int, ms: list[int]) -> None:
        """A pushed batch into flight to s: entries (FLIGHT_ENTRY, packed) of the
        messages ms, with the AckRetry deadline `deadline_ns` (0: none). One row,
        and one deadline row, whatever the batch's size; put in key order
        (store/rows.py), since a subscription's batches are numbered upward.
        The index keeps `ms` itself, a list the caller made for it."""
        try:  # _of's, without a call of its own: every push comes here
            flights = self.index.subs[t, s]
        except KeyError:
            flights = self._read_flights(t, s)
        f = flights.next_f
        flights.next_f = f + 1
        head = U64.pack(deadline_ns) if deadline_ns else NO_DEADLINE
        key, row, put = TSM.pack(t, s, f), head + b"".join(entries), self.txn.put
        if not put(key, row, True, True, True, self.db):  # by position (dupdata, overwrite, append, db): parsed for less
            put(key, row, True, True, False, self.db)
        flights.where |= zip(ms, repeat(key))
        flights.batches[key] = (ms, head)
        if self.watching is not None:
            self.watching.note(False, t, s, ms)
        if deadline_ns:
            put(DTSM.pack(deadline_ns, t, s, f), b"", True, True, False, self.deadlines_db)
            if deadline_ns < self.times.deadline:
                self.times.deadline = deadline_ns

    def pop_many(self, t: int, s: int, ms: list[int]) -> list[tuple[int, int, int, int, int] | None]:
        """Take each of ms out of flight to s; per m, its Flight fields as a plain
        tuple, or None if it was not in flight or was named before. One row read
        and rewritten or deleted per batch touched, whatever the number of
        messages."""
        flights = self._of(t, s)
        return self._pop_located(flights, t, s, ms, list(map(flights.where.pop, ms, repeat(None))))

    def ack(self, t: int, s: int, ms: list[int]) -> list[int]:
        """Take each of ms out of flight to s; return those that were, each once,
        in the order of ms (ms itself when all were). An ack of one whole batch
        in its order, what an ack mostly is, deletes its row unread: the index
        says that the row holds just these."""
        try:  # _of's, without a call of its own: every ack comes here
            flights = self.index.subs[t, s]
        except KeyError:
            flights = self._read_flights(t, s)
        where, batches = flights.where, flights.batches
        try:
            key = where[ms[0]]
            held, head = batches[key]
        except (IndexError, KeyError):  # no message named, or the first not in flight
            held = None
        if ms == held:  # all of one batch: the row goes whole
            for m in ms:
                del where[m]
            del batches[key]
            self.txn.delete(key, b"", self.db)
            if head != NO_DEADLINE:
                self._drop_deadline(key, head)
            if self.watching is not None:
                self.watching.note(True, t, s, ms)
            return ms
        rows = list(map(where.pop, ms, repeat(None)))
        return [entry[0] for entry in self._pop_located(flights, t, s, ms, rows) if entry is not None]

    def _pop_located(
        self, flights: SubFlights, t: int, s: int, ms: list[int], rows: list[bytes | None]
    ) -> list[tuple[int, int, int, int, int] | None]:
        """pop_many of ms, whose batch rows are keyed `rows`, taken out of
        flights.where already (None for one not in flight, or named before)."""
        wanted: dict[bytes, dict[int, int]] = {}  # a batch row's key -> {m: its index in ms}
        one = _one_batch(rows)
        if one is not None:
            wanted[one] = dict(zip(ms, range(len(ms))))  # all of one batch, no step per message
        else:
            for i, (m, key) in enumerate(zip(ms, rows)):
                if key is not None:
                    wanted.setdefault(key, {})[m] = i
        if self.watching is not None:
            self.watching.note(True, t, s, [m for found in wanted.values() for m in found])
        out: list[tuple[int, int, int, int, int] | None] = [None] * len(ms)
        for key, found in wanted.items():
            self._take_from_row(flights, key, found, out)
        return out

    def _take_from_row(self, flights: SubFlights, key: bytes, found: dict[int, int], out: list) -> None:
        """The messages `found` (m -> index in out) leave the batch row keyed
        `key`: their entries go into out, and the row keeps the others or goes
        with its deadline."""
        raw = self.txn.get(key, db=self.db)
        if raw is None:
            flights.batches.pop(key, None)
            t, s, f = TSM.unpack(key)
            log.error("store: batch %d in flight to subscriber %d of topic %d is indexed but not stored", f, s, t)
            return
        size, kept, kept_ms = FLIGHT_ENTRY.size, [], []
        for n, entry in enumerate(FLIGHT_ENTRY.iter_unpack(raw[HEAD:])):
            i = found.get(entry[0])
            if i is None:
                kept.append(raw[HEAD + n * size : HEAD + (n + 1) * size])
                kept_ms.append(entry[0])
            else:
                out[i] = entry
        if kept:
            self.txn.put(key, raw[:HEAD] + b"".join(kept), db=self.db)
            flights.batches[key] = (kept_ms, raw[:HEAD])
            return
        flights.batches.pop(key, None)
        self.txn.delete(key, db=self.db)
        if raw[:HEAD] != NO_DEADLINE:
            self._drop_deadline(key, raw)

    def _drop_deadline(self, key: bytes, raw: bytes) -> None:
        """Delete the deadline of the batch row keyed `key`, which held `raw`
        (or its head: a deadline_ns not 0): its deadlines key is that
        deadline_ns, then `key`."""
        deadline_ns = U64.unpack_from(raw)[0]
        self.txn.delete(raw[:HEAD] + key, b"", self.deadlines_db)
        if deadline_ns == self.times.deadline:
            self.times.deadline = UNREAD

    def retime(self, t: int, s: int, ms: list[int], deadline_ns: int) -> list[int]:
        """PROTOCOL §8 Touch: ms (those in flight to s) get the AckRetry deadline
        `deadline_ns`, together in a batch row of their own; returns those that were."""
        entries = [e for e in self.pop_many(t, s, ms) if e is not None]
        if entries:
            self.put(t, s, [FLIGHT_ENTRY.pack(*e) for e in entries], deadline_ns, [e[0] for e in entries])
        return [e[0] for e in entries]

    def deadlines_of(self, t: int, s: int) -> list[tuple[Flight, int]]:
        """Everything in flight to s on t with its AckRetry deadline (0: none), by message id."""
        rows = self._rows(t, s)
        return sorted((Flight._make(e), deadline) for _, deadline, raw in rows for e in FLIGHT_ENTRY.iter_unpack(raw[HEAD:]))

    def pop(self, t: int, s: int, m: int) -> Flight | None:
        entry = self.pop_many(t, s, [m])[0]
        return None if entry is None else Flight._make(entry)

    def get(self, t: int, s: int, m: int) -> Flight | None:
        key = self._of(t, s).where.get(m)
        raw = None if key is None else self.txn.get(key, db=self.db)
        if raw is not None:
            for entry in FLIGHT_ENTRY.iter_unpack(raw[HEAD:]):
                if entry[0] == m:
                    return Flight._make(entry)
        return None

    def due(self, now_ns: int, limit: int) -> list[tuple[int, int, int]]:
        """The in-flight (t, s, m) of batches whose AckRetry deadline is <= now_ns,
        whole batches until at least `limit` messages, in the order of
        (deadline, t, s, m): what comes due together goes back by message id."""
        due: list[tuple[int, int, int, int]] = []
        with self.txn.cursor(db=self.deadlines_db) as cur:
            if cur.first():
                for key in cur.iternext(values=False):
                    deadline, t, s, f = DTSM.unpack(key)
                    if deadline > now_ns or len(due) >= limit:
                        break
                    raw = self.txn.get(TSM.pack(t, s, f), db=self.db) or b""
                    due += [(deadline, t, s, entry[0]) for entry in FLIGHT_ENTRY.iter_unpack(raw[HEAD:])]
        return [(t, s, m) for _, t, s, m in sorted(due)]

    def next_deadline_ns(self) -> int | None:
        """When the soonest AckRetry deadline comes; None if no batch has one."""
        if self.times.deadline == UNREAD:
            self.times.deadline = first_time(self.txn, self.deadlines_db)
        return self.times.deadline if self.times.deadline != NONE_DUE else None

    def of(self, t: int, s: int) -> list[Flight]:
        """Everything in flight to s on t (at most its Window, so a short list), by message id."""
        return sorted(Flight._make(entry) for _, _, raw in self._rows(t, s) for entry in FLIGHT_ENTRY.iter_unpack(raw[HEAD:]))


def _one_batch(rows: list[bytes | None]) -> bytes | None:
    """The key of the one batch row that all the messages named are in, given
    each one's (a message named twice has None the second time); None
    if they are not all in one."""
    key = rows[0] if rows else None
    return key if key is not None and rows.count(key) == len(rows) else None
