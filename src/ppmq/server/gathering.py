"""Gathering: which ops queued for the next step may wait for company.

With Sync each commit costs an fsync, and at any rate each step its fixed
cost, so the writer lets some ops wait up to ACK_GATHER_S (server/group_commit.py) for what
usually comes right behind them, to share one step. It asks for every op it is
handed, so the answer is kept as the ops are queued, not worked out again from
all of them each time.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Protocol

from msgspec import UNSET

from ppmq.core.ops import Op, Written, request_of
from ppmq.protocol import messages as p


class Counters(Protocol):
    """What Gathering reads of the broker's state, as the last step left it."""

    # Subscriber -> topics with messages ready that wait for room in its Window:
    # one mapping, kept up to date by the steps.
    backlog: Mapping[str, Collection[str]]

    def awaiting_acks(self, topic: str) -> list[str]: ...


class Gathering:
    """Whether every op queued for the next step may still wait for company."""

    def __init__(self, broker: Counters) -> None:
        self._broker = broker
        # Subscribers whose acks a publish waited for in vain: not waited for
        # again until their next acks come (a slow subscriber, not one on its way).
        self._late: set[str] = set()
        self.may_wait = True  # every op counted may still wait
        # What is counted no longer holds (a step ran since, or nothing is queued
        # any more): the next op added is counted from nothing.
        self.stale = False
        # Subscribers whose one-way acks are queued, as keys: noted by a store, which costs no call
        self._acking: dict[str, None] = {}
        self._awaited: set[str] = set()  # subscribers whose acks a queued publish waits for

    def clear(self) -> None:
        """Nothing is queued."""
        self.stale = True

    def recount(self, ops: Iterable[Op]) -> None:
        """Count `ops`, all that is queued, anew (after a step changed the state)."""
        self.stale = True
        for op in ops:
            if not self.add(op):
                break

    def ran_out(self) -> None:
        """The ops queued waited as long as they may: what they waited for did not come."""
        self._late |= self._awaited

    def add(self, op: Op, req: p.Request | None = None) -> bool:
        """op is queued too: whether every op queued may still wait. Read between
        steps only, when the broker's state is the event loop's to read. `req`:
        the request op carries (ops.request_of), when the caller has it at hand.

        Acks that nobody waits for: applying them a moment later changes
        nothing anyone can see but the counters (they are at least once anyway).
        Unless their subscriber has messages ready: then the Window room they
        free is what the next batch waits for (a Window of one batch makes every
        batch wait so), and holding them back would idle the subscriber.

        And a publish to subscribers whose Window is full and that have at
        most a batch ready (Broker.awaiting_acks), until their acks are queued
        too: applied after theirs, in one step, its messages go straight into
        flight (or the batch ready does, theirs taking its place), where before
        them they would wait in the ready queue for a step of the acks' own.
        At Window = BatchSize without Sync the publisher's next batch mostly
        comes before the acks of its last, so every batch took two steps and
        the ready queue's path; with Sync the acks mostly come first, while
        the commit before waits for the disk. The wait ends with the acks of
        the last subscriber waited for; an awaited ack waits with it for the
        others, even with messages ready for its subscriber. A subscriber whose
        acks did not come in time is not waited for again until its next acks
        come: a slow one would hold every publish up for the whole wait, where
        so it holds up at most one publish a batch it takes."""
        if self.stale:  # op is the first op counted
            self.may_wait, self.stale, self._acking, self._awaited = True, False, {}, set()
        elif not self.may_wait:
            return False
        if type(op) is Written:  # a written batch of an AckRequired: false topic: one-way acks
            sub: str | None = op.subscriber
            req = None
        else:
            if req is None:
                req = request_of(op)
                if req is None:
                    self.may_wait = False
                    return False
            # Acks that owe no reply ("" when they name no subscriber)
            one_way = req.id is UNSET and req.messages is None and req.command is None and req.acks is not None
            sub = (req.subscriber or "") if one_way else None
        if sub is not None:
            if sub in self._late:
                self._late.discard(sub)
            self._acking[sub] = None
            if sub in self._awaited:
                self._awaited.discard(sub)
                self.may_wait = bool(self._awaited)
            else:
                self.may_wait = sub not in self._broker.backlog
            return self.may_wait
        assert req is not None
        if req.acks is not None and req.subscriber in self._late:  # acks that owe a reply
            self._late.discard(req.subscriber)
        if not req.messages or req.topic is None:  # a publish without a Topic waits for no acks: it is refused
            self.may_wait = False
            return False
        awaiting = self._broker.awaiting_acks(req.topic)
        if not awaiting:
            self.may_wait = False
            return False
        awaited = set(awaiting).difference(self._acking, self._late)
        self._awaited.update(awaited)
        self.may_wait = bool(awaited)
        return self.may_wait
