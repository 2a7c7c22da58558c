"""Parallel push connections (PROTOCOL §9): what each connection carries, sans-IO.

A subscriber with `Connections: N` has N lanes, numbered 0..N-1, and at most one
connection open in each. A lane keeps what its connections carried until the
broker says it left flight (acked wherever the ack arrived, nacked, rejected,
expired, redelivered after AckRetry, given back by RECONNECT), also across a
broken connection: the next connection in that lane starts with what is still
in flight there, as the one connection of `Connections: 1` always does.

The link keeps a `LaneLoads` and hands the broker, with every step, `Lanes`: per
lane, how many messages of each topic it carries, or None while the lane has no
connection that can take a batch. The broker gives each batch to the lane with
the most room under `Window` for its topic (the least loaded), and says which
in `Delivery.lane`; the Window of all lanes together is also a cap on what is in
flight to the subscription, so messages whose lane is unknown (in flight before
a restart) count too.
"""

from __future__ import annotations

from collections import Counter

Lanes = list[dict[str, int] | None]  # per lane: topic -> messages in flight there; None: closed or busy


def room(lanes: Lanes, topic: str, window: int) -> tuple[int, int]:
    """The least loaded open lane for topic and how many messages it may take
    (0 when every open lane is at its Window, or none is open)."""
    best, most = -1, 0
    for lane, carried in enumerate(lanes):
        if carried is not None and window - carried.get(topic, 0) > most:
            best, most = lane, window - carried.get(topic, 0)
    return best, most


def carry(lanes: Lanes, lane: int, topic: str, count: int) -> None:
    """A batch of count messages given to lane: less room there for the step's next batches."""
    carried = lanes[lane]
    assert carried is not None, "an open lane: room() chose it"
    carried[topic] = carried.get(topic, 0) + count


class LaneLoads:
    """Which lane carries each message in flight to one subscriber, and how many
    each lane carries per topic; lives on the event loop, with the link."""

    def __init__(self, count: int) -> None:
        self._lane_of: dict[tuple[str, int], int] = {}  # (topic, message id) -> lane
        self.carried: list[Counter[str]] = [Counter() for _ in range(count)]  # lane -> topic -> messages

    def carry(self, lane: int, topic: str, msgs: list[int]) -> None:
        """msgs went out on lane. A message still booked on another lane left
        flight and came back in the same step (AckRetry, then a batch): it moves."""
        for m in msgs:
            before = self._lane_of.get((topic, m))
            if before is not None:
                self.carried[before][topic] -= 1
            self._lane_of[topic, m] = lane
        self.carried[lane][topic] += len(msgs)

    def left(self, topic: str, msgs: list[int]) -> None:
        """The broker says msgs left flight: room again on the lanes that carried
        them. Messages no lane carried (in flight before a restart) are ignored."""
        for m in msgs:
            lane = self._lane_of.pop((topic, m), None)
            if lane is not None:
                self.carried[lane][topic] -= 1

    def full(self, lane: int, topic: str, window: int) -> bool:
        """lane carries a whole Window of topic."""
        return self.carried[lane][topic] >= window

    def lanes(self, open_: list[bool]) -> Lanes:
        """What the broker is told for a step: a copy, since the step may run on
        another thread while the link goes on."""
        return [dict(carried) if is_open else None for carried, is_open in zip(self.carried, open_)]
