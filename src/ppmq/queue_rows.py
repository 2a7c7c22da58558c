"""A subscription's rows: its ready queue and what is in flight to it.

Only a Queue (queues.py) changes them, with the counters that count them; the
state machine's other parts read them through it, and fsck through reader.py.
"""

from __future__ import annotations

from collections.abc import Callable

from .rows import Rows
from .schema import BODY_HEAD, DTSM, FLIGHT, READY_VAL, TM, TS, TSM, TSPQ, Flight, ReadyEntry, Taken


class QueueRows(Rows):
    """The ready, inflight and deadlines databases of one transaction."""

    # --- ready queues ---------------------------------------------------------------
    def push_ready(self, t: int, s: int, prio: int, pos: int, m: int, attempts: int) -> None:
        self._put_in_order(TSPQ.pack(t, s, prio, pos), READY_VAL.pack(m, attempts), self._ready)

    def push_ready_many(self, t: int, s: int, entries: list[tuple[int, int, int]]) -> None:
        """(prio, pos, m) entries, first attempts, into s's queue in one call."""
        items = [(TSPQ.pack(t, s, prio, pos), READY_VAL.pack(m, 0)) for prio, pos, m in entries]
        self._put_all_in_order(items, self._ready)

    def remove_ready(self, t: int, s: int, prio: int, pos: int) -> bool:
        return self.txn.delete(TSPQ.pack(t, s, prio, pos), db=self._ready)

    def ready_attempts(self, t: int, s: int, prio: int, pos: int) -> int | None:
        """Deliveries so far of the ready entry at (prio, pos), or None if there is none."""
        raw = self.txn.get(TSPQ.pack(t, s, prio, pos), db=self._ready)
        return None if raw is None else READY_VAL.unpack(raw)[1]

    def pop_ready(self, t: int, s: int, prio: int, pos: int) -> int | None:
        """Remove a ready entry; return its attempts so far, or None if there was none."""
        raw = self.txn.pop(TSPQ.pack(t, s, prio, pos), db=self._ready)
        return None if raw is None else READY_VAL.unpack(raw)[1]

    def pull_ready(self, t: int, s: int, limit: int, take: Callable[[ReadyEntry], bool]) -> int:
        """Walk s's queue on t by priority then position, deleting each entry that
        `take` accepts, until `limit` are taken; return how many were taken.
        A staged publish's entries (one run of positions per priority) are jumped over."""
        prefix = TS.pack(t, s)
        staged = self.staged()
        taken = 0
        with self.txn.cursor(db=self._ready) as cur:
            positioned = cur.set_range(prefix)
            while positioned and taken < limit:
                key = cur.key()
                if key[:6] != prefix:
                    break
                _, _, prio, pos = TSPQ.unpack(key)
                if staged is not None and staged.hides(t, pos):
                    positioned = cur.set_range(TSPQ.pack(t, s, prio, staged.last + 1))
                    continue
                m, attempts = READY_VAL.unpack(cur.value())
                if take(ReadyEntry(prio, pos, m, attempts)):
                    taken += 1
                    positioned = cur.delete() and bool(cur.key())
                else:
                    positioned = cur.next()
        return taken

    def take_ready(self, t: int, s: int, limit: int, deadline_ns: int, expired_at_ns: int) -> tuple[list[Taken], list[int], list[int]]:
        """A batch for s: up to `limit` entries of its queue on t, by priority then
        position, moved into flight with the AckRetry deadline `deadline_ns`.
        Returns what was taken; the ids of messages expired at `expired_at_ns`
        (0: none expire), left where they are; and the priorities of entries
        whose message is missing (a damaged store), deleted. One cursor walk and
        one write of the in-flight rows: the path of every backlog."""
        prefix, head_size = TS.pack(t, s), BODY_HEAD.size
        ready_key, ready_value, body_key, head = TSPQ.unpack, READY_VAL.unpack, TM.pack, BODY_HEAD.unpack_from
        get, bodies, staged = self.txn.get, self._bodies, self.staged()
        taken: list[Taken] = []
        expired: list[int] = []
        missing: list[int] = []
        with self.txn.cursor(db=self._ready) as cur:
            positioned = cur.set_range(prefix)
            while positioned and len(taken) < limit:
                key = cur.key()
                if key[:6] != prefix:
                    break
                _, _, prio, pos = ready_key(key)
                if staged is not None and staged.hides(t, pos):
                    positioned = cur.set_range(TSPQ.pack(t, s, prio, staged.last + 1))
                    continue
                m, attempts = ready_value(cur.value())
                raw = get(body_key(t, m), db=bodies)
                if raw is None:
                    missing.append(prio)
                else:
                    _, publish_ns, expires_ns, klen = head(raw)
                    if 0 < expires_ns <= expired_at_ns:
                        expired.append(m)
                        positioned = cur.next()
                        continue
                    taken.append(Taken(prio, pos, m, attempts + 1, publish_ns, raw[head_size + klen :]))
                positioned = cur.delete() and bool(cur.key())
        flight, key_of = FLIGHT.pack, TSM.pack
        self._put_all_in_order([(key_of(t, s, x.m), flight(x.prio, x.pos, deadline_ns, x.attempts, x.publish_ns)) for x in taken], self._inflight)
        if deadline_ns:
            for x in taken:
                self.txn.put(DTSM.pack(deadline_ns, t, s, x.m), b"", db=self._deadlines)
        return taken, expired, missing

    def first_ready(self, t: int, s: int, prio: int) -> ReadyEntry | None:
        """The head of s's queue of priority prio, a staged publish's entries left out."""
        prefix = TSPQ.pack(t, s, prio, 0)[:7]
        staged = self.staged()
        with self.txn.cursor(db=self._ready) as cur:
            if not cur.set_range(prefix) or cur.key()[:7] != prefix:
                return None
            _, _, p, pos = TSPQ.unpack(cur.key())
            if staged is not None and staged.hides(t, pos):
                if not cur.set_range(TSPQ.pack(t, s, prio, staged.last + 1)) or cur.key()[:7] != prefix:
                    return None
                _, _, p, pos = TSPQ.unpack(cur.key())
            m, attempts = READY_VAL.unpack(cur.value())
            return ReadyEntry(p, pos, m, attempts)

    # --- in flight --------------------------------------------------------------------
    def put_first_flights(self, t: int, s: int, msgs: list[tuple[int, int]], deadline_ns: int, publish_ns: int) -> None:
        """A whole batch's first deliveries to s of messages published at
        publish_ns: (m, prio), each at its place (prio, m)."""
        key, value = TSM.pack, FLIGHT.pack
        self._put_all_in_order([(key(t, s, m), value(prio, m, deadline_ns, 1, publish_ns)) for m, prio in msgs], self._inflight)
        if deadline_ns:
            for m, _ in msgs:
                self.txn.put(DTSM.pack(deadline_ns, t, s, m), b"", db=self._deadlines)

    def pop_flights(self, t: int, s: int, ms: list[int]) -> list[tuple[int, int] | None]:
        """Take each of ms out of flight to s, with its deadline entry; per m, its
        (deliveries so far, publish_ns), or None if it was not in flight. The
        path of every ack: one call a batch, and no Flight built."""
        pop, delete, key, db = self.txn.pop, self.txn.delete, TSM.pack, self._inflight
        out: list[tuple[int, int] | None] = []
        for m in ms:
            raw = pop(key(t, s, m), db=db)
            if raw is None:
                out.append(None)
                continue
            _, _, deadline_ns, attempts, publish_ns = FLIGHT.unpack(raw)
            if deadline_ns:
                delete(DTSM.pack(deadline_ns, t, s, m), db=self._deadlines)
            out.append((attempts, publish_ns))
        return out

    def get_inflight(self, t: int, s: int, m: int) -> Flight | None:
        raw = self.txn.get(TSM.pack(t, s, m), db=self._inflight)
        return None if raw is None else Flight._make(FLIGHT.unpack(raw))

    def pop_inflight(self, t: int, s: int, m: int) -> Flight | None:
        raw = self.txn.pop(TSM.pack(t, s, m), db=self._inflight)
        if raw is None:
            return None
        flight = Flight._make(FLIGHT.unpack(raw))
        if flight.deadline_ns:
            self.txn.delete(DTSM.pack(flight.deadline_ns, t, s, m), db=self._deadlines)
        return flight

    def due_deadlines(self, now_ns: int, limit: int) -> list[tuple[int, int, int]]:
        """Up to `limit` in-flight (t, s, m) whose AckRetry deadline is <= now_ns."""
        out = []
        with self.txn.cursor(db=self._deadlines) as cur:
            if cur.first():
                for key in cur.iternext(values=False):
                    deadline, t, s, m = DTSM.unpack(key)
                    if deadline > now_ns or len(out) >= limit:
                        break
                    out.append((t, s, m))
        return out

    def next_deadline_ns(self) -> int | None:
        with self.txn.cursor(db=self._deadlines) as cur:
            return DTSM.unpack(cur.key())[0] if cur.first() else None

    def inflight_of(self, t: int, s: int) -> list[tuple[int, Flight]]:
        """Everything in flight to s on t (at most its Window, so a short list)."""
        prefix = TS.pack(t, s)
        out = []
        with self.txn.cursor(db=self._inflight) as cur:
            if cur.set_range(prefix):
                for key, raw in cur:
                    if key[:6] != prefix:
                        break
                    out.append((TSM.unpack(key)[2], Flight._make(FLIGHT.unpack(raw))))
        return out
