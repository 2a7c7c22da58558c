"""The broker's persisted counters and sequences, and the STATUS view of them.

`State` is small (topics x subscribers, never proportional to the backlog) and
is written into the same transaction as the changes it counts, so it is exactly
as durable as they are; store/counters.py writes it, a record per topic, and puts back
what a failed request or step counted.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec

from ppmq.config import Config, TopicConfig
from ppmq.store.store import Txn

if TYPE_CHECKING:
    from _collections_abc import dict_items, dict_keys, dict_values

NS = 1_000_000_000
# Ids of a topic's sequence reserved at a time (TopicStats.reserve): a step's
# messages are bounded (writer.MAX_MESSAGES_PER_STEP, beside a staged publish),
# so a reservation is renewed long before the sequence reaches it, and a step
# that passes it anyway (a staged publish of more than half of it) only holds
# its batches until its commit. A restart skips at most this many ids.
RESERVE_IDS = 1 << 20
_V = TypeVar("_V")


class TopicStats(msgspec.Struct):
    seq: int = 0  # last message id / queue position handed out; never reused
    stored: int = 0
    published: int = 0
    replaced: int = 0
    expired: int = 0
    stored_bytes: int = 0  # JSON of the stored messages as delivered (MaxBytes counts these)
    dropped: int = 0  # by OverflowPolicy: drop-oldest
    # The sequence is reserved up to here: no id above the last committed
    # reservation leaves the broker before the commit of the step that handed
    # it out, so a restart goes on above it (resume), and a generated key that
    # reached a subscriber in a step that never committed is never handed out
    # again (PROTOCOL §3 Keys). 0 in a record an older ppmq wrote, which
    # decodes as it is: the field is new, not a change of the store's schema.
    reserved: int = 0

    def resume(self) -> None:
        """The broker starts: the sequence goes on above every id a run before
        may have let out, and the next ids are reserved (committed with the
        broker's first transaction, before any step). An older ppmq reserved
        nothing and let a step's ids out before its commit: its sequence goes
        on a reservation's length further, as if it had reserved one."""
        if not self.reserved and self.seq:
            self.reserved = self.seq + RESERVE_IDS
        self.seq = max(self.seq, self.reserved)
        self.reserved = self.seq + RESERVE_IDS

    def reserve(self) -> bool:
        """A step that may have handed out ids ends: the reservation is renewed
        once less than half of it is left, in the step's own transaction. True
        if the step handed out ids above the reservation the last commit made:
        then its batches, which may carry them as keys, wait for its commit."""
        beyond = self.seq > self.reserved
        if self.reserved - self.seq < RESERVE_IDS // 2:
            self.reserved = self.seq + RESERVE_IDS
        return beyond


class SubStats(msgspec.Struct):
    ready: list[int]  # per queue priority
    inflight: int = 0
    delivered: int = 0
    acked: int = 0
    redelivered: int = 0
    expired: int = 0
    ignored_acks: int = 0
    dead_lettered: int = 0  # copies given up on (MaxAttempts, Rejects) or copied to DeadLetter (expired, overflow)
    delayed: int = 0  # queue entries not due yet (PROTOCOL §8 Delay, NotBefore)
    paused: bool = False  # PROTOCOL §8 PAUSE: nothing is pushed until RESUME


class Noting(Protocol):
    """What a Tracked dict tells of its lookups and changes (store/counters.py's Ledger)."""

    stepping: bool  # a step is running: lookups and changes are noted only then
    touched: set[str]  # the topics noted in the current step
    levels: list  # the open request levels, each imaging what it touches

    def touch(self, tracked: Tracked[Any], key: str) -> None: ...


class Tracked(dict[str, _V]):
    """A per-topic dict of State, as a Ledger holds it for the whole of a
    broker's run (store/counters.py): `rows` holds every entry, and the dict
    itself those looked up since the ledger last began a level (a step, or a
    request that may be undone). Looking one of those up again is dict's own
    lookup, no call made; the first lookup of a key at a level (`__missing__`)
    and every change tell the ledger first. Every other read is of `rows`, and
    a change is made to both; the dict's other methods are not for use."""

    def __init__(self, rows: dict[str, _V], ledger: Noting) -> None:
        super().__init__()
        self.rows = rows
        self.ledger = ledger
        # A lookup that notes nothing, for readers outside the step (and the
        # step's own pure reads): rows' own get, which costs no Python call.
        self.peek = rows.get  # type: ignore[method-assign]  # typed below
        # The keys looked up at the current level: a live view of the dict itself,
        # whose `in` is dict's own, no call made (Queues.of asks it per lookup).
        self.seen = dict.keys(self)

    if TYPE_CHECKING:
        peek = dict.get

    def __missing__(self, key: str) -> _V:
        value = self.rows[key]
        ledger = self.ledger
        if ledger.levels:
            ledger.touch(self, key)
        elif ledger.stepping:  # no level to image it at: noted only
            ledger.touched.add(key)
        dict.__setitem__(self, key, value)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self.rows else default

    def __setitem__(self, key: str, value: _V) -> None:
        self.ledger.touch(self, key)
        self.rows[key] = value
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: str) -> None:
        self.ledger.touch(self, key)
        del self.rows[key]
        dict.pop(self, key, None)

    def pop(self, key: str, *default: Any) -> Any:
        self.ledger.touch(self, key)
        dict.pop(self, key, None)
        return self.rows.pop(key, *default)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self.rows:
            self[key] = default
        return self[key]

    def __contains__(self, key: object) -> bool:
        return key in self.rows

    def __iter__(self) -> Iterator[str]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def keys(self) -> dict_keys[str, _V]:
        return self.rows.keys()

    def values(self) -> dict_values[str, _V]:
        return self.rows.values()

    def items(self) -> dict_items[str, _V]:
        return self.rows.items()

    def __repr__(self) -> str:
        return repr(self.rows)


# The types of State's per-topic dicts: msgspec decodes plain dicts, which a
# Ledger makes Tracked before the broker reads them (store/counters.py).
if TYPE_CHECKING:
    TopicsDict = Tracked[TopicStats]
    SubsDict = Tracked[dict[str, SubStats]]
else:
    TopicsDict = dict[str, TopicStats]
    SubsDict = dict[str, dict[str, SubStats]]


class State(msgspec.Struct):
    """Everything the broker counts, and the ids it gave names in the store."""

    rejected: int = 0  # requests answered with an error status
    commits: int = 0  # write transactions; requests per commit shows group commit at work
    forbidden: int = 0  # requests refused for the peer's credentials (also counted in rejected)
    topic_ids: dict[str, int] = {}
    sub_ids: dict[str, int] = {}
    # A State is made or decoded with plain dicts, which its Ledger makes Tracked.
    topics: TopicsDict = {}  # type: ignore[assignment]  # Tracked once a Ledger holds the State
    subs: SubsDict = {}  # type: ignore[assignment]  # topic -> subscriber -> stats, Tracked as topics
    # The sequence of each topic that was dropped, past every id it may have let
    # out (its reservation): a topic created again under the same name goes on
    # from there, so its generated keys never repeat.
    dropped_seqs: dict[str, int] = {}

    def register(self, config: Config) -> None:
        """Give new topics and subscribers ids and counters; keep those of old ones.
        The dicts of ids and dropped sequences are replaced, never changed in
        place, so that what the ledger keeps of them to undo stays as it was."""
        topic_ids, sub_ids, dropped_seqs = dict(self.topic_ids), dict(self.sub_ids), dict(self.dropped_seqs)
        for tc in config.topics:
            if tc.name not in topic_ids:
                topic_ids[tc.name] = max(topic_ids.values(), default=0) + 1
            if tc.name not in self.topics:
                seq = dropped_seqs.pop(tc.name, 0)  # reserved as far as the last commit knows
                self.topics[tc.name] = TopicStats(seq=seq, reserved=seq)
            subs = self.subs.setdefault(tc.name, {})
            for name in tc.subscribers:
                stats = subs.setdefault(name, SubStats(ready=[0] * tc.priorities))
                stats.ready += [0] * (tc.priorities - len(stats.ready))
        for sc in config.subscribers:
            if sc.name not in sub_ids:
                sub_ids[sc.name] = max(sub_ids.values(), default=0) + 1
        self.topic_ids, self.sub_ids, self.dropped_seqs = topic_ids, sub_ids, dropped_seqs

    def forget(self, topic: str) -> None:
        """A topic dropped from the config: its counters go, its sequence is kept."""
        stats = self.topics.pop(topic)
        self.dropped_seqs = {**self.dropped_seqs, topic: max(stats.seq, stats.reserved)}
        del self.subs[topic]

    def resume_sequences(self) -> None:
        """The broker starts: every topic's sequence goes on above what a run
        before may have let out (TopicStats.resume)."""
        for stats in self.topics.values():
            stats.resume()


def refused_changes(state: State, old_topics: dict[str, TopicConfig], config: Config) -> list[str]:
    """Why `config` may not replace the running one, if it would lose messages
    the operator did not name, or change what a held message was stored for."""
    errors = []
    names = {tc.name for tc in config.topics}
    for topic, stats in state.topics.items():
        if topic not in names and stats.stored and topic not in config.drop_topics:
            errors.append(f"Topics: topic {topic!r} was removed but holds {stats.stored} messages; list it in DropTopics to delete them")
    for tc in config.topics:
        old, held = old_topics.get(tc.name), state.topics.get(tc.name)
        if old is None or held is None or not held.stored:
            continue
        for key in ("dedupe", "expire"):
            if getattr(old, key) != getattr(tc, key):
                errors.append(
                    f"Topics[{tc.name}].{key.capitalize()}: cannot change while the topic holds"
                    f" {held.stored} messages (drain it, or drop and re-create it)"
                )
    return errors


def status_body(config: Config, state: State, txn: Txn, now_ns: int, topic: str | None = None) -> dict:
    """The `Body` of a STATUS reply (PROTOCOL §4), of every topic or of `topic`."""
    topics = {}
    for tc in config.topics:
        if topic is not None and tc.name != topic:
            continue
        ts = state.topics[tc.name]
        subs = {}
        for name in tc.subscribers:
            st = state.subs[tc.name][name]
            subs[name] = {
                "Ready": st.ready[: tc.priorities],
                "InFlight": st.inflight,
                "OldestReadyAge": _oldest_ready_age(state, txn, tc, name, now_ns),
                "Delivered": st.delivered,
                "Acked": st.acked,
                "Redelivered": st.redelivered,
                "Expired": st.expired,
                "IgnoredAcks": st.ignored_acks,
                "DeadLettered": st.dead_lettered,
                "Paused": st.paused,
                "Delayed": st.delayed,
            }
        topics[tc.name] = {
            "Stored": ts.stored,
            "Published": ts.published,
            "Replaced": ts.replaced,
            "Expired": ts.expired,
            "StoredBytes": ts.stored_bytes,
            "Dropped": ts.dropped,
            "Subscribers": subs,
        }
    counters = {"Rejected": state.rejected, "Forbidden": state.forbidden, "Commits": state.commits}
    return {"Topics": topics, **counters, "StoreUsedBytes": txn.used_bytes(), "StoreMaxBytes": int(config.max_store_bytes)}


def _oldest_ready_age(state: State, txn: Txn, tc: TopicConfig, sub: str, now_ns: int) -> float | None:
    t, s = state.topic_ids[tc.name], state.sub_ids[sub]
    oldest = None
    for prio in range(tc.priorities):
        entry = txn.first_ready(t, s, prio)
        body = txn.get_body(t, entry.msg) if entry else None
        if body is not None and (oldest is None or body.publish_ns < oldest):
            oldest = body.publish_ns
    return None if oldest is None else round(max(0, now_ns - oldest) / NS, 3)
