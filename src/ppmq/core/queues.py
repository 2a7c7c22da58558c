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
from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import NamedTuple

from ppmq.core.topology import Topology
from ppmq.store.schema import TAKEN_ATTEMPTS, TAKEN_FLIGHT, TAKEN_FRAGMENT, TAKEN_M, TAKEN_PRIO, Delayed, Flight, ReadyEntry, Taken, fitting
from ppmq.store.state import State, SubStats
from ppmq.store.store import Txn

log = logging.getLogger("ppmq.broker")


class Pulled(NamedTuple):
    """What a batch took from the ready queue."""

    entries: list[Taken]  # now in flight, in queue order
    expired: list[int]  # left in the queue: the caller expires them everywhere


class Queue:
    """One subscription's entries and counters, inside one transaction.

    Made a few times a step: its arguments are given by position, since a
    keyword call to a class builds a dict."""

    __slots__ = ("_txn", "t", "s", "stats", "fresh", "keep_tail")

    def __init__(self, txn: Txn, t: int, s: int, stats: SubStats, fresh: list[Taken] | None = None, keep_tail: bool = False) -> None:
        self._txn = txn
        self.t, self.s = t, s
        self.stats = stats
        self.fresh = fresh  # the step's fresh list of this subscription, for a publish or a batch
        # When fresh messages get ready rows, the queue keeps them in memory too (store/ready_tails.py).
        self.keep_tail = keep_tail

    # --- reading ---------------------------------------------------------------------

    def first_ready(self, prio: int) -> ReadyEntry | None:
        return self._txn.first_ready(self.t, self.s, prio)

    def in_flight(self) -> list[Flight]:
        return self._txn.inflight_of(self.t, self.s)

    # --- new messages ------------------------------------------------------------------

    def add_each(self, msgs: list[Taken], may_stay_fresh: list[bool] | None, due: Sequence[int] | None, fresh: list[Taken] | None) -> None:
        """Queues.add_new for a batch whose messages may go different ways: one
        by one, to the fresh list while the subscriber keeps up (`fresh`, its
        fresh list then, else None), to the ready rows, or to the delayed rows."""
        ready, caught_up = self.stats.ready, fresh is not None
        queued = []
        for i, (f, may) in enumerate(zip(msgs, may_stay_fresh or repeat(True))):
            m, prio = f[0], f[1]
            if due is not None and due[i]:
                self._delay(Delayed(prio, m, m, 0, due[i]))
            elif caught_up and may:
                fresh.append(f)  # type: ignore[union-attr]  # caught up: a list
            else:
                caught_up = False
                queued.append(f)
            if due is None or not due[i]:
                ready[prio] += 1
        if queued:
            self._txn.push_fresh(self.t, self.s, queued, self.keep_tail, start=False)

    def reveal(self, counts: list[int]) -> None:
        """A staged publish (core/staging.py) whose ready rows were written hidden is whole:
        count them."""
        for prio, count in enumerate(counts):
            self.stats.ready[prio] += count

    def settle(self) -> None:
        """Fresh messages no batch took get their ready rows. The list itself is
        left as it was (the broker drops it): a request undone keeps a prefix of
        it, so lists only ever grow."""
        if self.fresh:
            self._txn.push_fresh(self.t, self.s, self.fresh, self.keep_tail, start=sum(self.stats.ready) == len(self.fresh))
        self.fresh = None

    # --- delivery ------------------------------------------------------------------------

    def pull(
        self, limit: int, deadline_ns: int, expired_at_ns: int, own_expiry: dict[int, int] | None = None, max_bytes: int = 0
    ) -> Pulled:
        """Up to `limit` ready messages by priority then position, as far as a
        batch of `max_bytes` holds them (0: no bound), now in flight. Those
        expired at `expired_at_ns` (0: none) stay where they are and are
        reported; a copy in `own_expiry` (id -> expires_ns) by its own expiry.
        A damaged store (an entry whose message is missing, a count with no
        entries) loses the entry or the count, logged, rather than stop
        delivery."""
        self.settle()
        taken, expired, missing = self._txn.take_ready(self.t, self.s, limit, deadline_ns, expired_at_ns, own_expiry, max_bytes)
        ready = self.stats.ready
        _count_in_order(ready, taken, -1)  # taken in queue order
        for prio in missing:
            log.error("store: a ready entry of topic %d subscriber %d points at a missing message", self.t, self.s)
            ready[prio] -= 1
        if not taken and not expired and not missing:
            # Only a store changed behind the broker's back gets here: the rows are
            # the truth, and a count they do not back would make every step come back.
            log.error("store: topic %d subscriber %d counted %s ready but has none; counters reset", self.t, self.s, ready)
            self.stats.ready = [0] * len(ready)
        n = len(taken)
        self.stats.inflight += n
        self.stats.delivered += n
        self.stats.redelivered += n - [*map(TAKEN_ATTEMPTS, taken)].count(1)  # delivered before: more than 1
        return Pulled(taken, expired)

    # --- leaving flight ----------------------------------------------------------------------

    def unflight(self, m: int) -> Flight | None:
        """m leaves flight, to go wherever the caller puts it."""
        flight = self._txn.pop_flight(self.t, self.s, m)
        if flight is not None:
            self.stats.inflight -= 1
        return flight

    def give_back(self, m: int, flight: Flight, attempts: int | None = None, due_ns: int = 0) -> None:
        """A delivered message, out of flight, given back at its original place
        (PROTOCOL §3 redelivery), waiting there until `due_ns` if given
        (PROTOCOL §8 a nack's Delay)."""
        attempts = flight.attempts if attempts is None else attempts
        if due_ns:
            self._delay(Delayed(flight.prio, flight.pos, m, attempts, due_ns))
            return
        self._txn.push_ready(self.t, self.s, flight.prio, flight.pos, m, attempts)
        self.stats.ready[flight.prio] += 1

    def _delay(self, entry: Delayed) -> None:
        self._txn.push_delayed(self.t, self.s, entry)
        self.stats.delayed += 1

    def release_due(self, prio: int, pos: int) -> bool:
        """A delayed entry that came due joins the ready queue at its place."""
        entry = self._txn.pop_delayed(self.t, self.s, prio, pos)
        if entry is None:
            return False
        self.stats.delayed -= 1
        self._txn.push_ready(self.t, self.s, prio, pos, entry.msg, entry.attempts)
        self.stats.ready[prio] += 1
        return True

    def touch(self, ms: list[int], deadline_ns: int) -> list[int]:
        """PROTOCOL §8 Touch: those of ms in flight get the AckRetry deadline
        `deadline_ns`; the others are counted as ignored. Returns the ones in flight."""
        found = self._txn.retime_flights(self.t, self.s, ms, deadline_ns)
        self.stats.ignored_acks += len(ms) - len(found)
        return found

    def give_back_unwritten(self, m: int) -> bool:
        """m, of a batch not written whole to the subscriber: given back as if it
        had not been sent, and not counted as delivered."""
        flight = self.unflight(m)
        if flight is None:
            return False  # acked, expired or replaced meanwhile
        self.give_back(m, flight, flight.attempts - 1)
        self.stats.delivered -= 1
        self.stats.redelivered -= flight.attempts > 1
        return True

    # --- leaving the queue ----------------------------------------------------------------------

    def remove(self, m: int, prio: int, pos: int) -> tuple[int, bool] | None:
        """m leaves the queue wherever it is (expiry, overflow, purge): its
        deliveries so far and whether it was in flight, or None if this
        subscription did not hold it."""
        attempts = self._txn.pop_ready(self.t, self.s, prio, pos)
        if attempts is not None:
            self.stats.ready[prio] -= 1
            return attempts, False
        delayed = self._txn.pop_delayed(self.t, self.s, prio, pos)
        if delayed is not None:
            self.stats.delayed -= 1
            return delayed.attempts, False
        flight = self.unflight(m)
        return None if flight is None else (flight.attempts, True)

    def place_version(
        self, m: int, place: tuple[int, int] | None, prio: int, new_pos: Callable[[], int], due_ns: int = 0
    ) -> tuple[int, int]:
        """PROTOCOL §3 Dedupe, for this subscriber: a new version of m with priority
        `prio`. Still waiting (ready, or delayed) at the same or a higher priority
        number it keeps its place; otherwise it goes to the end of its priority.
        It waits there until `due_ns` if given (PROTOCOL §8). Returns its place."""
        if place is not None and not due_ns and prio >= place[0] and self._txn.restart_ready(self.t, self.s, *place):
            return place  # ready, and stays where it is: the usual replacement of a message waiting in a backlog
        kept = place is not None and self._leave_place(m, place) and prio >= place[0]
        place = place if kept and place is not None else (prio, new_pos())
        if due_ns:
            self._delay(Delayed(place[0], place[1], m, 0, due_ns))
        else:
            self._txn.push_ready(self.t, self.s, place[0], place[1], m, 0)
            self.stats.ready[place[0]] += 1
        return place

    def _leave_place(self, m: int, place: tuple[int, int]) -> bool:
        """m leaves this queue; whether it was waiting at `place` (ready or
        delayed) rather than in flight or done with."""
        if self._txn.pop_ready(self.t, self.s, *place) is not None:
            self.stats.ready[place[0]] -= 1
            return True
        if self._txn.pop_delayed(self.t, self.s, *place) is not None:
            self.stats.delayed -= 1
            return True
        self.unflight(m)
        return False

    def drop_all(self) -> list[int]:
        """Every message of the subscription leaves it (the subscription is dropped)."""
        msgs: list[int] = []

        def drop(entry: ReadyEntry) -> bool:
            msgs.append(entry.msg)
            return True

        self._txn.pull_ready(self.t, self.s, 1 << 62, drop)
        for flight in self.in_flight():
            self.unflight(flight.m)
            msgs.append(flight.m)
        for entry in list(self._txn.delayed_of(self.t, self.s)):
            self._txn.pop_delayed(self.t, self.s, entry.prio, entry.pos)
            msgs.append(entry.msg)
        self.stats.ready = [0] * len(self.stats.ready)
        self.stats.delayed = 0
        return msgs


def _count_in_order(ready: list[int], msgs: list[Taken], sign: int) -> None:
    """Add (sign 1) or take (-1) msgs, in queue order (by priority, as a batch
    takes them), to the ready counters of their priorities: a bisect per
    priority instead of a step per message."""
    lo, n = 0, len(msgs)
    while lo < n:
        prio = msgs[lo][1]
        hi = bisect_right(msgs, prio, lo, key=TAKEN_PRIO)
        ready[prio] += sign * (hi - lo)
        lo = hi


class Queues:
    """Every subscription's `Queue`, and the step's fresh messages.

    Fresh messages were published in this step for a subscriber that reads now
    (open, or Pull) with nothing older queued: a batch in the same step takes
    them from memory; `settle_all` writes the ones no batch took before the
    step commits, and `settle_topic` before a change that looks a message up by
    its place (a replacement, a drop, an expiry).

    A subscription's `Queue` is kept from step to step. The first look at a
    topic's counters in a step, or in a request that may be undone, goes
    through State, as the ledger must note it (store/counters.py); a queue
    whose counters State no longer holds is built anew then, and an undo, a
    failed step or a reload drop them all (`forget`)."""

    def __init__(self, state: State, topology: Topology) -> None:
        self._state = state
        self._topology = topology
        self.fresh: dict[tuple[str, str], list[Taken]] = {}  # (topic, subscriber) -> its fresh messages, oldest first
        self.open: set[str] = set()  # the subscribers that can take a batch in this step
        # Those that may take a batch in this step: open, or Pull subscribers,
        # whose workers TAKE whenever they like (PROTOCOL §9). New messages stay
        # fresh for them, then wait in their queue's tail in memory.
        self.readers: set[str] | frozenset[str] = frozenset()
        self._built: dict[tuple[str, str], Queue] = {}  # (topic, subscriber) -> its queue

    def start(self, open_subs: set[str]) -> None:
        """A step begins, in which `open_subs` can take batches; nothing is fresh yet."""
        self.open, self.fresh, pulled = open_subs, {}, self._topology.pulled
        self.readers = open_subs | pulled if pulled else open_subs  # only read: no copy made without Pull subscribers

    def forget(self) -> None:
        """Drop the queues built so far: the config in force changed (a reload, or
        its undo), or the counters they hold were replaced (an undo, a failed step)."""
        self._built = {}
        self.readers = self.open | self._topology.pulled

    def of(self, txn: Txn, topic: str, sub: str) -> Queue:
        """sub's queue on topic."""
        key = (topic, sub)
        queue = self._built[key] if topic in self._state.subs.seen and key in self._built else self._look_up(txn, key)
        queue.fresh, queue.keep_tail = None, False
        return queue

    def add_new(
        self, txn: Txn, topic: str, subs: list[str], msgs: list[Taken], may_stay_fresh: list[bool] | None, due: Sequence[int] | None
    ) -> None:
        """New messages at the end of the queues of `subs` on topic, one list of
        entries shared by them all. A subscriber that reads now and has nothing
        older queued keeps them fresh (those `may_stay_fresh` allows; None:
        all), else they get ready rows (kept in memory too for a reader,
        store/ready_tails.py); those with a due time (`due`, 0: none) wait in
        the delayed rows instead."""
        readers, fresh_of, built, seen = self.readers, self.fresh, self._built, self._state.subs.seen
        for sub in subs:
            key = (topic, sub)
            queue = built[key] if topic in seen and key in built else self._look_up(txn, key)
            ready, reads = queue.stats.ready, sub in readers
            fresh = fresh_of[key] if key in fresh_of else None  # noqa: SIM401 - a look-up without a call
            if reads and sum(ready) == (len(fresh) if fresh else 0):  # its fresh ones are all it holds ready: it keeps up
                if fresh is None:
                    fresh = fresh_of[key] = []
            else:
                fresh = None
            if due is not None or (fresh is not None and may_stay_fresh is not None and not all(may_stay_fresh)):
                queue.keep_tail = reads
                queue.add_each(msgs, may_stay_fresh, due, fresh)
                continue
            for f in msgs:  # a plain loop indexing the tuple: cheaper than Counter
                ready[f[1]] += 1
            if fresh is not None:
                fresh += msgs  # the usual publish to a subscriber that keeps up: all of it
            else:  # or to one with older messages queued (at a Window of one batch, the usual too): none of it
                txn.push_fresh(queue.t, queue.s, msgs, reads, start=False)

    def ack(self, txn: Txn, topic: str, sub: str, ms: Sequence[int | None]) -> tuple[list[int], int, Queue]:
        """sub is done with ms on topic (None: a key that names no message);
        returns those that were in flight, which leave its queue, how many, and the queue. Acks of
        anything else are counted as ignored (PROTOCOL §3 Acks). The queue's
        one change made here rather than by its Queue: an ack is the usual
        way out, and this saves it the look-up's call."""
        key = (topic, sub)
        queue = self._built[key] if topic in self._state.subs.seen and key in self._built else self._look_up(txn, key)
        named: list[int] = ms if None not in ms else [m for m in ms if m is not None]  # type: ignore[assignment]  # checked: no None (a list)
        acked = txn.ack_flights(queue.t, queue.s, named)
        stats, n = queue.stats, len(acked)
        stats.inflight -= n
        stats.acked += n
        if acked != ms:  # some named nothing in flight (the usual ack names one that is)
            stats.ignored_acks += len(ms) - n
        return acked, n, queue

    def take_fresh(
        self, txn: Txn, topic: str, sub: str, limit: int, deadline_ns: int, max_bytes: int = 0
    ) -> tuple[Queue, list[Taken] | None, list[int]]:
        """sub's queue on topic for a batch, and, when the fresh messages
        (published in this step) are its whole queue, the first `limit` of
        them in queue order, as far as a batch of `max_bytes` holds them (0: no
        bound), now in flight, with their ids (a list the flight index keeps,
        and nothing changes); the rest settle. None and no ids otherwise: the
        queue holds its fresh messages then, which its `pull` settles first."""
        key, fresh_of, built = (topic, sub), self.fresh, self._built
        queue = built[key] if topic in self._state.subs.seen and key in built else self._look_up(txn, key)
        fresh = queue.fresh = fresh_of.pop(key, None)
        queue.keep_tail = True
        stats = queue.stats
        if not fresh or sum(stats.ready) != (n := len(fresh)):
            return queue, None, []
        if n > 1:
            # Queue order is priority, then position: the list is in position order
            # already, so a stable sort by priority alone (integer keys, compared in C) gives it.
            fresh = sorted(fresh, key=TAKEN_PRIO)
        if max_bytes:
            limit = fitting(map(TAKEN_FRAGMENT, fresh[:limit]), max_bytes)
        taken = fresh if limit >= n else fresh[:limit]  # the list itself: nothing appends to it once out of the step's dict
        ids = [*map(TAKEN_M, taken)]
        txn.put_flight(queue.t, queue.s, [*map(TAKEN_FLIGHT, taken)], deadline_ns, ids)
        if limit < n:
            _count_in_order(stats.ready, taken, -1)
            queue.fresh, n = fresh[limit:], limit
            queue.settle()
        else:  # all of them, the whole queue: nothing is ready any more
            stats.ready = [0] * len(stats.ready)
            queue.fresh = None
        stats.inflight += n
        stats.delivered += n
        return queue, taken, ids

    def taking(self, txn: Txn, topic: str, sub: str) -> Queue:
        """sub's queue on topic for a batch: its fresh messages go with it."""
        key = (topic, sub)
        queue = self._built[key] if topic in self._state.subs.seen and key in self._built else self._look_up(txn, key)
        queue.fresh, queue.keep_tail = self.fresh.pop(key, None), True
        return queue

    def _look_up(self, txn: Txn, key: tuple[str, str]) -> Queue:
        """The subscription's queue, its counters looked up in State (which the
        ledger notes); built anew unless it holds those very counters."""
        topic, sub = key
        stats = self._state.subs[topic][sub]
        queue = self._built[key] if key in self._built else None  # noqa: SIM401 - a look-up without a call
        if queue is None or queue.stats is not stats:
            state = self._state
            queue = self._built[key] = Queue(txn, state.topic_ids[topic], state.sub_ids[sub], stats)
        return queue

    def settle_topic(self, txn: Txn, topic: str) -> None:
        """The fresh messages of one topic join its ready queues now."""
        for key in [key for key in self.fresh if key[0] == topic]:
            self.taking(txn, *key).settle()

    def settle_all(self, txn: Txn) -> None:
        """Fresh messages no batch took join the ready queues."""
        if self.fresh:
            for key in list(self.fresh):
                self.taking(txn, *key).settle()
