"""The broker's side of parallel push connections (PROTOCOL §9, core/lanes.py).

For a subscriber with Connections > 1, its link reports with each step what
each of its lanes carries; a step gives each batch to the open lane with the
most room under Window, and notes what left flight to the subscriber, so that
the link frees room on the lane that carried each message, whatever made it
leave (an ack on any connection or on ServerSocket, a nack, AckRetry...).
"""

from __future__ import annotations

import msgspec

from ppmq.core.lanes import Lanes, carry, room
from ppmq.core.ops import Delivery
from ppmq.core.topology import Topology
from ppmq.store.flight_index import FlightWatch
from ppmq.store.state import State
from ppmq.store.store import Txn


class LaneRouter:
    """Which lane each batch of a subscriber with Connections > 1 takes, and what left flight to it."""

    def __init__(self, state: State, topology: Topology) -> None:
        self._state = state
        self._topology = topology
        self.lanes: dict[str, Lanes] = {}  # of the open subscribers with Connections > 1: what each lane carries
        self.watch: FlightWatch | None = None  # what leaves flight in this step to subscribers with Connections > 1

    def ready_topics(self, sub: str) -> list[str]:
        """The topics on which sub has messages ready and is not paused: what a
        link with lanes to spare opens another connection for (PROTOCOL §9).
        Read from the event loop, as has_pending is."""
        subs = self._state.subs
        return [
            t.name
            for t in self._topology.sub_topics.get(sub, ())
            if (stats := subs.peek(t.name, {}).get(sub)) is not None and any(stats.ready) and not stats.paused
        ]

    def lanes_of(self, sub: str, lanes: dict[str, Lanes]) -> Lanes | None:
        """sub's lanes as its link reported them, a copy the step may fill; None
        for a subscriber of one connection."""
        reported = lanes.get(sub)
        if reported is None or self._topology.sub_configs[sub].connections == 1:
            return None
        return [None if carried is None else dict(carried) for carried in reported]

    def to_lane(self, sub: str, delivery: Delivery, lanes: Lanes) -> Delivery:
        """The batch goes to the least loaded lane, which has that much less room."""
        lane, _ = room(lanes, delivery.topic, self._topology.windows[sub])
        carry(lanes, lane, delivery.topic, len(delivery.msgs))
        return msgspec.structs.replace(delivery, lane=lane)

    def watch_flights(self, txn: Txn) -> None:
        """Note, in this step's transaction, what leaves flight to subscribers with
        lanes; a step of a config without any does not ask (and `watch` stays None)."""
        self.watch = FlightWatch(self._topology.laned)
        txn.watch_flights(self.watch)

    def left_flight(self) -> dict[str, dict[str, list[int]]]:
        """Subscriber -> topic -> the messages that left flight in the step (Step.left),
        asked only after a step that watched them."""
        left: dict[str, dict[str, list[int]]] = {}
        assert self.watch is not None, "asked after watch_flights"
        for (t, s), ms in self.watch.gone().items():
            left.setdefault(self._topology.sub_by_id[s], {})[self._topology.topic_by_id[t]] = ms
        return left
