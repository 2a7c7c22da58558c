"""Pull subscribers (PROTOCOL §9): TAKE, and competing consumers.

A Pull subscriber is never pushed to: its workers TAKE messages, which go into flight exactly as a
pushed batch does (the same fragments, journaled as `deliver`, with the same
AckRetry deadline and Window), and are acked, nacked, rejected and touched the
same way. What is new is who holds them: each TAKE comes from a taker (a
connection), and a taker that goes away (`Abandoned`) gives back at once what
it took and did not ack. Who holds what is kept in memory (core/taker_holdings.py).

Waiting for messages is not the broker's: a TAKE that finds nothing is answered
with nothing at once, and the event loop (server/take_waits.py) keeps it waiting and sends
it again when a step may have made messages available (`takeable`).
"""

from __future__ import annotations

import msgspec
from msgspec import UNSET

from ppmq.core.dispatch import Dispatcher
from ppmq.core.settlement import Settlement
from ppmq.core.taker_holdings import Key, TakerHoldings
from ppmq.core.topology import Topology
from ppmq.errors import BadRequest
from ppmq.protocol import messages as p
from ppmq.store.state import State, SubStats
from ppmq.store.store import Txn

MAX_COUNT = 10_000  # messages one TAKE may ask for
MAX_WAIT_S = 3600  # seconds one TAKE may wait
# What a TAKE reply holds besides its Id and its messages: Status, Accepted, the
# Body around the messages, the newline.
REPLY_BYTES = 128
# A subscription's owner entries beyond twice its messages in flight, plus this,
# are looked through for messages that left flight without an ack.
PRUNE_SLACK = 64
ABANDONED = "Abandoned"  # the journal's requeue reason: the taker went away (or the broker restarted)


class Pull:
    """TAKE, and who holds what a Pull subscriber's workers took."""

    def __init__(self, state: State, topology: Topology, takers: TakerHoldings, dispatcher: Dispatcher, settlement: Settlement) -> None:
        self._state = state
        self._topology = topology
        self._takers = takers
        self._dispatcher = dispatcher
        self._settlement = settlement

    def takeable(self, topic: str, sub: str) -> int:
        """How many messages a TAKE for sub on topic could get now: ready ones, as
        far as its Window has room (0 while paused). Read from the counters alone,
        so the event loop may ask it between steps."""
        stats = self._state.subs.peek(topic, {}).get(sub)
        return 0 if stats is None else min(sum(stats.ready), self._room(stats, sub))

    def take_room(self, topic: str, sub: str) -> int:
        """How many messages TAKEs for sub on topic could get if enough were
        ready: its Window's room, 0 while paused or for no such subscription.
        From the counters alone, as takeable."""
        stats = self._state.subs.peek(topic, {}).get(sub)
        return 0 if stats is None else self._room(stats, sub)

    def _room(self, stats: SubStats, sub: str) -> int:
        in_flight_max = self._topology.in_flight_max.get(sub)
        return 0 if in_flight_max is None or stats.paused else max(0, in_flight_max - stats.inflight)

    def holders(self, topic: str, sub: str) -> set[int]:
        """The takers holding messages of sub on topic (as of the last STATUS's pruning)."""
        return self._takers.holders((topic, sub))

    def take(self, txn: Txn, req: p.Request, taker: int | None, now_ns: int) -> dict:
        """PROTOCOL §9 TAKE: up to Count ready messages, now in flight to the
        subscriber and held by `taker`; none (at once) when nothing can be taken.
        The reply is one frame, which a client reads as any other: no more
        messages than MaxFrameBytes holds, but always one."""
        if taker is None:
            raise BadRequest("Command: TAKE is answered on ServerSocket only")
        if req.id is UNSET:
            raise BadRequest("Id: required with TAKE, whose reply carries the messages")
        count = int(_within(req.count, "Count", 1, MAX_COUNT))  # Count is an int on the wire
        _within(req.wait, "Wait", 0, MAX_WAIT_S)
        topic = self._topology.topic_for(req, "TAKE")
        sub = self._topology.subscriber_of(req.subscriber, topic, "TAKE")
        if not self._topology.sub_configs[sub].pull:
            raise BadRequest(f"Subscriber: {sub!r} is pushed to; TAKE is for subscribers with Pull: true")
        limit = min(count, self.takeable(topic.name, sub))
        max_bytes = max(1, self._topology.config.max_frame_bytes - REPLY_BYTES - len(req.id))
        batch = self._dispatcher.batch(txn, sub, topic, limit, now_ns, max_bytes) if limit > 0 else None
        if batch is None:
            return {"Messages": []}
        ids, fragments, _ = batch
        if topic.ack_required:
            self._takers.took((topic.name, sub), taker, ids)
            self._prune_stale(txn, (topic.name, sub), 2 * self._state.subs[topic.name][sub].inflight + PRUNE_SLACK)
        else:  # AckRequired: false: taking completes them, as writing a pushed batch does
            self._settlement.ack(txn, topic, sub, None, ids, "AutoAck")
        return {"Messages": [msgspec.Raw(f) for f in fragments]}

    def abandon(self, txn: Txn, taker: int, now_ns: int) -> None:
        """The taker went away: what it took and did not ack goes back to its
        place now, a delivery counted (MaxAttempts applies), as for RECONNECT."""
        for (topic, sub), ms in self._takers.abandon(taker):
            if sub not in self._state.subs.get(topic, {}):
                continue  # the subscription was dropped by a reload meanwhile
            t, s = self._state.topic_ids[topic], self._state.sub_ids[sub]
            for m in ms:
                self._settlement.give_back(txn, t, s, m, now_ns, ABANDONED)

    def prune_takers(self, txn: Txn) -> None:
        """Before STATUS counts the takers: only messages still in flight are held."""
        for sc in self._topology.config.subscribers:
            if sc.pull:
                for tc in self._topology.sub_topics[sc.name]:
                    self._prune_stale(txn, (tc.name, sc.name), self._state.subs[tc.name][sc.name].inflight)

    def _prune_stale(self, txn: Txn, key: Key, allowed: int) -> None:
        """Forget the owners of messages that left flight without an ack, once
        the subscription has more than `allowed` owner entries."""
        if self._takers.held(key) <= allowed:
            return
        topic, sub = key
        t, s = self._state.topic_ids[topic], self._state.sub_ids[sub]
        in_flight = {f.m for f in txn.inflight_of(t, s)}
        self._takers.prune(key, in_flight.__contains__)


def _within(value: float | None, field: str, low: int, high: int) -> int | float:
    """A TAKE's Count or Wait, `low` when absent; 400 naming the field when out of range."""
    if value is None:
        return low
    if not low <= value <= high:
        raise BadRequest(f"{field}: {value:g} is out of range {low}..{high}")
    return value
