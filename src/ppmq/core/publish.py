"""Publishing (PROTOCOL §3 Fan-out, Dedupe, Keys, Expiry; §6 MaxMessages, MaxBytes,
OverflowPolicy): how a message gets into the store and into every subscriber's queue.

A batch without
dedupe or limits is stored with one store write for all of it; a key that may
come twice or a limit that may drop a message takes it one by one, each seeing
the last. Nothing is counted before a limit has let a message in, so a refused
message leaves no trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat
from operator import itemgetter

import msgspec

from ppmq.config import TopicConfig
from ppmq.core import events as ev
from ppmq.core.events import StepEvents
from ppmq.core.queues import Queues
from ppmq.core.staging import Staging
from ppmq.core.topology import Topology
from ppmq.core.validate import Prepared, prepared
from ppmq.errors import StoreFull
from ppmq.protocol import messages as p
from ppmq.store.schema import FLIGHT_ENTRY, TAKEN_FRAGMENT, Body, Taken
from ppmq.store.state import State, SubStats, TopicStats
from ppmq.store.store import Txn

_PRIO = itemgetter(1)  # of a Prepared, read in C


# The journal's columns of messages just stored, in the order of its `publish` record:
# their ids (consecutive: the topic's next), priorities, sizes (of their JSON as
# delivered) and expiries. A plain tuple: built inline, with no call.
Stored = tuple[range, Sequence[int], Sequence[int], Sequence[int]]


class Publisher:
    """Stores published messages and queues them for their subscribers."""

    def __init__(self, state: State, topology: Topology, events: StepEvents, queues: Queues, staging: Staging) -> None:
        self._state = state
        self._topology = topology
        self._events = events
        self._queues = queues
        self._staging = staging
        # What makes room under OverflowPolicy drop-oldest: Settlement.discard,
        # given once the settlement exists (it publishes dead letters through this).
        self.discard: Callable[[Txn, str, int, int, str], list[SubStats]] = _not_given

    def publish(self, txn: Txn, topic: TopicConfig, prepared: list[Prepared], now_ns: int, subs: list[str] | None = None) -> None:
        """Counted as published once stored: a refused dead-letter copy is not.
        `subs`: the subscribers that get the messages (a redrive's one); default all."""
        t, stats = self._state.topic_ids[topic.name], self._state.topics[topic.name]
        subs = topic.subscribers if subs is None else subs
        if not subs or not prepared:
            pass  # nobody to deliver to, like a fanout exchange without queues; or nothing to store
        elif (
            not topic.dedupe
            and (stored := self._store_new(txn, topic, t, stats, sorted(prepared, key=_PRIO) if prepared[1:] else prepared, now_ns, subs))
            is not None
        ):
            # The whole batch at once, its ids by priority, then by place in the
            # publish: delivery order is the same (priority, then publish order),
            # but a batch of one priority then takes a run of consecutive ids,
            # which its ack releases and deletes as whole rows (store/schema.py)
            # instead of cutting every third id out of them. Sorted stably, in C.
            # A limited topic's batch too, when all of it fits.
            if self._events.journaled:
                self._events.publish(topic.name, *stored, False)
        elif topic.dedupe and (not topic.limited or self._room_for_all_new(topic, len(prepared))):
            self._publish_deduped(txn, topic, t, stats, prepared, now_ns, subs)
        else:
            journaled = []  # (id, prio, size, expires_ns, replaced) of each message stored
            for i, msg in enumerate(prepared):  # one by one: a limit may drop, and what it drops depends on the last
                key = msg[0]
                old = txn.get_dedupe(t, key) if key is not None else None
                if old is not None:
                    journaled.append(self._replace_row(txn, topic, t, old, msg, now_ns))
                    continue
                try:
                    stored = self._store_new(txn, topic, t, stats, [msg], now_ns, subs, make_room=True)
                except StoreFull as exc:
                    raise StoreFull(f"Messages[{i}]: {exc}") from None
                assert stored is not None  # make_room: stored, or StoreFull raised
                journaled.extend(zip(*stored, repeat(False)))
            if self._events.journaled and journaled:
                self._events.publish(topic.name, *zip(*journaled))
        stats.published += len(prepared)

    def _publish_deduped(
        self, txn: Txn, topic: TopicConfig, t: int, stats: TopicStats, prepared: list[Prepared], now_ns: int, subs: list[str]
    ) -> None:
        """A Dedupe topic's batch (with room for all of it): each message sees the ones
        before it, as if stored one by one, but the new keys between two
        replacements are stored together, with one store write for the run. A
        key already in the run ends it: the run is stored, and the key then
        replaces its first version."""
        journaled: list[tuple[int, int, int, int, bool]] = []  # (id, prio, size, expires_ns, replaced)
        run: list[Prepared] = []
        keys: set[bytes] = set()  # the run's
        seen: set[bytes] = set()  # the publish's so far

        def store_run() -> None:
            if run:
                stored = self._store_new(txn, topic, t, stats, run, now_ns, subs)
                assert stored is not None  # there is room for all of the publish (_room_for_all_new)
                journaled.extend(zip(*stored, repeat(False)))
                run.clear()
                keys.clear()

        # Each key's message as the store held it before this publish, in one pass;
        # a key the publish met before is looked up again, once its run is stored.
        for msg, old in zip(prepared, txn.dedupe_ids(t, [msg[0] for msg in prepared])):
            key = msg[0]
            if key in seen:
                if key in keys:
                    store_run()
                old = txn.get_dedupe(t, key)
            elif key is not None:
                seen.add(key)
            if old is None:
                run.append(msg)
                if key is not None:
                    keys.add(key)
                continue
            store_run()
            journaled.append(self._replace_row(txn, topic, t, old, msg, now_ns))
        store_run()
        if self._events.journaled and journaled:
            self._events.publish(topic.name, *zip(*journaled))

    def _replace_row(self, txn: Txn, topic: TopicConfig, t: int, old: int, msg: Prepared, now_ns: int) -> tuple[int, int, int, int, bool]:
        """msg replaces message `old` of its key; its row of the journal's columns."""
        _, prio, expires_ns, *_ = msg
        return old, prio, self._replace(txn, topic, t, old, msg, now_ns), expires_ns, True

    def publish_staged(self, txn: Txn, topic: TopicConfig, req: p.Request, now_ns: int) -> bool:
        """A publish too large for one step: queued on arrival, then one chunk per
        step stored unseen; True in the step that makes it whole, and visible:
        counted here, journaled with this request, in this transaction."""
        job = self._staging.job_of(req)
        if job is None:
            self._staging.queue(req, topic, now_ns, self._events.journaled)
            return False
        t = self._state.topic_ids[topic.name]
        stats = self._state.topics[topic.name]
        subs = [self._state.sub_ids[name] for name in topic.subscribers]
        if not self._staging.store_chunk(txn, job, topic, t, subs, stats, self._topology.config.max_message_bytes):
            return False
        stats.stored += sum(job.ready)
        stats.stored_bytes += job.stored_bytes
        stats.published += job.done
        for name in topic.subscribers:
            self._queues.of(txn, topic.name, name).reveal(job.ready)
        if job.event is not None:
            self._events.file(job.event)
        return True

    def _store_new(
        self,
        txn: Txn,
        topic: TopicConfig,
        t: int,
        stats: TopicStats,
        batch: list[Prepared],
        now_ns: int,
        subs: list[str],
        *,
        make_room: bool = False,
    ) -> Stored | None:
        """Store messages with new ids for `subs`, each store write once for the
        whole batch; return the journal's columns of them. A limited topic that
        has no room for all of them: None, with nothing written; with
        `make_room`, a batch of one makes room by its OverflowPolicy instead."""
        # The batch's columns, gathered as its messages are made: each one's key,
        # priority, expiry and due time, and its entry in the queues (one shared by every queue).
        keys: list[bytes] = []
        prios: list[int] = []
        expiries: list[int] = []
        dues: list[int] = []
        new: list[Taken] = []
        first = stats.seq + 1
        plain, expiring, expires_bytes = p.GENERATED_FRAGMENT, p.GENERATED_EXPIRING_FRAGMENT, p.expires_bytes
        # Only a subscriber that reads now keeps them fresh, to be taken in this
        # step or from its tail: the in-flight entries are packed for it, not for
        # a backlog nobody reads now.
        readers = self._queues.readers
        flight_entry = FLIGHT_ENTRY.pack if not readers.isdisjoint(subs) else None
        for m, (key, prio, expires_ns, payload, due_ns, origin) in enumerate(batch, first):  # Prepared, unpacked in C
            prios.append(prio)
            expiries.append(expires_ns)
            dues.append(due_ns)
            if key is None and not expires_ns and origin is None:  # the common message, in one step
                key, fragment = b"%d" % m, plain % (m, payload, prio)
            elif key is None and origin is None:  # one with a TTL, or a MaxAge
                key, fragment = b"%d" % m, expiring % (m, payload, prio, expires_bytes(expires_ns))
            else:
                key = b"%d" % m if key is None else key  # generated keys: the message id, unique per topic, never reused
                fragment = p.message_fragment(key, payload, prio, expires_ns, origin)
            keys.append(key)
            new.append((m, prio, m, 1, now_ns, fragment, b"" if flight_entry is None else flight_entry(m, prio, m, 1, now_ns), expires_ns))
        fragments = [*map(TAKEN_FRAGMENT, new)]
        sizes = [*map(len, fragments)]
        size = sum(sizes)
        count = m - first + 1  # the loop's last id is the batch's
        if (topic.max_messages or topic.max_bytes) and self._passes_limit(topic, count, size) is not None:  # topic.limited
            if not make_room:
                return None
            self._make_room(txn, topic, t, size)  # may drop older ones, or refuse before anything is written
        stats.stored_bytes += size
        stats.seq = first + count - 1
        stats.stored += count
        txn.put_messages(t, first, prios, now_ns, expiries, keys, fragments, dedupe=topic.dedupe, expire=topic.expire)
        # One expired already is expired by the batch that meets it in the queue.
        may_stay_fresh = [not 0 < expires_ns <= now_ns for expires_ns in expiries] if topic.expire else None
        due = dues if any(dues) else None  # None: none waits (PROTOCOL §8 Delay)
        self._queues.add_new(txn, topic.name, subs, new, may_stay_fresh, due)
        sub_ids = self._topology.sub_ids_of[topic.name] if subs is topic.subscribers else [self._state.sub_ids[name] for name in subs]
        txn.put_new_holders(t, sub_ids, first, prios)
        return range(first, first + count), prios, sizes, expiries

    # --- per-topic limits: MaxMessages, MaxBytes, OverflowPolicy ---------------------------

    def _make_room(self, txn: Txn, topic: TopicConfig, t: int, size: int) -> None:
        """Room for one more message of `size` bytes, or StoreFull; under
        `drop-oldest` the oldest message of the lowest priority waiting in a
        queue goes first. Raises before any change if nothing can be dropped."""
        if not topic.limited:
            return
        if topic.max_bytes and size > topic.max_bytes:
            raise StoreFull(f"{size} bytes exceeds MaxBytes ({topic.max_bytes}) of topic {topic.name!r}")
        while True:
            limit = self._passes_limit(topic, 1, size)
            if limit is None:
                return
            victim = None
            if topic.overflow_policy == "drop-oldest":
                self._queues.settle_topic(txn, topic.name)  # the oldest may be fresh
                victim = self._oldest_lowest(txn, topic, t)
            if victim is None:
                raise StoreFull(f"topic {topic.name!r} is full: {limit} reached")
            self.discard(txn, topic.name, t, victim, ev.OVERFLOW)
            self._state.topics[topic.name].dropped += 1

    def _room_for_all_new(self, topic: TopicConfig, count: int) -> bool:
        """A Dedupe topic's publish of `count` could not pass its limits even if
        every message were new, so none would make room (and none drop a message
        whose key the publish looked up). Only MaxMessages is known before the
        messages' JSON is built: under MaxBytes, a publish makes room one by one."""
        return not topic.max_bytes and self._passes_limit(topic, count, 0) is None

    def _passes_limit(self, topic: TopicConfig, count: int, size: int) -> str | None:
        """The limit (PROTOCOL §3 MaxMessages, MaxBytes) that `count` more messages
        of `size` bytes in all would pass, as an error names it; None if none."""
        stats = self._state.topics[topic.name]
        if topic.max_messages and stats.stored + count > topic.max_messages:
            return f"MaxMessages ({topic.max_messages})"
        if topic.max_bytes and stats.stored_bytes + size > topic.max_bytes:
            return f"MaxBytes ({topic.max_bytes})"
        return None

    def _oldest_lowest(self, txn: Txn, topic: TopicConfig, t: int) -> int | None:
        """The message at the head of the lowest non-empty priority of any of the
        topic's queues (the smallest position among them); None if all are empty."""
        for prio in reversed(range(topic.priorities)):
            heads = [h for name in topic.subscribers if (h := txn.first_ready(t, self._state.sub_ids[name], prio)) is not None]
            if heads:
                return min(heads, key=lambda h: h.pos).msg
        return None

    def _replace(self, txn: Txn, topic: TopicConfig, t: int, m: int, msg: Prepared, now_ns: int) -> int:
        """PROTOCOL §3 Dedupe: the newest version wins, and each subscriber's queue
        decides where it goes (Queue.place_version). Returns the size of the new
        version's JSON."""
        key, prio, expires_ns, _, due_ns, _ = msg
        assert key is not None  # only a message with a key replaces another
        self._queues.settle_topic(txn, topic.name)  # the old version may be fresh: its place must be a row
        stats = self._state.topics[topic.name]
        stats.replaced += 1
        new_pos: list[int] = []

        def next_pos() -> int:  # one new place for every subscriber that moves it
            if not new_pos:
                new_pos.append(self.next_position(topic.name))
            return new_pos[0]

        holders = txn.get_holders(t, m)
        places = dict(holders)
        for name in topic.subscribers:
            queue = self._queues.of(txn, topic.name, name)
            holders[queue.s] = queue.place_version(m, holders.get(queue.s), prio, next_pos, due_ns)
        if holders != places:  # a version that waits where the old one did changes no holder
            txn.put_holders(t, m, holders)
        fragment = _fragment(key, msg)
        self._put_version(txn, topic, t, m, Body(prio, now_ns, expires_ns, key, fragment))
        return len(fragment)

    def retime(self, txn: Txn, topic: TopicConfig, t: int, m: int, expires_ns: int) -> None:
        """m gets a new Expires (0: never), also in the JSON it is delivered as
        (PROTOCOL §9, PHPMQ's re-queue); its other fields stay as they are."""
        body = txn.get_body(t, m)
        if body is None:
            return
        self._put_version(txn, topic, t, m, body._replace(expires_ns=expires_ns, fragment=fragment_expiring(body, expires_ns)))

    def _put_version(self, txn: Txn, topic: TopicConfig, t: int, m: int, body: Body) -> None:
        """A new version of m in place of the old one, with its expiry index entry
        and the topic's byte count following."""
        old = txn.replace_message(t, m, body, expire=topic.expire)
        if old is not None:
            self._state.topics[topic.name].stored_bytes += len(body.fragment) - len(old.fragment)

    def next_position(self, topic: str) -> int:
        """A queue place after every message of the topic queued so far: places
        and message ids come from the same sequence."""
        stats = self._state.topics[topic]
        stats.seq += 1
        return stats.seq


def _not_given(*args: object) -> list[SubStats]:
    raise RuntimeError("Publisher.discard is given by the broker that composes it")


def fragment_expiring(body: Body, expires_ns: int) -> bytes:
    """The JSON a stored message is delivered as, with another Expires (0: none)."""
    payload, origin = p.fragment_parts(body.fragment)
    return _fragment(
        body.key, prepared(body.key, body.priority, expires_ns, payload, origin=None if origin is None else msgspec.json.encode(origin))
    )


def _fragment(key: bytes, msg: Prepared) -> bytes:
    """A message's JSON as delivered, under the key it is stored with."""
    _, prio, expires_ns, payload, _, origin = msg
    return p.message_fragment(key, payload, prio, expires_ns, origin)
