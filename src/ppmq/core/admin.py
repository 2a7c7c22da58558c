"""Operator commands (PROTOCOL §8): PEEK, PURGE, REDRIVE, PAUSE, RESUME and PING.

Each command runs in
the step's transaction like any request, so its effects are as durable as a
publish's and a failure leaves nothing behind. Who may send them is checked
before they get here (core/access.py, AdminUsers).
"""

from __future__ import annotations

from itertools import chain

from ppmq.config import TopicConfig
from ppmq.core import events as ev
from ppmq.core.events import StepEvents
from ppmq.core.publish import Publisher
from ppmq.core.queues import Queues
from ppmq.core.settlement import Settlement
from ppmq.core.topology import Topology
from ppmq.core.validate import prepared
from ppmq.errors import BadRequest
from ppmq.protocol import messages as p
from ppmq.store.peek import Cursor, limit_of, parts_of, peek
from ppmq.store.state import NS, State
from ppmq.store.store import Txn
from ppmq.version import ppmq_version

CHUNK = 10_000  # messages a PURGE or REDRIVE collects at a time, so a backlog is never all in memory


class Admin:
    """The operator commands, run in the step's transaction."""

    def __init__(
        self,
        state: State,
        topology: Topology,
        events: StepEvents,
        queues: Queues,
        publisher: Publisher,
        settlement: Settlement,
        started_ns: int,
    ) -> None:
        self._state = state
        self._topology = topology
        self._events = events
        self._queues = queues
        self._publisher = publisher
        self._settlement = settlement
        self._started_ns = started_ns  # PING's uptime counts from it

    def ping(self, now_ns: int) -> dict:
        return {"Version": ppmq_version(), "UptimeSeconds": round((now_ns - self._started_ns) / NS, 3)}

    def peek(self, txn: Txn, req: p.Request) -> dict:
        """PROTOCOL §8 PEEK: what the topic's queues hold, from the request's cursor on."""
        topic = self._topology.topic_for(req, "PEEK")
        self._queues.settle_all(txn)  # fresh messages are in the queues it reads
        parts, limit = parts_of(req.state), limit_of(req.limit)
        after = Cursor.decode(req.after) if req.after is not None else None
        subs = {name: self._state.sub_ids[name] for name in self._subs_named(req, topic, "PEEK")}
        return peek(txn, self._state.topic_ids[topic.name], subs, parts, limit, after)

    def purge(self, txn: Txn, req: p.Request) -> dict:
        """PROTOCOL §8 PURGE: the copies of the request's Keys (all, without Keys) go."""
        topic = self._topology.topic_for(req, "PURGE")
        self._queues.settle_all(txn)  # fresh messages are in the queues it reads
        return {"Purged": self._purge(txn, topic, self._subs_named(req, topic, "PURGE"), req.keys)}

    def redrive(self, txn: Txn, req: p.Request, now_ns: int) -> dict:
        """PROTOCOL §8 REDRIVE: dead letters back to where they came from."""
        topic = self._topology.topic_for(req, "REDRIVE")
        self._queues.settle_all(txn)  # fresh messages are in the queues it reads
        return self._redrive(txn, topic, req.keys, now_ns)

    def _subs_named(self, req: p.Request, topic: TopicConfig, field: str) -> list[str]:
        """The request's Subscriber on topic, or all of the topic's subscribers."""
        return topic.subscribers if req.subscriber is None else [self._topology.subscriber_of(req.subscriber, topic, field)]

    # --- PURGE --------------------------------------------------------------------------------

    def _purge(self, txn: Txn, topic: TopicConfig, subs: list[str], keys: list[str] | None) -> int:
        """Copies removed: those of `keys` (all, without Keys) held by `subs`,
        ready, delayed or in flight; a message nobody holds any more is deleted."""
        only, t = set(subs), self._state.topic_ids[topic.name]
        if keys is not None:
            named = self._visible(txn, topic, keys)
            return sum(len(self._settlement.remove_copies(txn, topic.name, t, m, ev.PURGE, only)) for m in named)
        purged = 0
        while ms := self._held(txn, t, subs):
            purged += sum(len(self._settlement.remove_copies(txn, topic.name, t, m, ev.PURGE, only)) for m in ms)
        return purged

    def _visible(self, txn: Txn, topic: TopicConfig, keys: list[str]) -> list[int]:
        """The messages keys name, once each, none of a publish still being staged
        (core/staging.py): until it is whole, nobody may see or touch its messages."""
        t, staged = self._state.topic_ids[topic.name], txn.staged()
        named = (m for m in self._settlement.msgs_of(txn, topic, keys) if m is not None)
        return list(dict.fromkeys(m for m in named if staged is None or not staged.hides(t, m)))

    def _held(self, txn: Txn, t: int, subs: list[str]) -> list[int]:
        """Up to CHUNK messages that `subs` hold on topic t, wherever they are."""
        ms: dict[int, None] = {}
        for name in subs:
            s = self._state.sub_ids[name]
            held = chain((e.msg for e in txn.ready_of(t, s)), (e.msg for e in txn.delayed_of(t, s)), (f.m for f in txn.inflight_of(t, s)))
            for m in held:
                ms[m] = None
                if len(ms) >= CHUNK:
                    return list(ms)
        return list(ms)

    # --- REDRIVE ------------------------------------------------------------------------------

    def _redrive(self, txn: Txn, dead: TopicConfig, keys: list[str] | None, now_ns: int) -> dict:
        """Each dead letter of `keys` (all, without Keys) back to its origin topic,
        for its origin subscriber only, as a new message at the end of its
        priority; its copy here goes. One whose origin is gone stays, skipped."""
        if not any(tc.dead_letter == dead.name for tc in self._topology.config.topics):
            raise BadRequest(f"Topic: {dead.name!r} is no topic's DeadLetter")
        t = self._state.topic_ids[dead.name]
        if keys is not None:
            ms = self._visible(txn, dead, keys)
        else:
            ms = [m for m, _ in txn.bodies_of(t)]
        redriven = skipped = 0
        for m in ms:
            if self._redrive_one(txn, dead, t, m, now_ns):
                redriven += 1
            else:
                skipped += 1
        return {"Redriven": redriven, "Skipped": skipped}

    def _redrive_one(self, txn: Txn, dead: TopicConfig, t: int, m: int, now_ns: int) -> bool:
        body = txn.get_body(t, m)
        if body is None:
            return False
        payload, origin = p.fragment_parts(body.fragment)
        target = self._topology.topics.get(origin.topic) if origin is not None else None
        if origin is None or target is None or origin.subscriber not in target.subscribers:
            return False
        key = origin.key.encode() if target.dedupe else None
        if key is not None and txn.get_dedupe(self._state.topic_ids[target.name], key) is not None:
            return False  # a newer version of the key waits there already: newest wins
        prio = min(body.priority if origin.priority is None else origin.priority, target.priorities - 1)
        self._publisher.publish(txn, target, [prepared(key, prio, 0, payload)], now_ns, [origin.subscriber])
        self._settlement.remove_copies(txn, dead.name, t, m, None, None)
        if self._events.journaled:
            self._events.batch(ev.REDRIVE, target.name, origin.subscriber).ids.append(self._state.topics[target.name].seq)
        return True

    # --- PAUSE, RESUME --------------------------------------------------------------------------

    def pause(self, req: p.Request, paused: bool) -> None:
        """The subscriber's subscriptions (or the one on Topic) stop or start being pushed."""
        topics = self._topology.topics_of_subscriber(req, "PAUSE" if paused else "RESUME")
        sub = req.subscriber
        assert sub is not None  # topics_of_subscriber refuses a request without one
        for tc in topics:
            self._state.subs[tc.name][sub].paused = paused
            if self._events.journaled:
                self._events.batch(ev.PAUSE if paused else ev.RESUME, tc.name, sub)
