"""The reference model of one topic, for the broker's model-based test
(test_broker_model.py): what PROTOCOL §3 and §8 say a topic's queues hold,
written as plainly as possible, with no store, no rows and no fresh lists.

A message is known by an ident the test chooses (its payload, its dedupe key, or
a tuple for a copy the broker makes), and each subscriber holds it in one of
three places: ready, delayed (ready but not before its due time) or in flight.
Besides the push subscribers of one connection, the model knows a Pull
subscriber, whose workers TAKE (PROTOCOL §9: which taker holds each message it
has in flight), and a push subscriber with parallel connections (PROTOCOL §9
lanes: which lane carried each message it has in flight).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ppmq.config import TopicConfig
from ppmq.protocol import messages as p
from ppmq.store.state import NS, RESERVE_IDS

SUBS = {"s1": (3, 5), "s2": (2, 2)}  # push subscribers of one connection, name: (BatchSize, Window)
PULL = {"w": 3}  # Pull subscribers (PROTOCOL §9), name: Window
LANED = {"L": (2, 3, 2)}  # push subscribers with parallel connections, name: (BatchSize, Window, Connections)
TOPICS = [
    TopicConfig(
        name="plain",
        subscribers=["s1", "s2", "L"],
        ack_retry=5.0,
        priorities=2,
        expire=True,
        max_messages=6,
        max_bytes=200,
        overflow_policy="drop-oldest",
        max_attempts=2,
        dead_letter="dead",
    ),
    TopicConfig(
        name="dd",
        subscribers=["s1", "s2", "w"],
        dedupe=True,
        priorities=3,
        expire=True,
        max_bytes=150,
        max_attempts=3,
        dead_letter="dead",
        dead_letter_reasons=["rejected"],
    ),
    TopicConfig(name="dm", subscribers=["s2"], dedupe=True, priorities=2, max_messages=2, overflow_policy="drop-oldest"),
    TopicConfig(name="auto", subscribers=["s2", "w"], ack_required=False, max_messages=4),
    TopicConfig(name="dead", subscribers=["s1"], priorities=2, max_messages=4),
    TopicConfig(name="bulk", subscribers=["s1", "s2", "w", "L"], priorities=2, expire=True, ack_retry=3.0),
]
TOPIC_IDS = {t.name: i for i, t in enumerate(TOPICS, 1)}
SUB_IDS = {s: i for i, s in enumerate([*SUBS, *PULL, *LANED], 1)}  # as the broker numbers them, in config order


@dataclass
class Msg:
    payload: int
    prio: int
    expires_ns: int  # 0: never
    m: int = 0  # the broker's message id, given when it is stored
    key: str = ""  # as delivered
    published_ns: int = 0
    origin: bytes | None = None  # of a dead letter (PROTOCOL §8)

    def size(self) -> int:
        """What MaxBytes counts: the message's JSON as delivered."""
        return len(p.message_fragment(self.key.encode(), b"%d" % self.payload, self.prio, self.expires_ns, self.origin))


@dataclass
class Job:
    """A publish being staged: `done` messages of it stored unseen so far."""

    req: p.Request
    idents: list[tuple[object, Msg]]
    bad_at: int | None
    done: int = 0
    reserved: bool = False  # its first chunk took the ids


@dataclass
class Counters:
    delivered: int = 0
    acked: int = 0
    redelivered: int = 0
    expired: int = 0
    ignored: int = 0
    dead_lettered: int = 0


Given = tuple[Msg, int]  # a message a subscriber gave up on, and its deliveries


@dataclass
class TopicModel:
    config: TopicConfig
    msgs: dict[object, Msg] = field(default_factory=dict)  # ident -> live message
    ready: dict[str, dict[object, tuple[int, int, int]]] = field(default_factory=dict)  # ident -> (prio, pos, attempts)
    delayed: dict[str, dict[object, tuple[int, int, int, int]]] = field(default_factory=dict)  # + due_ns
    inflight: dict[str, dict[object, tuple[int, int, int, int]]] = field(default_factory=dict)  # (prio, pos, deadline, attempts)
    counters: dict[str, Counters] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    # (subscriber, ident) -> the taker whose TAKE last put it in flight (PROTOCOL §9
    # Competing consumers); it holds the message while the message is in flight
    taker: dict[tuple[str, object], int] = field(default_factory=dict)
    # (subscriber, ident) -> the lane whose batch last carried it (PROTOCOL §9
    # Parallel push connections); it carries the message while the message is in
    # flight; not known after a restart (a new link, which knows no lanes yet)
    lane: dict[tuple[str, object], int] = field(default_factory=dict)
    seq: int = 0
    reserved: int = RESERVE_IDS  # the broker reserves this much of the sequence when it opens a store
    published: int = 0
    replaced: int = 0
    expired: int = 0
    dropped: int = 0

    def __post_init__(self) -> None:
        for s in self.config.subscribers:
            self.ready[s], self.delayed[s], self.inflight[s], self.counters[s] = {}, {}, {}, Counters()

    def restarted(self) -> None:
        """PROTOCOL §3 Keys: the sequence goes on above every id the run before
        reserved, and a new reservation begins (a model's runs hand out far fewer
        ids than half a reservation, which is when the broker renews one). No
        taker and no lane outlive the run (PROTOCOL §9)."""
        self.seq = max(self.seq, self.reserved)
        self.reserved = self.seq + RESERVE_IDS
        self.taker.clear()
        self.lane.clear()

    def next_pos(self) -> int:
        self.seq += 1
        return self.seq

    # --- publishing -----------------------------------------------------------------

    def publish(self, ident: object, msg: Msg, due_ns: int = 0, subs: list[str] | None = None) -> bool:
        """PROTOCOL §3 Fan-out and Dedupe, §8 Delay (waiting until `due_ns`, 0: not)
        and REDRIVE (`subs`: who gets a new message; default all); False when the
        topic is full."""
        if ident not in self.msgs:
            msg.m = self.seq + 1
            msg.key = ident if self.config.dedupe else str(msg.m)
            if not self.make_room(msg.size()):
                return False
            pos = self.next_pos()
            for s in self.config.subscribers if subs is None else subs:
                self._wait(s, ident, msg.prio, pos, 0, due_ns)
        else:
            self._replace(ident, msg, due_ns)
        self.msgs[ident] = msg
        self.published += 1
        return True

    def publish_all(self, entries: list[tuple[object, Msg, int]]) -> int | None:
        """A whole publish of (ident, msg, due_ns): the index of the first
        message the topic had no room for (the broker then refuses all of it),
        None when all are stored. One stored at once (no Dedupe, and no limits
        or room for all of it) takes its ids by priority, then by place in the
        publish (docs/protocol.md Keys)."""
        order = list(range(len(entries)))
        if not self.config.dedupe:
            by_prio = sorted(order, key=lambda i: entries[i][1].prio)
            for m, i in enumerate(by_prio, self.seq + 1):  # MaxBytes counts the key each would be delivered with
                entries[i][1].key = str(m)
            if self._fits([msg for _, msg, _ in entries]):
                order = by_prio
        return next((i for i in order if not self.publish(*entries[i])), None)

    def _replace(self, ident: object, msg: Msg, due_ns: int) -> None:
        """A new version keeps the place of a waiting one at the same or a higher
        priority number; anywhere else it goes to the end of its priority."""
        old = self.msgs[ident]
        msg.m, msg.key = old.m, old.key
        self.replaced += 1
        new_pos = None
        for s in self.config.subscribers:
            place = self._leave(s, ident)
            if place is None or msg.prio < place[0]:
                new_pos = new_pos or self.next_pos()
                place = (msg.prio, new_pos)
            self._wait(s, ident, *place, 0, due_ns)

    def _wait(self, s: str, ident: object, prio: int, pos: int, attempts: int, due_ns: int) -> None:
        """Into s's queue at its place: ready, or delayed until due_ns."""
        if due_ns:
            self.delayed[s][ident] = (prio, pos, attempts, due_ns)
        else:
            self.ready[s][ident] = (prio, pos, attempts)

    def _leave(self, s: str, ident: object) -> tuple[int, int] | None:
        """ident leaves s's queue; its place if it was waiting (ready or delayed)."""
        place = self.ready[s].pop(ident, None) or self.delayed[s].pop(ident, None)
        self.inflight[s].pop(ident, None)
        return place[:2] if place else None

    def reveal(self, first: int, idents: list[tuple[object, Msg]]) -> None:
        """A staged publish made whole: its messages at the ids reserved for it."""
        for i, (ident, msg) in enumerate(idents):
            msg.m = first + i
            msg.key = str(msg.m)
            for s in self.config.subscribers:
                self.ready[s][ident] = (msg.prio, msg.m, 0)
            self.msgs[ident] = msg
        self.published += len(idents)

    def stored_bytes(self) -> int:
        return sum(msg.size() for msg in self.msgs.values())

    def _fits(self, msgs: list[Msg]) -> bool:
        """MaxMessages and MaxBytes leave room for all of msgs without dropping any."""
        c = self.config
        return not (c.max_messages and len(self.msgs) + len(msgs) > c.max_messages) and not (
            c.max_bytes and self.stored_bytes() + sum(msg.size() for msg in msgs) > c.max_bytes
        )

    def make_room(self, size: int) -> bool:
        """MaxMessages / MaxBytes: drop the oldest of the lowest priority, or refuse.
        Only ready copies are candidates: a delayed or in-flight one is not dropped."""
        c = self.config
        if c.max_bytes and size > c.max_bytes:
            return False
        while (c.max_messages and len(self.msgs) >= c.max_messages) or (c.max_bytes and self.stored_bytes() + size > c.max_bytes):
            waiting = [(-prio, pos, ident) for s in c.subscribers for ident, (prio, pos, _) in self.ready[s].items()]
            if c.overflow_policy != "drop-oldest" or not waiting:
                return False
            self.discard(min(waiting)[2])
            self.dropped += 1
        return True

    # --- leaving -----------------------------------------------------------------------

    def remove(self, s: str, ident: object) -> bool:
        """ident leaves s's queue, wherever it was; whether s held it."""
        return any(place.pop(ident, None) is not None for place in (self.ready[s], self.delayed[s], self.inflight[s]))

    def discard(self, ident: object) -> list[str]:
        """Gone from every queue and from in flight; the subscribers that held it."""
        held = [s for s in self.config.subscribers if self.remove(s, ident)]
        del self.msgs[ident]
        return held

    def holds(self, ident: object) -> bool:
        return any(self.holds_for(s, ident) for s in self.config.subscribers)

    def forget_unheld(self, ident: object) -> None:
        """The last subscriber out deletes the message."""
        if ident in self.msgs and not self.holds(ident):
            del self.msgs[ident]

    def finish(self, s: str, ident: object) -> None:
        del self.inflight[s][ident]
        self.counters[s].acked += 1
        self.forget_unheld(ident)

    def purge(self, subs: list[str], idents: list[object]) -> int:
        """PROTOCOL §8 PURGE: the copies of idents that subs hold go; how many."""
        purged = 0
        for ident in idents:
            purged += sum(self.remove(s, ident) for s in subs)
            self.forget_unheld(ident)
        return purged

    def held_by(self, subs: list[str]) -> list[object]:
        return [ident for ident in self.msgs if any(self.holds_for(s, ident) for s in subs)]

    def holds_for(self, s: str, ident: object) -> bool:
        return ident in self.ready[s] or ident in self.delayed[s] or ident in self.inflight[s]

    # --- timers ------------------------------------------------------------------------

    def expire(self, now_ns: int) -> None:
        if self.config.expire:
            for ident, msg in list(self.msgs.items()):
                if msg.expires_ns and msg.expires_ns <= now_ns:
                    self.expired += 1
                    for s in self.discard(ident):
                        self.counters[s].expired += 1

    def due(self, now_ns: int) -> list[tuple]:
        """In-flight entries past AckRetry, as the broker's deadline index orders them."""
        t = TOPIC_IDS[self.config.name]
        return [
            (deadline, t, SUB_IDS[s], self.msgs[ident].m, self.config.name, s, ident)
            for s in self.config.subscribers
            for ident, (_, _, deadline, _) in self.inflight[s].items()
            if deadline and deadline <= now_ns
        ]

    def release_due(self, now_ns: int) -> None:
        """Delayed entries whose time has come are ready, at their place."""
        for s in self.config.subscribers:
            for ident, (prio, pos, attempts, due_ns) in list(self.delayed[s].items()):
                if due_ns <= now_ns:
                    del self.delayed[s][ident]
                    self.ready[s][ident] = (prio, pos, attempts)

    # --- in flight -------------------------------------------------------------------

    def deadline(self, now_ns: int) -> int:
        """The AckRetry deadline of what goes into flight (or is touched) now; 0: none."""
        c = self.config
        return now_ns + int(c.ack_retry * NS) if c.ack_retry and c.ack_required else 0

    def in_flight_as(self, s: str, key: str) -> object | None:
        """The ident of the message in flight to s under `key`, if any."""
        return next((ident for ident in self.inflight[s] if self.msgs[ident].key == key), None)

    def give_back(self, s: str, ident: object, due_ns: int = 0) -> Given | None:
        """Back to its place (delayed until due_ns, if given); after MaxAttempts
        deliveries, given up: returns the message and its deliveries."""
        prio, pos, _, attempts = self.inflight[s].pop(ident)
        if self.config.max_attempts and attempts >= self.config.max_attempts:
            return self._given_up(s, ident, attempts)
        self._wait(s, ident, prio, pos, attempts, due_ns)
        return None

    def give_up(self, s: str, ident: object) -> Given:
        """PROTOCOL §8 Rejects: s is done with it, without an ack."""
        *_, attempts = self.inflight[s].pop(ident)
        return self._given_up(s, ident, attempts)

    def _given_up(self, s: str, ident: object, attempts: int) -> Given:
        self.counters[s].dead_lettered += 1
        msg = self.msgs[ident]
        self.forget_unheld(ident)
        return msg, attempts

    def touch(self, s: str, ident: object, now_ns: int) -> None:
        prio, pos, _, attempts = self.inflight[s][ident]
        self.inflight[s][ident] = (prio, pos, self.deadline(now_ns), attempts)

    def pull(self, s: str, now_ns: int) -> list[object]:
        """The next batch for s, by priority then place, up to its Window; none while paused."""
        if s in self.paused:
            return []
        batch, window = SUBS[s]
        return self._send(s, min(batch, window - len(self.inflight[s])), now_ns)

    def pull_to_lane(self, s: str, now_ns: int, open_lanes: list[bool]) -> tuple[list[object], int]:
        """PROTOCOL §9 Parallel push connections: the next batch for s, to its open
        lane with the most room under Window (the lowest of those with as much),
        and no more than all its lanes' Windows hold in flight; and that lane."""
        batch, window, connections = LANED[s]
        room = [window - self.carried(s, lane) if is_open else 0 for lane, is_open in enumerate(open_lanes)]
        lane = max(range(connections), key=lambda i: (room[i], -i))
        if s in self.paused or room[lane] <= 0:
            return [], lane
        order = self._send(s, min(batch, window * connections - len(self.inflight[s]), room[lane]), now_ns)
        self.lane.update(((s, ident), lane) for ident in order)
        return order, lane

    def carried(self, s: str, lane: int) -> int:
        """How many messages in flight to s the lane carries."""
        return sum(self.lane.get((s, ident)) == lane for ident in self.inflight[s])

    def take(self, s: str, taker: int, count: int, now_ns: int) -> list[tuple[object, Msg]]:
        """PROTOCOL §9 TAKE: up to count ready messages, by priority then place, as
        far as s's Window has room; none while paused. In flight and held by the
        taker, or, on an `AckRequired: false` topic, done with as they are taken."""
        if s in self.paused:
            return []
        taken = [(ident, self.msgs[ident]) for ident in self._send(s, min(count, PULL[s] - len(self.inflight[s])), now_ns)]
        for ident, _ in taken:
            if self.config.ack_required:
                self.taker[s, ident] = taker
            else:
                self.finish(s, ident)
        return taken

    def held_by_taker(self, s: str, taker: int) -> list[object]:
        """What the taker holds: taken by it, in flight since, by message id."""
        return sorted((i for i in self.inflight[s] if self.taker.get((s, i)) == taker), key=lambda i: self.msgs[i].m)

    def _send(self, s: str, limit: int, now_ns: int) -> list[object]:
        """Up to limit of s's ready messages, by priority then place, into flight."""
        order = sorted(self.ready[s], key=lambda i: self.ready[s][i][:2])[: max(0, limit)]
        deadline = self.deadline(now_ns)
        for ident in order:
            prio, pos, attempts = self.ready[s].pop(ident)
            self.inflight[s][ident] = (prio, pos, deadline, attempts + 1)
            self.counters[s].delivered += 1
            self.counters[s].redelivered += attempts > 0
        return order
