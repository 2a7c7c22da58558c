"""Whether the store has room for another publish (PROTOCOL §4: MaxStoreBytes, status 507).

The pages in use are counted with a stat of every database, too dear to do at
every publish (docs/performance.md, "Design choices measured"). So the count is
kept, and what was written since is added to it as an upper bound, and the
store is counted again only when that sum reaches the limit, after
RECOUNT_BYTES of it, or after RECOUNT_S. A store far from full is counted once
a second at low rates and every few thousand small messages at high ones; one
near its limit at every publish.

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

RECOUNT_BYTES = 1 << 20  # of the estimate between two counts, at most (1,400 bodies of 200 bytes)
RECOUNT_S = 1.0  # between two counts, at most: deliveries and redeliveries grow the store too
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
        self._counted: int | None = None  # bytes in use at the last count; None: count again
        self._written = 0  # bytes of bodies written since, overhead included
        self._counted_at = 0.0

    def full(self, count: Callable[[], int]) -> bool:
        """Whether publishes are refused now; `count` gives the bytes in use exactly."""
        if (
            self._counted is not None
            and self._written < RECOUNT_BYTES
            and self._counted + self._written < self.max_bytes
            and time.monotonic() - self._counted_at < RECOUNT_S
        ):
            return False
        self._counted, self._written, self._counted_at = count(), 0, time.monotonic()
        self.counts += 1
        return self._counted >= self.max_bytes

    def wrote(self, body_bytes: int, bodies: int) -> None:
        """Bodies were written: the store may have grown by about this much."""
        self._written += BODY_FACTOR * body_bytes + BODY_OVERHEAD * bodies

    def forget(self) -> None:
        """Writes were undone: the last count may have seen rows that are gone,
        or missed rows that are back."""
        self._counted = None
