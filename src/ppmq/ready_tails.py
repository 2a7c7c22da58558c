"""Ready queues made only of recent publishes, kept in memory beside their rows.

At a Window of one batch, a subscriber that keeps up still finds every batch
in its ready queue: the publish that comes while its batch is out stores the
messages with ready rows, and the ack that makes room takes them back out. A
batch taken from the rows reads each entry's body and builds its message again,
entry by entry: the writer's step cost half as much again per message at
Window = BatchSize as at ten batches in flight (bench/instructions.py: 114,457
instructions against 75,800; 103,827 with tails). So when fresh messages (queues.py) settle
into a ready queue that was empty, the queue's entries, bodies included, are
kept here as well; a publish that joins the queue adds to them, and the next
batch takes them from memory, checks them against the runs, and deletes their
rows.

A tail is only ever the whole of its queue. ReadyRows, which owns the rows,
drops a subscription's tail whenever its rows change any other way (a
redelivery, a nack, an expiry, a purge, a staged publish), the store drops them
all whenever writes are undone, and a tail that would pass BUDGET_BYTES (all
tails together) is dropped too: the backlog lives on disk, and only a queue a
subscriber is about to take is worth the memory.
"""

from __future__ import annotations

from itertools import chain
from operator import itemgetter

from .schema import Taken, make

BUDGET_BYTES = 4 << 20  # message bytes in every tail together
_PRIO, _SIZE, _EXPIRES = itemgetter(0), itemgetter(3), itemgetter(5)  # of a queues.Fresh
TAKEN_PRIO, _FRAGMENT = itemgetter(1), itemgetter(5)  # of a Taken


class _Tail:
    __slots__ = ("chunks", "size", "expires_ns")

    def __init__(self) -> None:
        # Each publish's entries, in queue order (by priority, then position); the
        # queue's order is that of the chunks merged by priority, stably.
        self.chunks: list[list[Taken]] = []
        self.size = 0  # bytes of their messages
        self.expires_ns = 0  # the earliest expiry of any entry it ever held (0: none)


class ReadyTails:
    """The tails of the subscriptions that have one, by (topic id, subscriber id)."""

    def __init__(self, budget_bytes: int = BUDGET_BYTES) -> None:
        self._tails: dict[tuple[int, int], _Tail] = {}
        self._size = 0
        self.budget_bytes = budget_bytes  # 0 keeps none: every queue is read from its rows
        self.disagreed = 0  # tails found not to be what their rows hold: a bug, which tests look for

    def start(self, t: int, s: int, fresh: list[tuple], publish_ns: int) -> None:
        """(t, s)'s queue was empty, and now holds the `fresh` messages
        (queues.Fresh, in position order) published at publish_ns."""
        self.drop(t, s)
        self._tails[t, s] = _Tail()
        self.extend(t, s, fresh, publish_ns)

    def extend(self, t: int, s: int, fresh: list[tuple], publish_ns: int) -> None:
        """The `fresh` messages joined the end of (t, s)'s queue: kept as the
        entries a batch takes if it has a tail."""
        tail = self._tails.get((t, s))
        if tail is None:
            return
        tail.chunks.append([make(Taken, (m, prio, m, 1, publish_ns, fragment)) for prio, m, fragment, _, _, _ in sorted(fresh, key=_PRIO)])
        soonest = min(filter(None, map(_EXPIRES, fresh)), default=0)
        if soonest and (not tail.expires_ns or soonest < tail.expires_ns):
            tail.expires_ns = soonest
        added = sum(map(_SIZE, fresh))
        tail.size += added
        self._size += added
        if self._size > self.budget_bytes:
            self.drop(t, s)

    def take(self, t: int, s: int, limit: int, expired_at_ns: int) -> list[Taken] | None:
        """The first `limit` entries of (t, s)'s queue, by priority then position,
        now out of its tail; None if it has none, or if one of its entries may
        have expired at `expired_at_ns` (a batch skips those: the rows tell)."""
        tail = self._tails.get((t, s))
        if tail is None or not tail.chunks or 0 < tail.expires_ns <= expired_at_ns:
            return None
        chunks = tail.chunks
        queue = chunks[0] if len(chunks) == 1 else sorted(chain.from_iterable(chunks), key=TAKEN_PRIO)
        taken, rest = queue[:limit], queue[limit:]
        tail.chunks = [rest] if rest else []
        size = sum(map(len, map(_FRAGMENT, taken)))
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
