"""Whether the store has room for another publish (PROTOCOL §4: MaxStoreBytes, status 507).

The pages in use are counted with a stat of every database, too dear to do at
every publish (docs/performance.md, "Design choices measured"). So the count is
kept, and what was written since is added to it as an upper bound, and the
store is counted again only when that sum reaches the limit, after
RECOUNT_BYTES of it, or after RECOUNT_NS by the step's time. A store far from
full is counted once a second at low rates and every few thousand small
messages at high ones; one near its limit at every publish.

A publish is refused only on a count, never on the estimate, so nothing is
refused that the exact check would take; and since what a body may take is
overestimated, a store is counted again before the bodies written since can
take it past max_bytes. What the estimate leaves out (a database's first page,
index rows of many subscribers, redeliveries) can take it past by a fraction of
RECOUNT_BYTES, well inside the headroom the environment keeps for acks and
deliveries.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ppmq.errors import StoreFull

RECOUNT_BYTES = 1 << 20  # of the estimate between two counts, at most (1,400 bodies of 200 bytes)
RECOUNT_NS = 1_000_000_000  # between two counts, at most: deliveries and redeliveries grow the store too
# A body of v bytes takes at most 2v + 256 bytes of pages: in a leaf page (LMDB
# splits a page in two halves, or appends to a new one) or in overflow pages,
# whose rounding up to a page stays under 2v once v is past half a page, where
# values start to go there; 256 is the node, its key and a share of its index rows.
BODY_FACTOR, BODY_OVERHEAD = 2, 256


class Room:
    """The store's last count of the pages in use, and what was written since."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.counts = 0  # exact counts taken so far
        # What the estimate may grow by before the store is counted again: the
        # least of RECOUNT_BYTES and the room the last count left, less the bytes
        # of bodies written since (overhead included). 0 or less: count again.
        self._left = 0
        self._counted_ns = 0  # when the last count was taken

    def refuse_when_full(self, count: Callable[[], int], now_ns: int | None = None) -> None:
        """Raise StoreFull (507) if publishes are refused at now_ns (the step's
        time; the clock's if not given); `count` gives the bytes in use
        exactly, and is asked only when the estimate is not enough."""
        if now_ns is None:
            now_ns = time.time_ns()
        if self._left > 0 and 0 <= now_ns - self._counted_ns < RECOUNT_NS:
            return
        used = count()
        self._left, self._counted_ns = min(RECOUNT_BYTES, self.max_bytes - used), now_ns
        self.counts += 1
        if used >= self.max_bytes:
            raise StoreFull(f"store full: MaxStoreBytes ({self.max_bytes}) reached")

    def full(self, count: Callable[[], int], now_ns: int | None = None) -> bool:
        """Whether publishes are refused now (refuse_when_full, as a bool)."""
        try:
            self.refuse_when_full(count, now_ns)
        except StoreFull:
            return True
        return False

    def wrote(self, body_bytes: int, bodies: int) -> None:
        """Bodies were written: the store may have grown by about this much."""
        self._left -= BODY_FACTOR * body_bytes + BODY_OVERHEAD * bodies

    def forget(self) -> None:
        """Writes were undone: the last count may have seen rows that are gone,
        or missed rows that are back."""
        self._left = 0
