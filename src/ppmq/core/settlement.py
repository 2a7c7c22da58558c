"""How a message leaves a subscriber's flight (PROTOCOL §3 Acks, Connections,
RECONNECT, Expiry): done with (acked, written, expired, dropped), given back
to its place in the queue (a nack, an unwritten batch, RECONNECT, AckRetry), or
given up on (MaxAttempts, with a copy to the DeadLetter topic).

Whatever finishes a message for one subscriber goes through `release`, so the last subscriber out
deletes it, once, with its index entries and its topic's counters.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

import msgspec

from ppmq.config import TopicConfig
from ppmq.core import events as ev
from ppmq.core.events import StepEvents
from ppmq.core.ops import Requeue, Unwritten
from ppmq.core.publish import Publisher
from ppmq.core.queues import Queue, Queues
from ppmq.core.taker_holdings import TakerHoldings
from ppmq.core.topology import Topology
from ppmq.core.validate import MAX_KEY_BYTES, prepared
from ppmq.errors import NotFound, StoreFull
from ppmq.protocol import messages as p
from ppmq.store.schema import Body, Flight
from ppmq.store.state import NS, State, SubStats
from ppmq.store.store import Txn

log = logging.getLogger("ppmq.broker")

TICK_NS = NS  # expiry and redelivery run at least this often
DEAD_LETTER_REASON = {ev.EXPIRE: "expired", ev.OVERFLOW: "overflow"}  # PROTOCOL §8 DeadLetterReasons
PER_TICK = 10_000  # expiries or redeliveries in one transaction; the rest go in the next tick
ID_DIGITS = 20  # a generated key has fewer digits than this (ids are below 10**19)
_int_list, _int = msgspec.json.Decoder(list[int]).decode, msgspec.json.Decoder(int).decode


class Settlement:
    """Acks, nacks, rejects, touches, redeliveries, expiries and dead letters."""

    def __init__(
        self, state: State, topology: Topology, events: StepEvents, queues: Queues, takers: TakerHoldings, publisher: Publisher
    ) -> None:
        self._state = state
        self._topology = topology
        self._events = events
        self._queues = queues
        self._takers = takers
        self._publisher = publisher

    # --- acks --------------------------------------------------------------------------------

    def ack(
        self, txn: Txn, topic: TopicConfig, sub: str, keys: list[str] | None, msgs: Sequence[int | None] = (), reason: str | None = None
    ) -> int:
        """sub is done with the messages `keys` name (PROTOCOL §3 Acks), or, without
        keys, with `msgs` (a written batch, Reason AutoAck); how many were in
        flight. The usual ack names one message by its generated key."""
        if keys is not None:
            msgs = [generated_id(keys[0])] if len(keys) == 1 and not topic.dedupe else self.msgs_of(txn, topic, keys)
        name = topic.name
        ids, n, queue = self._queues.ack(txn, name, sub, msgs)
        if not n:
            return 0
        if sub not in self._topology.pushed:  # only a Pull subscriber's messages have takers (or one no config names)
            self._takers.release((name, sub), ids)  # whichever connection acks (PROTOCOL §9)
        if self._events.journaled:
            self._events.ack(name, sub, reason, ids)
        t = queue.t
        done = txn.release_holders(t, queue.s, ids)  # release, written out: an ack is the usual way out
        if done:
            self._delete_messages(txn, name, t, done)
        return n

    def msgs_of(self, txn: Txn, topic: TopicConfig, keys: list[str]) -> Sequence[int | None]:
        """The message each key names (PROTOCOL §3 Keys), None for one that names none."""
        if not topic.dedupe:
            return generated_ids(keys)
        # a key too long to be stored (or looked up) names none
        encoded = [key if len(key) <= MAX_KEY_BYTES else None for key in map(str.encode, keys)]
        return txn.dedupe_ids(self._state.topic_ids[topic.name], encoded)

    # --- nacks, rejects, touches (PROTOCOL §8) -------------------------------------------------

    def nack_keys(self, txn: Txn, topic: TopicConfig, sub: str, keys: list[str], delay_ns: int) -> int:
        """Each key in flight to sub goes back to its place, waiting there `delay_ns`
        if given; a delivery attempt, so MaxAttempts may give it up instead."""
        t, s, now_ns = self._state.topic_ids[topic.name], self._state.sub_ids[sub], self._events.now_ns
        journaled, nacked = self._events.journaled, 0
        for m in self.msgs_of(txn, topic, keys):
            back = None if m is None else self._give_back_unjournaled(txn, t, s, m, now_ns, now_ns + delay_ns if delay_ns else 0)
            if back is None:
                self._state.subs[topic.name][sub].ignored_acks += 1
                continue
            nacked += 1
            if journaled:
                flight, given_up = back
                self._delivered_event(ev.NACK, topic.name, sub, flight).delay_ns = delay_ns or None
                if given_up:
                    self._events.batch(ev.REQUEUE, topic.name, sub, "MaxAttempts").ids.append(flight.m)
        return nacked

    def reject_keys(self, txn: Txn, topic: TopicConfig, sub: str, keys: list[str]) -> int:
        """Each key in flight to sub is given up on now: dead-lettered with reason
        `rejected`, or dropped when the topic keeps no such dead letters."""
        queue, now_ns = self._queues.of(txn, topic.name, sub), self._events.now_ns
        rejected = 0
        for m in self.msgs_of(txn, topic, keys):
            flight = None if m is None else queue.unflight(m)
            if flight is None:
                queue.stats.ignored_acks += 1
                continue
            rejected += 1
            if self._events.journaled:
                self._delivered_event(ev.REJECTED, topic.name, sub, flight)
            self._give_up(txn, topic, queue.s, flight, "rejected", now_ns)
        return rejected

    def touch_keys(self, txn: Txn, topic: TopicConfig, sub: str, keys: list[str]) -> int:
        """Each key in flight to sub gets AckRetry from now (no effect without AckRetry)."""
        ms = [m for m in self.msgs_of(txn, topic, keys) if m is not None]
        queue = self._queues.of(txn, topic.name, sub)
        queue.stats.ignored_acks += len(keys) - len(ms)
        deadline_ns = self._events.now_ns + int(topic.ack_retry * NS) if topic.ack_retry and topic.ack_required else 0
        touched = queue.touch(ms, deadline_ns)
        if self._events.journaled:
            self._events.batch(ev.TOUCH, topic.name, sub).ids.extend(touched)
        return len(touched)

    def _delivered_event(self, kind: str, topic: str, sub: str, flight: Flight) -> ev.Event:
        """The event of `kind` for sub, with the flight's message added to its columns."""
        event = self._events.batch(kind, topic, sub)
        assert event.pub_ns is not None and event.attempts is not None  # the columns of a nack's, reject's kind
        event.ids.append(flight.m)
        event.pub_ns.append(flight.publish_ns)
        event.attempts.append(flight.attempts)
        return event

    def release(self, txn: Txn, topic: str, t: int, s: int, ms: list[int]) -> None:
        """Subscriber s is done with ms; the last one out deletes a message."""
        done = txn.release_holders(t, s, ms)
        if done:
            self._delete_messages(txn, topic, t, done)

    def _delete_messages(self, txn: Txn, topic: str, t: int, ms: list[int]) -> None:
        topics = self._topology.topics  # without the topic, being dropped: remove any index entry
        count, size = txn.delete_messages(t, ms, dedupe=topic not in topics or topics[topic].dedupe)
        stats = self._state.topics[topic]
        stats.stored -= count
        # max(): a store written before this counter existed holds uncounted bytes
        stats.stored_bytes = stats.stored_bytes - size if stats.stored_bytes > size else 0

    # --- RECONNECT, redelivery, unwritten batches ---------------------------------------

    def reconnect(self, txn: Txn, sub: str, topics: list[TopicConfig], now_ns: int) -> None:
        """PROTOCOL §3 RECONNECT: everything in flight to sub on topics goes back to its place."""
        for tc in topics:
            t, s = self._state.topic_ids[tc.name], self._state.sub_ids[sub]
            for flight in txn.inflight_of(t, s):
                self.give_back(txn, t, s, flight.m, now_ns, "Reconnect")

    def give_back(self, txn: Txn, t: int, s: int, m: int, now_ns: int, reason: str, to_end: bool = False) -> tuple[Flight, bool] | None:
        """Given back to its place in the queue (or, `to_end`, to the end of its
        priority), as if it had not been delivered yet, and journaled as a
        requeue with `reason`; after MaxAttempts deliveries, given up on
        (dead-lettered) instead. Returns what `_give_back_unjournaled` does."""
        stats = self._stats(t, s)
        if stats is None:  # a subscription no config names: nothing counts it
            flight = txn.pop_flight(t, s, m)
            if flight is not None:
                txn.push_ready(t, s, flight.prio, flight.pos, m, flight.attempts)
            return None
        back = self._give_back_unjournaled(txn, t, s, m, now_ns, to_end=to_end)
        if back is not None and self._events.journaled:
            reason = "MaxAttempts" if back[1] else reason
            self._events.batch(ev.REQUEUE, self._topology.topic_by_id[t], self._topology.sub_by_id[s], reason).ids.append(m)
        return back

    def _give_back_unjournaled(
        self, txn: Txn, t: int, s: int, m: int, now_ns: int, due_ns: int = 0, to_end: bool = False
    ) -> tuple[Flight, bool] | None:
        """m leaves flight to s: back to its place (waiting there until `due_ns`
        if given; `to_end`: a new place at the end of its priority), or, after
        its MaxAttempts-th delivery, given up on. No event: `give_back` and a
        nack each journal it their own way. Returns its flight and whether
        it was given up on; None if it was not in flight."""
        stats = self._stats(t, s)
        assert stats is not None  # a subscription the config names: the callers checked
        queue = Queue(txn, t, s, stats)
        flight = queue.unflight(m)
        if flight is None:
            return None
        topic = self._topology.topics[self._topology.topic_by_id[t]]
        if topic.max_attempts and flight.attempts >= topic.max_attempts:
            self._give_up(txn, topic, s, flight, "attempts", now_ns)
            return flight, True
        if to_end:
            flight = self._moved_to_end(txn, t, s, flight)
        queue.give_back(m, flight, due_ns=due_ns)
        return flight, False

    def _moved_to_end(self, txn: Txn, t: int, s: int, flight: Flight) -> Flight:
        """flight with a place after every message of its topic queued so far,
        which its message's holders record (as a new version's, Dedupe)."""
        pos = self._publisher.next_position(self._topology.topic_by_id[t])
        holders = txn.get_holders(t, flight.m)
        holders[s] = (flight.prio, pos)
        txn.put_holders(t, flight.m, holders)
        return flight._replace(pos=pos)

    # --- PHPMQ's re-queue (PROTOCOL §9) --------------------------------------------------------

    def give_back_to_end(self, txn: Txn, op: Requeue, now_ns: int) -> p.Reply:
        """The key, in flight to the subscriber, is given back to the end of its
        priority with the new TTL, as a delivery attempt (MaxAttempts may give
        it up instead). The TTL is that subscriber's copy's alone: while another
        subscriber holds the message, the copy gets an expiry of its own and
        the others keep theirs; held by it alone, the message is given the new
        expiry. Raises the RequestError that refuses it: the connection's
        access check, or a queue a reload took away since it arrived."""
        op.check()
        topic = self._topology.topics.get(op.topic)
        if topic is None:
            raise NotFound(f"Topic: unknown topic {op.topic!r}")
        sub = self._topology.subscriber_of(op.subscriber, topic, "Requeue")
        [m] = self.msgs_of(txn, topic, [op.key])
        t, s = self._state.topic_ids[topic.name], self._state.sub_ids[sub]
        back = None if m is None else self.give_back(txn, t, s, m, now_ns, "Requeue", to_end=True)
        if m is None or back is None:
            self._state.subs[topic.name][sub].ignored_acks += 1
            return p.Reply(status=200, accepted=0)
        if not back[1]:
            expires_ns = now_ns + op.ttl_s * NS if op.ttl_s else 0
            if txn.get_holders(t, m).keys() == {s}:
                self._publisher.retime(txn, topic, t, m, expires_ns)
            else:
                txn.put_copy_expiry(t, m, s, expires_ns, expire=topic.expire)
        return p.Reply(status=200, accepted=1)

    def _give_up(self, txn: Txn, topic: TopicConfig, s: int, flight: Flight, reason: str, now_ns: int) -> None:
        """Subscriber s gives up on a message it had in flight (MaxAttempts, a
        reject): dead-lettered if the topic's DeadLetterReasons say so, else dropped."""
        t, sub = self._state.topic_ids[topic.name], self._topology.sub_by_id[s]
        self._state.subs[topic.name][sub].dead_lettered += 1
        body = txn.get_body(t, flight.m)
        if body is not None and not self._dead_letter(txn, topic, sub, body, reason, flight.attempts, now_ns):
            why = f"after {flight.attempts} deliveries without an ack" if reason == "attempts" else "which rejected it"
            log.warning(
                "topic %s: message %s dropped for subscriber %s %s (no DeadLetter)", topic.name, body.key.decode(errors="replace"), sub, why
            )
        self.release(txn, topic.name, t, s, [flight.m])

    def _dead_letter(self, txn: Txn, topic: TopicConfig, sub: str, body: Body, reason: str, attempts: int, now_ns: int) -> bool:
        """PROTOCOL §8: a copy of sub's message to the topic's DeadLetter topic,
        with no expiry and an Origin saying where from and why; False if the
        topic keeps no dead letters for `reason` (or its DeadLetter refused it)."""
        target = self._topology.topics.get(topic.dead_letter) if topic.dead_letter and reason in topic.dead_letter_reasons else None
        if target is None:
            return False
        origin = p.origin(topic.name, sub, reason, attempts, body.publish_ns, body.key, body.priority)
        copy = prepared(
            body.key if target.dedupe else None,
            min(body.priority, target.priorities - 1),
            0,
            p.fragment_payload(body.fragment),
            origin=origin,
        )
        try:
            self._publisher.publish(txn, target, [copy], now_ns)
        except StoreFull as exc:
            log.warning(
                "topic %s: message %s of subscriber %s dropped, DeadLetter refused it: %s",
                topic.name,
                body.key.decode(errors="replace"),
                sub,
                exc,
            )
            return False
        return True

    def _stats(self, t: int, s: int) -> SubStats | None:
        topic, sub = self._topology.topic_by_id.get(t), self._topology.sub_by_id.get(s)
        if topic is None or sub is None:
            return None
        return self._state.subs.get(topic, {}).get(sub)

    def give_back_unwritten(self, txn: Txn, op: Unwritten) -> None:
        """A batch not written whole to the subscriber, given back as if it had not been sent."""
        queue = self._queues.of(txn, op.topic, op.subscriber)
        event = self._events.batch(ev.RETURN, op.topic, op.subscriber) if self._events.journaled else None
        for m in op.msgs:
            if queue.give_back_unwritten(m) and event is not None:
                event.ids.append(m)

    # --- timers: expiry and AckRetry ----------------------------------------------------------

    def tick(self, txn: Txn, now_ns: int) -> None:
        for expires, t, m in txn.due_expiries(now_ns, PER_TICK):
            topic = self._topic_name(t)
            if topic is None:
                txn.remove_expiry(expires, t, m)
            else:
                self.expire(txn, topic, t, m)
        for _, t, m, s in txn.due_copy_expiries(now_ns, PER_TICK):
            topic = self._topic_name(t)
            if topic is not None:
                self.expire_copy(txn, topic, t, s, m)
            txn.drop_copy_expiries(t, [m], s)  # also of a topic or subscription no config names
        for t, s, m in txn.due_deadlines(now_ns, PER_TICK):
            self.give_back(txn, t, s, m, now_ns, "AckRetry")
        for t, s, prio, pos in txn.due_delayed(now_ns, PER_TICK):
            stats = self._stats(t, s)
            if stats is None:  # a subscription no config names: nothing would ever take it
                txn.pop_delayed(t, s, prio, pos)
            else:
                Queue(txn, t, s, stats).release_due(prio, pos)

    def _topic_name(self, t: int) -> str | None:
        name = self._topology.topic_by_id.get(t)
        return name if name in self._topology.topics else None

    def expire(self, txn: Txn, topic: str, t: int, m: int) -> None:
        """PROTOCOL §3 Expiry: gone from every queue, also from in flight; but
        a copy with an expiry of its own (PROTOCOL §9) stays until that one.
        The message then stays for those copies, out of the expiry index."""
        own = txn.copy_expiries_of(t, m)
        if not own:
            for stats in self.discard(txn, topic, t, m, ev.EXPIRE):
                stats.expired += 1
            self._state.topics[topic].expired += 1
            return
        body = txn.get_body(t, m)
        others = {self._topology.sub_by_id.get(s) for s in txn.get_holders(t, m).keys() - own.keys()}
        for stats in self.remove_copies(txn, topic, t, m, ev.EXPIRE, others):
            stats.expired += 1
        self._state.topics[topic].expired += bool(others)
        if body is not None and body.expires_ns and txn.get_body(t, m) is not None:
            txn.remove_expiry(body.expires_ns, t, m)

    def expire_copy(self, txn: Txn, topic: str, t: int, s: int, m: int) -> None:
        """A copy's own expiry (PROTOCOL §9 PHPMQ re-queue) passed: gone from
        that subscriber's queue, also from in flight; the other copies stay."""
        sub = self._topology.sub_by_id.get(s)
        for stats in self.remove_copies(txn, topic, t, m, ev.EXPIRE, {sub}):
            stats.expired += 1
            self._state.topics[topic].expired += txn.get_body(t, m) is None  # it was the message's last copy

    def discard(self, txn: Txn, topic: str, t: int, m: int, kind: str) -> list[SubStats]:
        """Remove m from every queue and from in flight, and delete it; return the
        counters of the subscribers that still held it. `kind` is the journal's word
        for why (expire, overflow), and the DeadLetterReasons word too."""
        return self.remove_copies(txn, topic, t, m, kind, None)

    def remove_copies(self, txn: Txn, topic: str, t: int, m: int, kind: str | None, only: Collection[str | None] | None) -> list[SubStats]:
        """Remove m from the queues of `only` (None: every subscriber), ready,
        delayed or in flight, copying each to DeadLetter if the topic keeps
        dead letters for `kind` (the journal's word for the removal; None: not
        journaled); the message goes when nobody holds it any more. Returns
        the counters of the subscribers it was removed for."""
        self._queues.settle_topic(txn, topic)  # m may be fresh: its place must be a row
        holders = txn.get_holders(t, m)
        body = txn.get_body(t, m)
        subs = self._state.subs[topic]
        tc = self._topology.topics.get(topic)
        removed = []
        for s, (prio, pos) in list(holders.items()):
            name = self._topology.sub_by_id.get(s)
            if only is not None and name not in only:
                continue
            del holders[s]
            if name not in subs:
                continue  # a subscription no config names: its hold goes with the message
            held = Queue(txn, t, s, subs[name]).remove(m, prio, pos)
            if held is None or body is None:
                continue
            removed.append(subs[name])
            attempts, in_flight = held
            if (
                tc is not None
                and kind in (ev.EXPIRE, ev.OVERFLOW)
                and self._dead_letter(txn, tc, name, body, DEAD_LETTER_REASON[kind], attempts, self._events.now_ns)
            ):
                subs[name].dead_lettered += 1
            if self._events.journaled and kind is not None:
                event = self._events.batch(kind, topic, name)
                event.ids.append(m)
                event.pub_ns.append(body.publish_ns)  # type: ignore[union-attr]  # the columns of a removal's kind (events.COLUMNS)
                event.delivered.append(in_flight or attempts > 0)  # type: ignore[union-attr]
        txn.put_holders(t, m, holders)
        if not holders:
            self._delete_messages(txn, topic, t, [m])
        return removed


def generated_ids(keys: list[str]) -> Sequence[int | None]:
    """generated_id of each key, checked for a whole ack wrapper at once: when
    every key is ASCII digits, none starts with 0 and none is too long, each
    names the id it spells: a few C-level passes over the keys, and the ints
    read by msgspec at once, instead of calls for every key."""
    digits, joined = "".join(keys), ",".join(keys)
    if digits.isascii() and digits.isdigit() and "" not in keys and ",0" not in "," + joined and max(map(len, keys)) < ID_DIGITS:
        return _int_list(f"[{joined}]")  # canonical decimals: a JSON array of them, read in one call
    return [generated_id(key) for key in keys]


def generated_id(key: str) -> int | None:
    """The message id a generated key names (PROTOCOL §3 Keys), or None: only the
    canonical decimal the broker writes names one, so "0002" acks nothing: ASCII
    digits, no leading 0, fewer than ID_DIGITS of them, checked by string
    methods, which cost less than a regular expression's match, and read by
    msgspec (a canonical decimal is a JSON number), which costs less than int()."""
    return _int(key) if key.isdigit() and key.isascii() and key[0] != "0" and len(key) < ID_DIGITS else None
