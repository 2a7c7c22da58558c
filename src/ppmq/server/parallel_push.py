"""Parallel push connections (PROTOCOL §9): a subscriber with `Connections: N`.

One SubscriberLink per lane (core/lanes.py), each connecting, pushing and reading
acks exactly as the one link of a subscriber with one connection does; each
sees the writer through a `_LaneFeed` that turns its "open"/"closed" into its
lane's, so that the broker sees the subscriber open while any lane can take a
batch, and gets from `lanes()` what each carries. Lane 0 connects whenever the
broker holds something for the subscriber; lane i only once lanes 0..i-1 are
up and, for a topic with messages ready, every lane up carries a whole Window of
it: a connection is opened as the backlog needs it, and one the subscriber
closed is opened again only when needed again. With `Accept=yes` on the
subscriber's socket unit, each connection is a handler process of its own.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ppmq.config import SubscriberConfig
from ppmq.core.lanes import LaneLoads, Lanes
from ppmq.core.ops import Delivery, Op, Unwritten
from ppmq.server.group_commit import GroupCommit, Outlet, ReplySink
from ppmq.server.push import SubscriberLink


class ParallelLink:
    """The broker's side of a subscriber with Connections > 1: its lanes and what they carry."""

    def __init__(self, config: SubscriberConfig, writer: GroupCommit, *link_args: Any, **link_kwargs: Any) -> None:
        """link_args, link_kwargs: the rest of what a SubscriberLink takes, for every lane's."""
        self.config = config
        self.name = config.name
        self.writer = writer
        self.loads = LaneLoads(config.connections)
        self._open = [False] * config.connections  # lane i's link waits for a batch
        self.links = [SubscriberLink(config, _LaneFeed(self, i), *link_args, **link_kwargs) for i in range(config.connections)]

    @property
    def connected(self) -> bool:
        return any(link.connected for link in self.links)

    def follow(self, config: SubscriberConfig, retry_max_s: float, max_frame_bytes: int, read_timeout_s: float) -> None:
        """A reload's new settings (the same Connections: another count relinks)."""
        self.config = config
        for link in self.links:
            link.follow(config, retry_max_s, max_frame_bytes, read_timeout_s)

    def stopping(self) -> None:
        """Its task is about to be cancelled: each lane queues what comes from now on (SubscriberLink.stopping)."""
        for link in self.links:
            link.stopping()

    async def run(self) -> None:
        self.writer.track(self.name, self)
        try:
            await asyncio.gather(*(link.run() for link in self.links))
        finally:
            self.writer.track(self.name, None)

    # --- the writer's side (writer.LanedOutlet) --------------------------------------------

    def lanes(self) -> Lanes:
        return self.loads.lanes(self._open)

    def left(self, topic: str, msgs: list[int]) -> None:
        self.loads.left(topic, msgs)

    def push(self, delivery: Delivery) -> bool:
        """A batch for the lane the broker chose. Its connection gone since the
        step began, it goes back to ready, as a batch for a closed link does.
        True while some lane may take another batch at once."""
        lane = delivery.lane
        if not self.links[lane].serving:
            self.writer.submit(Unwritten(self.name, delivery.topic, delivery.msgs))
        else:
            self.loads.carry(lane, delivery.topic, delivery.msgs)
            self._open[lane] = self.links[lane].push(delivery)
        return any(self._open)

    # --- the lanes' side ---------------------------------------------------------------------

    def lane_open(self, lane: int) -> None:
        self._open[lane] = True
        self.writer.open(self.name, self)

    def lane_closed(self, lane: int) -> None:
        self._open[lane] = False
        if not any(self._open):
            self.writer.close(self.name)

    async def needed(self, lane: int) -> None:
        """Return once lane should connect (see the module's docstring)."""
        if lane == 0:
            await self.writer.wanted(self.name)
        else:
            await self.writer.until(lambda: self._needs(lane))

    def _needs(self, lane: int) -> bool:
        if not all(link.serving for link in self.links[:lane]):
            return False
        window = self.writer.broker.config.window(self.config)
        up = [i for i, link in enumerate(self.links) if link.serving and i != lane]
        return any(all(self.loads.full(i, topic, window) for i in up) for topic in self.writer.broker.ready_topics(self.name))


class _LaneFeed:
    """The writer as one lane's SubscriberLink sees it."""

    def __init__(self, owner: ParallelLink, lane: int) -> None:
        self._owner = owner
        self._lane = lane

    async def wanted(self, subscriber: str) -> None:
        await self._owner.needed(self._lane)

    def open(self, subscriber: str, outlet: Outlet) -> None:
        self._owner.lane_open(self._lane)

    def close(self, subscriber: str) -> None:
        self._owner.lane_closed(self._lane)

    def submit(self, op: Op, sink: ReplySink | None = None) -> None:
        self._owner.writer.submit(op, sink)
