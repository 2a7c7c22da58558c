"""Which taker holds which taken message (PROTOCOL §9 Competing consumers).

A Pull subscriber's workers TAKE its messages over many connections at once;
when one goes away, what it took and did not ack goes back to ready at once.
That needs to know who took what, and only for as long as the takers live: a
broker restart leaves no taker, so every taken message is ready again at open
(`Broker._give_back_unconfirmed`). It is therefore kept in memory, never stored.

Changes are logged until the step commits, so that a request or a step that is
undone (its transaction rolled back) undoes them too: `mark`, `undo`, `commit`.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat

Key = tuple[str, str]  # (topic, subscriber)


class TakerHoldings:
    """The taker of each taken message of each Pull subscription.

    An entry is added at every take, and dropped by an ack (the common way
    out), by its taker's Abandoned, or by `prune` once the message left flight
    another way (nack, AckRetry, reject, expiry, purge): those are rare, and
    pruning when a subscription holds far more entries than messages in flight
    keeps the map within a few Windows without a hook on every such path.
    """

    def __init__(self) -> None:
        self._owner: dict[Key, dict[int, int]] = {}  # (topic, subscriber) -> message id -> taker
        # (key, messages, each one's previous taker or None) since the commit: an
        # entry a take or an ack, whose messages are set or looked up in C; empty
        # when nothing changed, so that a step commits it only when it has any
        self.log: list[tuple[Key, tuple[int, ...], list[int | None]]] = []

    def took(self, key: Key, taker: int, ms: list[int]) -> None:
        owners = self._owner.setdefault(key, {})
        self.log.append((key, tuple(ms), list(map(owners.get, ms))))
        owners.update(zip(ms, repeat(taker)))

    def release(self, key: Key, ms: list[int]) -> None:
        """Acked (by whichever connection): nobody holds ms any more."""
        owners = self._owner.get(key)
        if owners:
            self.log.append((key, tuple(ms), list(map(owners.pop, ms, repeat(None)))))

    def abandon(self, taker: int) -> list[tuple[Key, list[int]]]:
        """What taker holds, per subscription; it holds nothing any more."""
        held = []
        for key, owners in self._owner.items():
            ms = [m for m, t in owners.items() if t == taker]
            if ms:
                held.append((key, ms))
        for key, ms in held:
            self.release(key, ms)
        return held

    def prune(self, key: Key, in_flight: Callable[[int], bool]) -> None:
        """Drop the entries of messages that are no longer in flight."""
        owners = self._owner.get(key, {})
        self.release(key, [m for m in owners if not in_flight(m)])

    def held(self, key: Key) -> int:
        return len(self._owner.get(key, ()))

    def holders(self, key: Key) -> set[int]:
        """The takers that hold messages of this subscription."""
        return set(self._owner.get(key, {}).values())

    # --- undo ------------------------------------------------------------------------

    def mark(self) -> int:
        return len(self.log)

    def undo(self, mark: int = 0) -> None:
        """Put back every change made since `mark`, newest first (a message named
        twice in one entry was taken out by its first mention)."""
        while len(self.log) > mark:
            key, ms, before = self.log.pop()
            owners = self._owner.setdefault(key, {})
            for m, taker in zip(reversed(ms), reversed(before)):
                if taker is None:
                    owners.pop(m, None)
                else:
                    owners[m] = taker

    def commit(self) -> None:
        self.log = []
