"""Which inflight row holds each message in flight, kept in memory beside the
rows (`FlightIndex`), and which messages left flight in one transaction
(`FlightWatch`, for the links of subscribers with parallel connections)."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from itertools import compress, repeat

# A batch row as the index knows it: the messages it holds, in the row's order,
# and the row's head (its deadline_ns, packed). A plain tuple: made at every push.
Batch = tuple[list[int], bytes]


class SubFlights:
    """One subscription's batches in flight, as the index knows them."""

    __slots__ = ("where", "batches", "next_f")

    def __init__(self) -> None:
        self.where: dict[int, bytes] = {}  # m -> the key (T S F) of the inflight row that holds it
        self.batches: dict[bytes, Batch] = {}  # a row's key -> what it holds
        self.next_f = 1  # the F of the next batch: above every row's


class FlightIndex:
    """Which inflight row holds each message in flight, per subscription.

    An ack names messages, and the rows are per batch: finding a message's row
    by walking the subscription's rows would cost the Window per ack, and an
    index row per message is what the batch rows are there to avoid. So the
    index lives in memory (at most Window entries a subscription), built from
    the rows the first time a subscription is asked about, with what each row
    holds, so that an ack of a whole batch deletes its row unread; changed only by
    the flights table (store/flights.py), with the rows. The store drops it
    whole whenever a transaction's writes are undone (an abort, a failed
    commit, a savepoint rolled back), so it never describes rows that are not
    there."""

    def __init__(self) -> None:
        # (t, s) -> its flights; the flights table reads a subscription's rows into it when it is missing
        self.subs: dict[tuple[int, int], SubFlights] = {}

    def clear(self) -> None:
        self.subs.clear()


class FlightWatch:
    """The messages that left flight to some subscriptions in one transaction,
    net of those that came back into flight in it (a touch rewrites its flights;
    AckRetry and a batch in one step put a message back and out again): what the
    links of subscribers with parallel connections free room by (core/lanes.py).
    A log rather than a set, so that a savepoint rolled back takes back its part."""

    def __init__(self, subs: AbstractSet[tuple[int, int]]) -> None:
        self.subs = subs  # (t, s) watched
        # (left, t, s, ms), in order: an entry a batch, since a batch enters and
        # leaves flight whole, mostly, and gone() reads them message by message in C.
        self._log: list[tuple[bool, int, int, list[int]]] = []

    def note(self, left: bool, t: int, s: int, ms: Iterable[int]) -> None:
        if (t, s) in self.subs:
            self._log.append((left, t, s, list(ms)))

    def mark(self) -> int:
        return len(self._log)

    def undo(self, mark: int) -> None:
        """Forget what was noted since mark: those writes were rolled back."""
        del self._log[mark:]

    def gone(self) -> dict[tuple[int, int], list[int]]:
        """(t, s) -> the messages out of flight at the end, that were in it before."""
        last: dict[tuple[int, int], dict[int, bool]] = {}
        for left, t, s, ms in self._log:
            last.setdefault((t, s), {}).update(zip(ms, repeat(left)))
        out = {ts: list(compress(lefts.keys(), lefts.values())) for ts, lefts in last.items()}
        return {ts: ms for ts, ms in out.items() if ms}
