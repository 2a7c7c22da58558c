"""How a message leaves a subscriber's flight (PROTOCOL §3 Acks, Connections,
RECONNECT, Expiry): done with (acked, written, expired, dropped), or back to its
place in the queue (returned, RECONNECT, AckRetry), or given up on (MaxAttempts,
with a copy to the DeadLetter topic).

A Broker part (see wiring.py for why the parts are mixins). Whatever finishes a
message for one subscriber goes through `_release`, so the last subscriber out
deletes it, once, with its index entries and its topic's counters.
"""

from __future__ import annotations

import logging

from . import events as ev
from . import protocol as p
from .config import TopicConfig
from .ops import Returned
from .queues import Queue
from .state import NS, SubStats
from .store import Txn
from .validate import MAX_KEY_BYTES, Prepared
from .wiring import Wired

log = logging.getLogger(__name__)

TICK_NS = NS  # expiry and redelivery run at least this often
PER_TICK = 10_000  # expiries or redeliveries in one transaction; the rest go in the next tick


class Completion(Wired):
    # --- acks --------------------------------------------------------------------------------

    def _ack_keys(self, txn: Txn, topic: TopicConfig, sub: str, keys: list[str]) -> int:
        t = self.state.topic_ids[topic.name]
        msgs = []
        for key in keys:
            if topic.dedupe:
                encoded = key.encode()
                m = txn.get_dedupe(t, encoded) if len(encoded) <= MAX_KEY_BYTES else None
            else:
                m = generated_id(key)
            msgs.append(m)
        return self._ack_msgs(txn, topic.name, sub, msgs)

    def _ack_msgs(self, txn: Txn, topic: str, sub: str, msgs: list[int | None], reason: str | None = None) -> int:
        queue = self._queue_of(txn, topic, sub)
        acked = queue.ack(msgs)
        if not acked:
            return 0
        ids, attempts, pub_ns = zip(*acked)
        if self._events.journaled:
            self._events.ack(topic, sub, reason, ids, pub_ns, attempts)
        self._release(txn, topic, queue.t, queue.s, list(ids))
        return len(ids)

    def _release(self, txn: Txn, topic: str, t: int, s: int, ms: list[int]) -> None:
        """Subscriber s is done with ms; the last one out deletes a message."""
        done = txn.release_holders(t, s, ms)
        if done:
            self._delete_messages(txn, topic, t, done)

    def _delete_messages(self, txn: Txn, topic: str, t: int, ms: list[int]) -> None:
        tc = self.topics.get(topic)  # None: the topic is being dropped; remove any index entry
        gone = txn.delete_messages(t, ms, dedupe=tc is None or tc.dedupe)
        stats = self.state.topics[topic]
        stats.stored -= len(gone)
        # max(): a store written before this counter existed holds uncounted bytes
        stats.stored_bytes = max(0, stats.stored_bytes - sum(g.size for g in gone))

    # --- RECONNECT, redelivery, returned batches ----------------------------------------

    def _reconnect(self, txn: Txn, sub: str, topics: list[TopicConfig], now_ns: int) -> None:
        """PROTOCOL §3 RECONNECT: everything in flight to sub on topics goes back to its place."""
        for tc in topics:
            t, s = self.state.topic_ids[tc.name], self.state.sub_ids[sub]
            for flight in txn.inflight_of(t, s):
                self._requeue(txn, t, s, flight.m, now_ns, "Reconnect")

    def _requeue(self, txn: Txn, t: int, s: int, m: int, now_ns: int, reason: str) -> None:
        """Back to its place in the queue, as if it had not been delivered yet;
        after MaxAttempts deliveries, to the dead-letter topic instead."""
        stats = self._stats(t, s)
        if stats is None:  # a subscription no config names: nothing counts it
            flight = txn.pop_flight(t, s, m)
            if flight is not None:
                txn.push_ready(t, s, flight.prio, flight.pos, m, flight.attempts)
            return
        queue = Queue(txn, t, s, stats)
        flight = queue.unflight(m)
        if flight is None:
            return
        topic = self.topics[self._topic_by_id[t]]
        if topic.max_attempts and flight.attempts >= topic.max_attempts:
            stats.dead_lettered += 1
            reason = "MaxAttempts"  # given up on; a copy may go to the DeadLetter topic
            self._dead_letter(txn, topic, t, s, m, now_ns)
        else:
            queue.put_back(m, flight)
        if self._events.journaled:
            self._events.batch(ev.REQUEUE, topic.name, self._sub_by_id[s], reason).ids.append(m)

    def _dead_letter(self, txn: Txn, topic: TopicConfig, t: int, s: int, m: int, now_ns: int) -> None:
        """PROTOCOL §3 extension: subscriber s gives up on m; a copy goes to the
        topic's DeadLetter topic (with no expiry), or is dropped with a log record."""
        body = txn.get_body(t, m)
        sub = self._sub_by_id[s]
        self._release(txn, topic.name, t, s, [m])
        if body is None:
            return
        target = self.topics.get(topic.dead_letter) if topic.dead_letter else None
        if target is None:
            log.warning("topic %s: message %s dropped for subscriber %s after %d deliveries without an ack (no DeadLetter)",
                        topic.name, body.key.decode(errors="replace"), sub, topic.max_attempts)
            return
        copy = Prepared(body.key if target.dedupe else None, min(body.priority, target.priorities - 1), 0, p.fragment_payload(body.fragment))
        try:
            self._publish(txn, target, [copy], now_ns)
        except p.StoreFull as exc:
            log.warning("topic %s: message %s of subscriber %s dropped, DeadLetter refused it: %s",
                        topic.name, body.key.decode(errors="replace"), sub, exc)

    def _stats(self, t: int, s: int) -> SubStats | None:
        topic, sub = self._topic_by_id.get(t), self._sub_by_id.get(s)
        return self.state.subs.get(topic, {}).get(sub)

    def _return(self, txn: Txn, op: Returned) -> None:
        """A batch that never reached the subscriber: as if it had not been sent."""
        queue = self._queue_of(txn, op.topic, op.subscriber)
        event = self._events.batch(ev.RETURN, op.topic, op.subscriber) if self._events.journaled else None
        for m in op.msgs:
            if queue.give_back(m) and event is not None:
                event.ids.append(m)

    # --- timers: expiry and AckRetry ----------------------------------------------------------

    def _tick(self, txn: Txn, now_ns: int) -> None:
        for expires, t, m in txn.due_expiries(now_ns, PER_TICK):
            topic = self._topic_name(t)
            if topic is None:
                txn.remove_expiry(expires, t, m)
            else:
                self._expire(txn, topic, t, m)
        for t, s, m in txn.due_deadlines(now_ns, PER_TICK):
            self._requeue(txn, t, s, m, now_ns, "AckRetry")

    def _topic_name(self, t: int) -> str | None:
        name = self._topic_by_id.get(t)
        return name if name in self.topics else None

    def _expire(self, txn: Txn, topic: str, t: int, m: int) -> None:
        """PROTOCOL §3 Expiry: gone from every queue, also from in flight."""
        for stats in self._discard(txn, topic, t, m, ev.EXPIRE):
            stats.expired += 1
        self.state.topics[topic].expired += 1

    def _discard(self, txn: Txn, topic: str, t: int, m: int, kind: str) -> list[SubStats]:
        """Remove m from every queue and from in flight, and delete it; return the
        counters of the subscribers that still held it. `kind` is the journal's word
        for why (expire, overflow)."""
        self._settle_fresh(txn, topic)  # m may be fresh: its place must be a row
        holders = txn.get_holders(t, m)
        subs = self.state.subs[topic]
        journaled = self._events.journaled
        publish_ns = txn.publish_ns(t, m) if journaled else 0
        held = []
        for s, (prio, pos) in holders.items():
            name = self._sub_by_id.get(s)
            if name not in subs:
                continue
            delivered = bool(Queue(txn, t, s, subs[name]).remove(m, prio, pos))
            held.append(subs[name])
            if journaled:
                event = self._events.batch(kind, topic, name)
                event.ids.append(m)
                event.pub_ns.append(publish_ns)
                event.delivered.append(delivered)
        txn.put_holders(t, m, {})
        self._delete_messages(txn, topic, t, [m])
        return held

    def _next_tick(self, txn: Txn, now_ns: int) -> int:
        candidates = [now_ns + TICK_NS, txn.next_expiry_ns(), txn.next_deadline_ns()]
        return max(now_ns, min(c for c in candidates if c is not None))


def generated_id(key: str) -> int | None:
    """The message id a generated key names (PROTOCOL §3 Keys), or None: only the
    canonical decimal the broker writes names one, so "0002" acks nothing."""
    if key.isascii() and key.isdigit() and key[0] != "0" and len(key) < 20:
        return int(key)
    return None
