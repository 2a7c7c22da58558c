"""Dispatching: the batches a step pushes, and those a TAKE gets (PROTOCOL §3 Window, Order).

A batch takes a subscription's fresh messages (core/queues.py) when they are its
whole queue, else reads the ready rows. A subscriber with Connections > 1 is
filled per lane (core/laning.py).
"""

from __future__ import annotations

from collections.abc import Container

from ppmq.config import TopicConfig
from ppmq.core.events import Column, StepEvents
from ppmq.core.lanes import Lanes, room
from ppmq.core.laning import LaneRouter
from ppmq.core.ops import Delivery
from ppmq.core.publish import fragment_expiring
from ppmq.core.queues import Queues
from ppmq.core.settlement import Settlement
from ppmq.core.topology import Topology
from ppmq.protocol import messages as p
from ppmq.store.counters import Ledger
from ppmq.store.schema import TAKEN_FRAGMENT, Taken
from ppmq.store.state import NS, State, SubStats
from ppmq.store.store import Txn


class Dispatcher:
    """Fills open subscribers' Windows with batches, and keeps which subscribers have a backlog."""

    def __init__(
        self,
        state: State,
        topology: Topology,
        events: StepEvents,
        ledger: Ledger,
        queues: Queues,
        settlement: Settlement,
        router: LaneRouter,
    ) -> None:
        self._state = state
        self._topology = topology
        self._events = events
        self._ledger = ledger
        self._queues = queues
        self._settlement = settlement
        self._router = router
        # subscriber -> the topics where it had messages ready when the last step ended:
        # with the topics a step touches, where a fill looks, so that a step costs
        # what its topics cost, not what every topic of an open subscriber does;
        # the same dict for the broker's life, which the server reads between steps
        self.backlog: dict[str, set[str]] = {}
        # (topic, subscriber) of each subscription the last fill left with nothing ready
        self.emptied: dict[tuple[str, str], bool] = {}

    def pending(self, open_subs: set[str]) -> list[tuple[str, int, TopicConfig, SubStats]]:
        """(subscriber, topic's place in the config, topic, counters) of each
        subscription of `open_subs` that may have a batch: those with messages
        ready as the last step left them, and those of the topics touched since;
        in the order they are filled, subscriber by name, then topics in config
        order."""
        topology, touched, subs = self._topology, self._ledger.touched, self._state.subs
        topics, order, by_name = topology.topics, topology.topic_order, topology.subs_by_name
        found: list[tuple[str, int, TopicConfig, SubStats]] = []
        mixed = False  # found in more than one place: sorted at the end
        for name in touched:
            if name in topics:
                topic, place, held = topics[name], order[name], subs.peek(name, {})
                mixed = mixed or bool(found)
                for sub in by_name[name]:
                    if sub in open_subs and sub in held:
                        found.append((sub, place, topic, held[sub]))
        if self.backlog:
            for sub, names in self.backlog.items():
                if sub in open_subs:
                    mixed = True
                    found += [
                        (sub, order[name], topics[name], stats)
                        for name in names - touched
                        if name in topics and (stats := subs.peek(name, {}).get(sub)) is not None
                    ]
        if mixed and found[1:]:
            found.sort()  # (subscriber, place) is unique: the topics and counters are never compared
        return found

    def note_backlog(self, topics: set[str], emptied: Container[tuple[str, str]] = ()) -> None:
        """After a step: whether each subscription of `topics` has messages ready;
        those `emptied` (the step's fill left them none) are known to have none.
        A subscriber with none anywhere leaves the index, so that an empty index
        says at a glance that no subscriber waits."""
        backlog, by_name, subs = self.backlog, self._topology.subs_by_name, self._state.subs
        for name in topics:
            if name not in by_name:
                continue  # a topic no config names: its counters went with it
            held: dict[str, SubStats] | None = None  # looked up only for a subscription the fill did not empty
            for sub in by_name[name]:
                if (name, sub) in emptied:
                    ready = False
                else:
                    if held is None:
                        held = subs.peek(name, {})
                    ready = sub in held and any(held[sub].ready)
                if ready:
                    backlog.setdefault(sub, set()).add(name)
                elif sub in backlog:
                    names = backlog[sub]
                    names.discard(name)
                    if not names:
                        del backlog[sub]

    def index_backlog(self) -> None:
        """The backlog index anew, from every topic (at start and after a reload)."""
        self.backlog.clear()
        self.note_backlog(set(self._state.subs.keys()))

    def space(self, sub: str, topic: TopicConfig, stats: SubStats, lanes: Lanes | None = None) -> int:
        """How many messages of topic sub's next batch may take now, from its
        counters `stats` there (PROTOCOL §3 Batches and window): with lanes, to
        its least loaded lane, and all lanes' Windows cap what is in flight in
        all; 0 also when a reload lowered Window below what is in flight, and
        while it is paused (PROTOCOL §8). Read from the counters alone, so the
        writer can ask it between steps; they are read first, since after a
        batch there is mostly nothing ready."""
        if stats.paused or not any(stats.ready):
            return 0
        topology = self._topology
        batch_size, room_left = topology.sub_configs[sub].batch_size, topology.in_flight_max[sub] - stats.inflight
        limit = batch_size if batch_size < room_left else room_left
        if limit <= 0:
            return 0
        return limit if lanes is None else min(limit, room(lanes, topic.name, topology.windows[sub])[1])

    def awaiting_acks(self, topic: str) -> list[str]:
        """The push subscribers of topic whose acks a publish to it is worth
        waiting for (server/gathering.py): no room left in their Window, and at most a
        batch ready. Applied before it, those acks make the room its messages
        go straight into flight with, from memory (with nothing ready), or the
        room for the batch ready before them; applied after it, they need a step
        of their own. A subscriber with more ready is behind anyway, and a
        publisher is not held back by a slow one. Read from the counters
        alone, between steps."""
        topics = self._topology.topics
        if topic not in topics:
            return []
        subs, configs, in_flight_max = self._state.subs.peek(topic, {}), self._topology.sub_configs, self._topology.in_flight_max
        awaited = []  # mostly none: built by a loop, which costs no call then
        for sub in topics[topic].subscribers:
            try:
                stats = subs[sub]
            except KeyError:  # a reload on the writer thread dropped it meanwhile
                continue
            if (
                stats.inflight >= in_flight_max[sub]
                and stats.inflight
                and not stats.paused
                and not configs[sub].pull
                and sum(stats.ready) <= configs[sub].batch_size
            ):
                awaited.append(sub)
        return awaited

    def fill(self, txn: Txn, open_subs: set[str], now_ns: int) -> list[Delivery]:
        """Batches for every open subscriber, as many as its Window allows: one
        batch a step would leave a subscriber that fell one batch behind (say,
        connecting after the first publish) behind for good, taking every new
        message through the ready queue instead of straight into flight."""
        out = []
        emptied = self.emptied = {}
        router = self._router
        lanes, last = None, None
        for sub, _, topic, stats in self.pending(open_subs):
            if router.lanes and sub != last:
                lanes, last = router.lanes_of(sub, router.lanes), sub
            while (limit := self.space(sub, topic, stats, lanes)) > 0:
                batch = self.batch(txn, sub, topic, limit, now_ns)
                if batch is None:
                    break
                ids, fragments, drained = batch
                delivery = Delivery(sub, topic.name, ids, p.batch_frame(topic.name, sub, fragments), not topic.ack_required)  # auto_ack
                out.append(delivery if lanes is None else router.to_lane(sub, delivery, lanes))
                if drained or not any(stats.ready):  # the usual batch takes all that is ready
                    emptied[topic.name, sub] = True
                    break
        return out

    def batch(
        self, txn: Txn, sub: str, topic: TopicConfig, limit: int, now_ns: int, max_bytes: int = 0
    ) -> tuple[list[int], list[bytes], bool] | None:
        """The next batch for sub, now in flight and journaled, pushed or taken
        (PROTOCOL §9): its ids, its messages as sub receives them, and whether
        it is known to have taken all that sub had ready (fewer than `limit`
        fresh ones), at most `limit` of them and, given `max_bytes`, as many as
        that many bytes hold (at least one). Its fresh messages when they are
        its whole queue, else from the ready rows; expired ones met on the way
        are expired."""
        deadline = now_ns + int(topic.ack_retry * NS) if topic.ack_retry and topic.ack_required else 0
        queue, taken, ids = self._queues.take_fresh(txn, topic.name, sub, limit, deadline, max_bytes)
        pub_ns: Column
        attempts: Column
        if taken is not None:  # fresh: published in this very step, each on its first delivery
            fragments, pub_ns, attempts = [*map(TAKEN_FRAGMENT, taken)], now_ns, 1
            drained = not max_bytes and len(ids) < limit  # fewer than limit: all that was ready
        else:
            t, s = queue.t, queue.s
            own = txn.copy_expiries(t, s)  # copies a PHPMQ re-queue gave an expiry of their own (PROTOCOL §9)
            pulled = queue.pull(limit, deadline, now_ns if topic.expire else 0, own, max_bytes)
            for m in pulled.expired:
                if m in own:
                    self._settlement.expire_copy(txn, topic.name, t, s, m)
                else:
                    self._settlement.expire(txn, topic.name, t, m)
            if not pulled.entries:
                return None
            taken = pulled.entries if not own else [self._with_own_expiry(txn, t, entry, own) for entry in pulled.entries]
            ms, _, _, attempts, pub_ns, frags, _, _ = zip(*taken)  # the columns, in C
            ids, fragments, drained = list(ms), list(frags), False
        if self._events.journaled:
            self._events.deliver(topic.name, sub, ids, pub_ns, attempts, map(len, fragments))
        if self._topology.sub_configs[sub].metadata:
            fragments = p.with_metadata(fragments, attempts, pub_ns)
        return ids, fragments, drained

    def _with_own_expiry(self, txn: Txn, t: int, entry: Taken, own: dict[int, int]) -> Taken:
        """A taken entry as its copy is delivered: with the copy's own Expires if it has one."""
        m = entry[0]
        body = txn.get_body(t, m) if m in own else None
        if body is None:
            return entry
        return (*entry[:5], fragment_expiring(body, own[m]), entry[6], own[m])
