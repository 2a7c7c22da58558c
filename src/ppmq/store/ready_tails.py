"""Ready queues made only of recent publishes, kept in memory beside their rows.

At a Window of one batch, a subscriber that keeps up still finds every batch
in its ready queue: the publish that comes while its batch is out stores the
messages with ready rows, and the ack that makes room takes them back out. A
batch taken from the rows reads each entry's body and builds its message again,
entry by entry. So when fresh messages (core/queues.py) settle into a ready queue
that was empty, the queue's entries, bodies included, are kept here as well; a
publish that joins the queue adds to them, and the next batch takes them from
memory, checks them against the runs, and deletes their rows.

A tail is only ever the whole of its queue. ReadyQueues (store/ready.py),
which owns the rows, drops a subscription's tail whenever its rows change any
other way (a redelivery, a nack, an expiry, a purge, a staged publish), the
store drops them all whenever writes are undone, and a tail that would pass
BUDGET_BYTES (all tails together) is dropped too: the backlog lives on disk,
and only a queue a subscriber is about to take is worth the memory.

A tail keeps each priority's entries apart, as the chunks of the publishes
that brought them, so that a batch takes from the front of the highest
priorities and touches nothing else: a batch costs what it takes, not what
waits behind it. A queue whose batches grew dearer with its length would fall
further behind the longer it got. docs/performance.md ("Design choices
measured") has what both choices save.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from itertools import chain, islice

from ppmq.store.schema import TAKEN_EXPIRES, TAKEN_FLIGHT, TAKEN_FRAGMENT, TAKEN_PRIO, Taken, fitting

BUDGET_BYTES = 4 << 20  # message bytes in every tail together


class _Tail:
    __slots__ = ("prios", "size", "expires_ns")

    def __init__(self) -> None:
        # Per priority, each publish's entries of it, in position order: the
        # queue is the priorities in order, each its chunks in order.
        self.prios: dict[int, deque[list[Taken]]] = {}
        self.size = 0  # bytes of their messages
        self.expires_ns = 0  # the earliest expiry of any entry it ever held (0: none)


class ReadyTails:
    """The tails of the subscriptions that have one, by (topic id, subscriber id)."""

    def __init__(self, budget_bytes: int = BUDGET_BYTES) -> None:
        self._tails: dict[tuple[int, int], _Tail] = {}
        self._size = 0
        self.budget_bytes = budget_bytes  # 0 keeps none: every queue is read from its rows
        self.disagreed = 0  # tails found not to be what their rows hold: a bug, which tests look for

    def start(self, t: int, s: int, fresh: list[Taken]) -> None:
        """(t, s)'s queue was empty, and now holds the `fresh` messages (the
        first deliveries their publish made, in queue order)."""
        self.drop(t, s)
        self._tails[t, s] = _Tail()
        self.extend(t, s, fresh)

    def extend(self, t: int, s: int, fresh: list[Taken]) -> None:
        """The `fresh` messages (in queue order: by priority, then position)
        joined the end of (t, s)'s queue: kept as the entries a batch takes if
        it has a tail. They are the publish's own tuples, shared with every
        other subscriber's tail: nothing is made per message and subscriber.
        One without its in-flight entry packed (no subscriber was open when it
        was published) cannot be taken from here."""
        tail = self._tails.get((t, s))
        if tail is None:
            return
        if not all(map(TAKEN_FLIGHT, fresh)):
            self.drop(t, s)
            return
        i = 0
        while i < len(fresh):  # a slice per priority: most publishes have one
            prio = fresh[i][1]
            j = bisect_right(fresh, prio, lo=i, key=TAKEN_PRIO)
            tail.prios.setdefault(prio, deque()).append(fresh[i:j] if i or j < len(fresh) else fresh)
            i = j
        soonest = min(filter(None, map(TAKEN_EXPIRES, fresh)), default=0)
        if soonest and (not tail.expires_ns or soonest < tail.expires_ns):
            tail.expires_ns = soonest
        added = sum(map(len, map(TAKEN_FRAGMENT, fresh)))
        tail.size += added
        self._size += added
        if self._size > self.budget_bytes:
            self.drop(t, s)

    def take(self, t: int, s: int, limit: int, expired_at_ns: int, max_bytes: int = 0) -> list[Taken] | None:
        """The first `limit` entries of (t, s)'s queue, by priority then position,
        as far as a batch of `max_bytes` holds them (0: no bound), now out of
        its tail; None if it has none, or if one of its entries may have
        expired at `expired_at_ns` (a batch skips those: the rows tell)."""
        tail = self._tails.get((t, s))
        if tail is None or not tail.prios or 0 < tail.expires_ns <= expired_at_ns:
            return None
        if max_bytes:
            in_order = chain.from_iterable(chain.from_iterable(tail.prios[prio]) for prio in sorted(tail.prios))
            limit = fitting(map(TAKEN_FRAGMENT, islice(in_order, limit)), max_bytes)
        taken: list[Taken] = []
        for prio in sorted(tail.prios):
            chunks = tail.prios[prio]
            while chunks and len(taken) < limit:
                room = limit - len(taken)
                if len(chunks[0]) <= room:
                    taken += chunks.popleft()
                else:
                    taken += chunks[0][:room]
                    chunks[0] = chunks[0][room:]
            if not chunks:
                del tail.prios[prio]
            if len(taken) == limit:
                break
        size = sum(map(len, map(TAKEN_FRAGMENT, taken)))
        tail.size -= size
        self._size -= size
        return taken

    def drop(self, t: int, s: int) -> None:
        """(t, s)'s rows changed some other way: its tail no longer tells them."""
        tail = self._tails.pop((t, s), None)
        if tail is not None:
            self._size -= tail.size

    def disagree(self, t: int, s: int) -> None:
        """(t, s)'s rows do not hold what its tail says: the rows are the truth."""
        self.disagreed += 1
        self.drop(t, s)

    def drop_topic(self, t: int) -> None:
        """A message of topic t changed: no tail of it can be trusted."""
        for key in [key for key in self._tails if key[0] == t]:
            self.drop(*key)

    def clear(self) -> None:
        self._tails.clear()
        self._size = 0
