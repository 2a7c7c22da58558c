"""A subscription's queue: its ready and in-flight entries and their counters, kept by one owner.

A subscription (topic x subscriber) holds each message it has not finished with
either ready, at its place (priority, position) in the queue, or in flight. The
store keeps those entries as rows; STATUS shows how many there are from counters
in `SubStats`. Every change to an entry goes through a `Queue`, which changes
the counter with the row, so the two cannot disagree.

Messages published in the current step for a subscriber that has nothing older
queued stay "fresh" (in memory, counted as ready) until the step ends: a batch
taken in the same step sends them straight into flight, without a ready row
being written, walked and deleted. `settle` writes the ones no batch took.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

from .state import SubStats
from .schema import FLIGHT_ENTRY, Flight, ReadyEntry, Taken
from .store import Txn

log = logging.getLogger(__name__)


class Fresh(NamedTuple):
    """A message published in this step, not yet in the ready rows."""

    prio: int
    m: int  # message id, and its queue position
    fragment: bytes


class Pulled(NamedTuple):
    """What a batch took from the ready queue."""

    entries: list[Taken]  # now in flight, in queue order
    expired: list[int]  # left in the queue: the caller expires them everywhere


def space(stats: SubStats, batch_size: int, window: int) -> int:
    """How many messages a subscription's next batch may take (PROTOCOL §3 Batches
    and window); 0 also when a reload lowered Window below what is in flight.
    Read from the counters alone, so the writer can ask it between steps."""
    if not any(stats.ready):
        return 0
    return max(0, min(batch_size, window - stats.inflight))


class Queue:
    """One subscription's entries and counters, inside one transaction."""

    __slots__ = ("_txn", "t", "s", "stats", "fresh")

    def __init__(self, txn: Txn, t: int, s: int, stats: SubStats, fresh: list[Fresh] | None = None) -> None:
        self._txn = txn
        self.t, self.s = t, s
        self.stats = stats
        self.fresh = fresh  # the step's fresh list of this subscription, for a publish or a batch

    # --- reading ---------------------------------------------------------------------

    @property
    def ready(self) -> int:
        return sum(self.stats.ready)

    def first_ready(self, prio: int) -> ReadyEntry | None:
        return self._txn.first_ready(self.t, self.s, prio)

    def in_flight(self) -> list[Flight]:
        return self._txn.inflight_of(self.t, self.s)

    # --- new messages ------------------------------------------------------------------

    def add_new(self, msgs: list[Fresh], may_stay_fresh: list[bool], open_: bool) -> None:
        """New messages at the end of the queue. While the subscriber is open and
        has nothing older queued they stay fresh, else they get ready rows."""
        fresh = self.fresh
        caught_up = open_ and fresh is not None and self.ready == len(fresh)
        queued = []
        ready = self.stats.ready
        for f, may in zip(msgs, may_stay_fresh):
            if caught_up and may:
                fresh.append(f)
            else:
                caught_up = False
                queued.append((f.prio, f.m, f.m))
            ready[f.prio] += 1
        if queued:
            self._txn.push_ready_many(self.t, self.s, queued)

    def reveal(self, counts: list[int]) -> None:
        """A staged publish (staging.py) whose ready rows were written hidden is whole:
        count them."""
        for prio, count in enumerate(counts):
            self.stats.ready[prio] += count

    def settle(self) -> None:
        """Fresh messages no batch took get their ready rows. The list itself is
        left as it was (the broker drops it): a request undone keeps a prefix of
        it, so lists only ever grow."""
        if self.fresh:
            self._txn.push_ready_many(self.t, self.s, [(f.prio, f.m, f.m) for f in self.fresh])
        self.fresh = None

    # --- delivery ------------------------------------------------------------------------

    def take_fresh(self, limit: int, deadline_ns: int, now_ns: int) -> list[Fresh] | None:
        """When the fresh messages (published at now_ns) are the whole queue: the
        first `limit` of them in queue order, now in flight; the rest settle.
        None otherwise."""
        fresh = self.fresh
        if not fresh or self.ready != len(fresh):
            return None
        fresh = sorted(fresh)
        taken, self.fresh = fresh[:limit], fresh[limit:]
        entry = FLIGHT_ENTRY.pack
        self._txn.put_flight(self.t, self.s, [entry(f.m, f.prio, f.m, 1, now_ns) for f in taken], deadline_ns, [f.m for f in taken])
        ready = self.stats.ready
        for f in taken:
            ready[f.prio] -= 1
        self._count_delivered(len(taken), 0)
        self.settle()
        return taken

    def pull(self, limit: int, deadline_ns: int, expired_at_ns: int) -> Pulled:
        """Up to `limit` ready messages by priority then position, now in flight.
        Those expired at `expired_at_ns` (0: none) stay where they are and are
        reported. A damaged store (an entry whose message is missing, a count
        with no entries) loses the entry or the count, logged, rather than stop
        delivery."""
        self.settle()
        taken, expired, missing = self._txn.take_ready(self.t, self.s, limit, deadline_ns, expired_at_ns)
        ready = self.stats.ready
        for x in taken:
            ready[x.prio] -= 1
        for prio in missing:
            log.error("store: a ready entry of topic %d subscriber %d points at a missing message", self.t, self.s)
            ready[prio] -= 1
        if not taken and not expired and not missing:
            # Only a store changed behind the broker's back gets here: the rows are
            # the truth, and a count they do not back would make every step come back.
            log.error("store: topic %d subscriber %d counted %s ready but has none; counters reset", self.t, self.s, ready)
            self.stats.ready = [0] * len(ready)
        self._count_delivered(len(taken), sum(x.attempts > 1 for x in taken))
        return Pulled(taken, expired)

    def _count_delivered(self, n: int, again: int) -> None:
        self.stats.inflight += n
        self.stats.delivered += n
        self.stats.redelivered += again

    # --- leaving flight ----------------------------------------------------------------------

    def ack(self, ms: list[int | None]) -> list[tuple[int, int, int]]:
        """The subscriber is done with ms (None: a key that names no message);
        returns (m, deliveries so far, publish_ns) of those that were in flight.
        Acks of anything else are counted as ignored (PROTOCOL §3 Acks)."""
        named = [m for m in ms if m is not None]
        acked = [(f[0], f[3], f[4]) for f in self._txn.pop_flights(self.t, self.s, named) if f is not None]
        self.stats.inflight -= len(acked)
        self.stats.acked += len(acked)
        self.stats.ignored_acks += len(ms) - len(acked)
        return acked

    def unflight(self, m: int) -> Flight | None:
        """m leaves flight, to go wherever the caller puts it."""
        flight = self._txn.pop_flight(self.t, self.s, m)
        if flight is not None:
            self.stats.inflight -= 1
        return flight

    def put_back(self, m: int, flight: Flight, attempts: int | None = None) -> None:
        """A delivered message back at its original place (PROTOCOL §3 redelivery)."""
        self._txn.push_ready(self.t, self.s, flight.prio, flight.pos, m, flight.attempts if attempts is None else attempts)
        self.stats.ready[flight.prio] += 1

    def give_back(self, m: int) -> bool:
        """A batch that never reached the subscriber: m is ready again as if it
        had not been sent, and not counted as delivered."""
        flight = self.unflight(m)
        if flight is None:
            return False  # acked, expired or replaced meanwhile
        self.put_back(m, flight, flight.attempts - 1)
        self.stats.delivered -= 1
        self.stats.redelivered -= flight.attempts > 1
        return True

    # --- leaving the queue ----------------------------------------------------------------------

    def remove(self, m: int, prio: int, pos: int) -> bool | None:
        """m leaves the queue wherever it is (expiry, overflow); whether it had
        been delivered, or None if this subscription did not hold it."""
        attempts = self._txn.pop_ready(self.t, self.s, prio, pos)
        if attempts is not None:
            self.stats.ready[prio] -= 1
            return attempts > 0
        return True if self.unflight(m) is not None else None

    def requeue_version(self, m: int, place: tuple[int, int] | None, prio: int, new_pos: Callable[[], int]) -> tuple[int, int]:
        """PROTOCOL §3 Dedupe, for this subscriber: a new version of m with priority
        `prio`. Still ready at the same or a higher priority number it keeps its
        place; otherwise it goes to the end of its priority. Returns its place."""
        if place is not None:
            if self.unflight(m) is not None:
                place = None
            elif prio >= place[0]:
                self._txn.push_ready(self.t, self.s, place[0], place[1], m, 0)  # same place, new version
                return place
            else:
                self._txn.remove_ready(self.t, self.s, *place)
                self.stats.ready[place[0]] -= 1
        place = (prio, new_pos())
        self._txn.push_ready(self.t, self.s, prio, place[1], m, 0)
        self.stats.ready[prio] += 1
        return place

    def drop_all(self) -> list[int]:
        """Every message of the subscription leaves it (the subscription is dropped)."""
        msgs: list[int] = []
        self._txn.pull_ready(self.t, self.s, 1 << 62, lambda entry: msgs.append(entry.msg) or True)
        for flight in self.in_flight():
            self.unflight(flight.m)
            msgs.append(flight.m)
        self.stats.ready = [0] * len(self.stats.ready)
        return msgs
