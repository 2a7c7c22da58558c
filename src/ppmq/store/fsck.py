"""`ppmq fsck`: do the store's indexes, messages and counters agree?

The store (schema in store/schema.py) keeps every fact twice: a message's place in a
subscriber's queue is in `ready` or `inflight` and in its `holders`, its expiry
and dedupe key in their indexes (a copy's own expiry in `copies` and its
index), and the counters STATUS shows in `meta`. A bug
or a damaged file shows up as two copies that disagree, which is what this
checks. Rows of a publish being staged (core/staging.py) are uncounted by design:
while the meta `staging` record names their range they are left out of the
counters (its rows must still agree with each other); without the record they
would show up as counters that disagree. It reads one snapshot through
reader.StoreReader, whose records are the store's own decoding of every row (a
row that does not decode is a problem here), so it runs beside a live broker (which keeps writing meanwhile) as well as on a
stopped one; it never writes, and refuses a DataPath that is not a ppmq store.
It holds the indexes (not the payloads) in memory, a hundred bytes or so per
entry, and while it reads, the broker cannot reuse the pages of its snapshot.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import msgspec

from ppmq.config import Config
from ppmq.errors import FsckError, StoreError
from ppmq.store.counters import load_state
from ppmq.store.reader import (
    BodyRecord,
    CopyExpiryRecord,
    CopyRecord,
    Damaged,
    DeadlineRecord,
    DedupeRecord,
    DelayedRecord,
    DueRecord,
    ExpiryRecord,
    FlightRecord,
    HoldersRecord,
    ReadTxn,
    ReadyRecord,
    StoreReader,
)
from ppmq.store.schema import Body, Flight, Staged
from ppmq.store.state import State


@dataclass
class Snapshot:
    """Every database of one read transaction, decoded; entries that do not decode
    are kept out and reported in `problems` instead."""

    state: State
    staged: Staged | None = None  # the range of a publish being staged, from meta `staging`
    bodies: dict[tuple[int, int], Body] = field(default_factory=dict)  # fragment kept only on request
    holders: dict[tuple[int, int], dict[int, tuple[int, int]]] = field(default_factory=dict)
    holder_rows: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # t, row key id -> its ids, in row order
    body_rows: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # the same, of the bodies rows
    ready: dict[tuple[int, int, int, int], tuple[int, int]] = field(default_factory=dict)  # -> m, attempts
    last_ready: ReadyRecord | None = None  # the entry read before, which the next must follow (store/schema.py: runs)
    inflight: dict[tuple[int, int, int], Flight] = field(default_factory=dict)  # t, s, m
    batches: dict[tuple[int, int, int], int] = field(default_factory=dict)  # t, s, f of an inflight row -> deadline_ns
    deadlines: set[tuple[int, int, int, int]] = field(default_factory=set)  # deadline_ns, t, s, f
    delayed: dict[tuple[int, int, int, int], tuple[int, int]] = field(default_factory=dict)  # t, s, prio, pos -> m, due_ns
    due: set[tuple[int, int, int, int, int]] = field(default_factory=set)  # due_ns, t, s, prio, pos
    expiry: set[tuple[int, int, int]] = field(default_factory=set)  # expires_ns, t, m
    dedupe: dict[tuple[int, bytes], int] = field(default_factory=dict)
    copies: dict[tuple[int, int, int], int] = field(default_factory=dict)  # t, m, s -> the copy's own expires_ns
    copy_expiry: set[tuple[int, int, int, int]] = field(default_factory=set)  # expires_ns, t, m, s
    fragment_bytes: Counter = field(default_factory=Counter)  # topic id -> bytes of its messages as delivered
    problems: list[str] = field(default_factory=list)

    @cached_property
    def topic_names(self) -> dict[int, str]:
        return {i: n for n, i in self.state.topic_ids.items()}

    @cached_property
    def sub_names(self) -> dict[int, str]:
        return {i: n for n, i in self.state.sub_ids.items()}

    def topic(self, t: int) -> str:
        return repr(self.topic_names[t]) if t in self.topic_names else f"#{t} (unknown id)"

    def sub(self, s: int) -> str:
        return repr(self.sub_names[s]) if s in self.sub_names else f"#{s} (unknown id)"

    def msg(self, t: int, m: int) -> str:
        return f"topic {self.topic(t)} message {m}"

    def all_copies_own(self, t: int, m: int) -> bool:
        """Every copy of m has an expiry of its own: m's own expiry, passed, is out of the index."""
        holders = self.holders.get((t, m), {})
        return bool(holders) and all((t, m, s) in self.copies for s in holders)

    def hidden(self, t: int, m: int) -> bool:
        """Message (or queue position) m of topic t belongs to a publish being staged."""
        return self.staged is not None and self.staged.hides(t, m)


def read_snapshot(data_path: str, *, fragments: bool = False) -> Snapshot:
    """Open DataPath read-only and decode it; FsckError if it is not a ppmq store."""
    if data_path == "mem":
        raise FsckError("DataPath is 'mem': a throwaway store that lives only inside the running broker")
    try:
        reader = StoreReader(data_path)
    except StoreError as exc:
        raise FsckError(str(exc)) from None
    try:
        with reader.snapshot() as txn:
            return _decode(txn, fragments)
    finally:
        reader.close()


def _decode(txn: ReadTxn, fragments: bool) -> Snapshot:
    try:
        state = load_state(txn)
    except msgspec.DecodeError as exc:
        raise FsckError(f"the persisted counters (meta 'state' and 'topic:' records) do not decode: {exc}") from None
    snap = Snapshot(state, txn.staged())
    for db, keep in _KEEP.items():
        for record in txn.records(db):
            if isinstance(record, Damaged):
                snap.problems.append(f"{db}: entry {record.key.hex()} does not decode: {record.reason}")
            else:
                keep(snap, record, fragments)
    return snap


def _body(snap: Snapshot, record: BodyRecord, fragments: bool) -> None:
    """The payload is counted, and kept only on request: fsck holds indexes, not payloads."""
    t, m, body, row = record
    if not snap.hidden(t, m):
        snap.fragment_bytes[t] += len(body.fragment)
    snap.bodies[t, m] = body if fragments else body._replace(fragment=b"")
    snap.body_rows.setdefault((t, row), []).append(m)


def _holders(snap: Snapshot, record: HoldersRecord, fragments: bool) -> None:
    snap.holders[record.t, record.m] = record.holders
    snap.holder_rows.setdefault((record.t, record.row), []).append(record.m)


def _ready(snap: Snapshot, record: ReadyRecord, fragments: bool) -> None:
    """An entry of a run. The runs' invariant (store/schema.py) is checked on the way,
    since entries are read in the order the runs hold them: a run out of order
    hides entries from the cursor that looks for them, or repeats one."""
    t, s, prio, pos, m, attempts, run = record
    before, snap.last_ready = snap.last_ready, record
    where = f"ready: subscriber {snap.sub(s)} queue entry ({prio}, {pos}) of topic {snap.topic(t)}"
    if pos < run:
        snap.problems.append(f"{where} is below the key {run} of its run")
    elif before is not None and before[:3] == record[:3] and before.run == run and before.pos >= pos:
        snap.problems.append(f"{where} comes after the entry at {before.pos} in its run")
    elif before is not None and before[:3] == record[:3] and before.run != run and before.pos >= run:
        snap.problems.append(f"{where} is in a run keyed {run}, but the run before holds {before.pos}")
    snap.ready[t, s, prio, pos] = (m, attempts)


def _inflight(snap: Snapshot, record: FlightRecord, fragments: bool) -> None:
    """A row per batch; a message in two of them would be acked in one and
    delivered again from the other."""
    t, s, f, deadline_ns, flights = record
    snap.batches[t, s, f] = deadline_ns
    if not flights:
        snap.problems.append(f"inflight: batch {f} to subscriber {snap.sub(s)} on topic {snap.topic(t)} holds no message")
    for flight in flights:
        if (t, s, flight.m) in snap.inflight:
            snap.problems.append(f"inflight: {snap.msg(t, flight.m)} is in two batches in flight to subscriber {snap.sub(s)}")
        snap.inflight[t, s, flight.m] = flight


def _delayed(snap: Snapshot, record: DelayedRecord, fragments: bool) -> None:
    snap.delayed[record.t, record.s, record.prio, record.pos] = (record.m, record.due_ns)


def _due(snap: Snapshot, record: DueRecord, fragments: bool) -> None:
    snap.due.add(record)


def _deadline(snap: Snapshot, record: DeadlineRecord, fragments: bool) -> None:
    snap.deadlines.add(record)


def _expiry(snap: Snapshot, record: ExpiryRecord, fragments: bool) -> None:
    snap.expiry.add(record)


def _dedupe(snap: Snapshot, record: DedupeRecord, fragments: bool) -> None:
    snap.dedupe[record.t, record.key] = record.m


def _copy(snap: Snapshot, record: CopyRecord, fragments: bool) -> None:
    snap.copies[record.t, record.m, record.s] = record.expires_ns


def _copy_expiry(snap: Snapshot, record: CopyExpiryRecord, fragments: bool) -> None:
    snap.copy_expiry.add(record)


# Each keeps the records of its own database (reader._RECORDS decodes them).
_KEEP: dict[str, Callable[[Snapshot, Any, bool], None]] = {
    "bodies": _body,
    "holders": _holders,
    "ready": _ready,
    "inflight": _inflight,
    "deadlines": _deadline,
    "delayed": _delayed,
    "due": _due,
    "expiry": _expiry,
    "dedupe": _dedupe,
    "copies": _copy,
    "copy_expiry": _copy_expiry,
}


# --- the checks: each finds one kind of disagreement --------------------------------


def check(snap: Snapshot, config: Config) -> list[str]:
    """Every problem found, one line each; empty when the store is consistent."""
    problems = list(snap.problems)
    for find in (
        _staging_record_fits,
        _sequences_reserved,
        _bodies_referenced,
        _rows_tile_ids,
        _holders_point_at_places,
        _ready_points_at_messages,
        _inflight_points_at_messages,
        _deadlines_point_at_flights,
        _delayed_points_at_messages,
        _due_points_at_delayed,
        _message_indexes_point_at_bodies,
        _copies_point_at_holders,
        _subscriptions_exist,
        _counters_match,
    ):
        problems += find(snap, config)
    return problems


def _staging_record_fits(snap: Snapshot, config: Config) -> list[str]:
    """The staged range was reserved from a known topic's sequence."""
    staged = snap.staged
    if staged is None:
        return []
    if staged.t not in snap.topic_names:
        return [f"meta: the staging record names topic {snap.topic(staged.t)}"]
    stats = snap.state.topics.get(snap.topic_names[staged.t])  # None: a dropped topic, its rows being deleted
    seq = stats.seq if stats is not None else staged.last
    if not 0 < staged.first <= staged.last <= seq:
        return [
            f"meta: the staging record's ids {staged.first}..{staged.last} of topic {snap.topic(staged.t)} are not reserved (sequence {seq})"
        ]
    return []


def _sequences_reserved(snap: Snapshot, config: Config) -> list[str]:
    """Each topic's sequence is reserved past its last id (state.TopicStats):
    a restart goes on above the reservation, and would hand out again an id
    below the sequence. A record an older ppmq wrote has no reservation (0)."""
    return [
        f"meta: topic {name!r} handed out ids up to {stats.seq}, above its reservation {stats.reserved}"
        for name, stats in snap.state.topics.items()
        if stats.reserved and stats.seq > stats.reserved
    ]


def _bodies_referenced(snap: Snapshot, config: Config) -> list[str]:
    """A message nobody holds is never delivered nor deleted; one above the topic's
    sequence would collide with a future message id."""
    out = []
    flags = {tc.name: tc for tc in config.topics}
    names = snap.topic_names
    for (t, m), body in snap.bodies.items():
        where = snap.msg(t, m)
        if t not in names:
            out.append(f"bodies: {where} belongs to no known topic")
            continue
        if not snap.holders.get((t, m)):
            out.append(f"bodies: {where} is held by no subscriber")
        if m > snap.state.topics[names[t]].seq:
            out.append(f"bodies: {where} is above the topic's sequence {snap.state.topics[names[t]].seq}")
        tc = flags.get(names[t])
        if tc is not None and tc.dedupe and snap.dedupe.get((t, body.key)) != m:
            out.append(f"dedupe: {where} (key {body.key!r}) is missing from the dedupe index")
        if (
            tc is not None
            and tc.expire
            and body.expires_ns
            and (body.expires_ns, t, m) not in snap.expiry
            and not snap.all_copies_own(t, m)
        ):
            out.append(f"expiry: {where} expires but is missing from the expiry index")
    return out


def _rows_tile_ids(snap: Snapshot, config: Config) -> list[str]:
    """The holders rows and the bodies rows of a topic each tile its ids
    (store/schema.py): ascending in a row, none below the row's key or at or above
    the next row's, so the writer, which looks for a message in the row with
    the largest key at or below its id, finds it there and nowhere else. A
    message whose holders are gone has left its holders row."""
    out = _tiles("holders", snap.holder_rows, snap) + _tiles("bodies", snap.body_rows, snap)
    for (t, row), ids in sorted(snap.holder_rows.items()):
        out += [f"holders: {snap.msg(t, m)} is in row {row} but held by no subscriber" for m in ids if not snap.holders[t, m]]
    return out


def _tiles(db: str, rows_of: dict[tuple[int, int], list[int]], snap: Snapshot) -> list[str]:
    out = []
    rows = sorted(rows_of.items())
    for i, ((t, row), ids) in enumerate(rows):
        where = f"{db}: row {row} of topic {snap.topic(t)}"
        upper = rows[i + 1][0][1] if i + 1 < len(rows) and rows[i + 1][0][0] == t else None
        if any(a >= b for a, b in zip(ids, ids[1:])):
            out.append(f"{where} holds ids {ids}, not ascending")
        if min(ids) < row:
            out.append(f"{where} holds message {min(ids)}, below its key")
        if upper is not None and max(ids) >= upper:
            out.append(f"{where} holds message {max(ids)}, not below the next row's key {upper}")
    return out


def _holders_point_at_places(snap: Snapshot, config: Config) -> list[str]:
    out = []
    for (t, m), holders in snap.holders.items():
        where = snap.msg(t, m)
        if (t, m) not in snap.bodies:
            out.append(f"holders: {where} is not stored")
        for s, (prio, pos) in holders.items():
            queued = snap.ready.get((t, s, prio, pos), (None,))[0] == m or snap.delayed.get((t, s, prio, pos), (None,))[0] == m
            if not queued and (t, s, m) not in snap.inflight:
                out.append(f"holders: {where} is held by subscriber {snap.sub(s)} but neither queued at ({prio}, {pos}) nor in flight")
    return out


def _ready_points_at_messages(snap: Snapshot, config: Config) -> list[str]:
    out = []
    for (t, s, prio, pos), (m, _) in snap.ready.items():
        where = f"ready: subscriber {snap.sub(s)} queue entry ({prio}, {pos}) -> {snap.msg(t, m)}"
        if (t, m) not in snap.bodies:
            out.append(f"{where} is not stored")
        elif snap.holders.get((t, m), {}).get(s) != (prio, pos):
            out.append(f"{where} does not hold this place in its holders")
        if (t, s, m) in snap.inflight:
            out.append(f"{where} is also in flight to that subscriber")
    return out


def _inflight_points_at_messages(snap: Snapshot, config: Config) -> list[str]:
    out = []
    for (t, s, m), flight in snap.inflight.items():
        where = f"inflight: {snap.msg(t, m)} to subscriber {snap.sub(s)}"
        if (t, m) not in snap.bodies:
            out.append(f"{where} is not stored")
        elif s not in snap.holders.get((t, m), {}):
            out.append(f"{where} is not among its holders")
        elif flight.publish_ns != snap.bodies[t, m].publish_ns:
            out.append(f"{where} was published at {flight.publish_ns}, its message at {snap.bodies[t, m].publish_ns}")
    return out


def _deadlines_point_at_flights(snap: Snapshot, config: Config) -> list[str]:
    """Every batch with an AckRetry deadline has its row in the index, and back."""
    out = []
    for (t, s, f), deadline_ns in snap.batches.items():
        if deadline_ns and (deadline_ns, t, s, f) not in snap.deadlines:
            out.append(
                f"inflight: batch {f} to subscriber {snap.sub(s)} on topic {snap.topic(t)} has an AckRetry deadline missing from the deadline index"
            )
    for deadline_ns, t, s, f in snap.deadlines:
        if snap.batches.get((t, s, f)) != deadline_ns:
            out.append(
                f"deadlines: {deadline_ns} for batch {f} to subscriber {snap.sub(s)} on topic {snap.topic(t)} matches no batch in flight"
            )
    return out


def _delayed_points_at_messages(snap: Snapshot, config: Config) -> list[str]:
    """A delayed entry is a queue entry that waits: held at its place, in no other
    state, and found by the timer through its due entry."""
    out = []
    for (t, s, prio, pos), (m, due_ns) in snap.delayed.items():
        where = f"delayed: subscriber {snap.sub(s)} queue entry ({prio}, {pos}) -> {snap.msg(t, m)}"
        if (t, m) not in snap.bodies:
            out.append(f"{where} is not stored")
        elif snap.holders.get((t, m), {}).get(s) != (prio, pos):
            out.append(f"{where} does not hold this place in its holders")
        if (t, s, prio, pos) in snap.ready or (t, s, m) in snap.inflight:
            out.append(f"{where} is also ready or in flight to that subscriber")
        if (due_ns, t, s, prio, pos) not in snap.due:
            out.append(f"{where} is missing from the due index")
    return out


def _due_points_at_delayed(snap: Snapshot, config: Config) -> list[str]:
    return [
        f"due: {due_ns} for subscriber {snap.sub(s)} queue entry ({prio}, {pos}) of topic {snap.topic(t)} matches no delayed entry due then"
        for due_ns, t, s, prio, pos in snap.due
        if snap.delayed.get((t, s, prio, pos), (None, None))[1] != due_ns
    ]


def _message_indexes_point_at_bodies(snap: Snapshot, config: Config) -> list[str]:
    """Expiry and dedupe entries name a message by a field of its body, which must agree."""
    out = []
    for expires_ns, t, m in snap.expiry:
        if getattr(snap.bodies.get((t, m)), "expires_ns", None) != expires_ns:
            out.append(f"expiry: {expires_ns} for {snap.msg(t, m)} matches no stored message expiring then")
    for (t, key), m in snap.dedupe.items():
        if getattr(snap.bodies.get((t, m)), "key", None) != key:
            out.append(f"dedupe: key {key!r} of topic {snap.topic(t)} points at message {m}, which is not stored under that key")
    return out


def _copies_point_at_holders(snap: Snapshot, config: Config) -> list[str]:
    """A copy's own expiry belongs to a copy still held, and on an Expire topic
    is in its index when it expires at all; an index entry names such a copy."""
    out = []
    expiring = {tc.name for tc in config.topics if tc.expire}
    for (t, m, s), expires_ns in snap.copies.items():
        where = f"copies: subscriber {snap.sub(s)}'s copy of {snap.msg(t, m)}"
        if s not in snap.holders.get((t, m), {}):
            out.append(f"{where} has an expiry of its own but is not held")
        if expires_ns and snap.topic_names.get(t) in expiring and (expires_ns, t, m, s) not in snap.copy_expiry:
            out.append(f"{where} expires but is missing from the copy_expiry index")
    for expires_ns, t, m, s in snap.copy_expiry:
        if snap.copies.get((t, m, s)) != expires_ns:
            out.append(f"copy_expiry: {expires_ns} for subscriber {snap.sub(s)}'s copy of {snap.msg(t, m)} matches no copy expiring then")
    return out


def _subscriptions_exist(snap: Snapshot, config: Config) -> list[str]:
    """Holders, queue entries and deliveries belong to a subscriber that still takes
    the topic: those of a removed subscription are never delivered nor acked, so
    the message they hold is never deleted."""
    out = []

    def gone(t: int, s: int) -> bool:
        topic, sub = snap.topic_names.get(t), snap.sub_names.get(s)
        return topic is None or sub not in snap.state.subs.get(topic, {})

    for (t, m), holders in snap.holders.items():
        out += [
            f"holders: {snap.msg(t, m)} is held by subscriber {snap.sub(s)}, which does not take that topic" for s in holders if gone(t, s)
        ]
    rows_of = (
        ("ready", ((t, s) for t, s, _, _ in snap.ready)),
        ("delayed", ((t, s) for t, s, _, _ in snap.delayed)),
        ("inflight", ((t, s) for t, s, _ in snap.inflight)),
    )
    for what, rows in rows_of:
        for (t, s), n in Counter(rows).items():
            if gone(t, s):
                out.append(f"{what}: {n} entries of subscriber {snap.sub(s)} on topic {snap.topic(t)}, which it does not take")
    return out


def _counters_match(snap: Snapshot, config: Config) -> list[str]:
    """The persisted counters STATUS reports against what the indexes hold."""
    out = []
    stored = Counter(t for t, m in snap.bodies if not snap.hidden(t, m))
    ready = Counter((t, s, p) for t, s, p, pos in snap.ready if not snap.hidden(t, pos))
    inflight = Counter((t, s) for t, s, _ in snap.inflight)
    delayed = Counter((t, s) for t, s, _, _ in snap.delayed)
    for topic, stats in snap.state.topics.items():
        t = snap.state.topic_ids[topic]
        if stats.stored != stored[t]:
            out.append(f"counters: topic {topic!r} counts {stats.stored} stored, the store holds {stored[t]}")
        if stats.stored_bytes != snap.fragment_bytes[t]:
            out.append(f"counters: topic {topic!r} counts {stats.stored_bytes} stored bytes, its messages take {snap.fragment_bytes[t]}")
        for sub, ss in snap.state.subs.get(topic, {}).items():
            s = snap.state.sub_ids.get(sub, 0)  # ids begin at 1: 0 names no rows
            held = [ready[(t, s, p)] for p in range(len(ss.ready))]
            if ss.ready != held:
                out.append(f"counters: {topic!r}/{sub!r} counts {ss.ready} ready, the queues hold {held}")
            if ss.inflight != inflight[(t, s)]:
                out.append(f"counters: {topic!r}/{sub!r} counts {ss.inflight} in flight, the store holds {inflight[(t, s)]}")
            if ss.delayed != delayed[(t, s)]:
                out.append(f"counters: {topic!r}/{sub!r} counts {ss.delayed} delayed, the store holds {delayed[(t, s)]}")
    return out


def fsck(config: Config) -> tuple[list[str], Snapshot]:
    """Check config's DataPath; the problems found and what was read."""
    snap = read_snapshot(config.data_path)
    return check(snap, config), snap
