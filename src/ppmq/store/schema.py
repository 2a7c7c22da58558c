"""The store's schema: its databases, the layout of their keys and values, and
the values they decode to, shared by the writer (store/store.py) and the readers
(store/reader.py), so that one layout has one definition.

One environment under DataPath holds named databases. Keys are fixed-width
big-endian integers, so a cursor walks them in the order the broker needs:

    bodies    T M0            -> n, the n message ids M (ascending), where each one's record ends,
                                 then each record: Body header, key, message JSON (stored once per topic)
    holders   T M0            -> n, the n message ids M (ascending), the holder count of each,
                                 then each one's (S, prio, pos) for every subscriber not done with it
    ready     T S prio pos0   -> entries (pos, M, attempts) ...   (a run of a subscriber's queue)
    inflight  T S F           -> deadline_ns, then per message: M, prio, pos, attempts, publish_ns
                                                                   (a pushed batch's messages not acked yet)
    deadlines deadline_ns T S F -> ""                              (AckRetry, by time)
    delayed   T S prio pos    -> M, attempts, due_ns              (queued, not to be delivered before due_ns)
    due       due_ns T S prio pos -> ""                            (delayed entries, by time)
    expiry    expires_ns T M  -> ""                                (sweep by time)
    dedupe    T key           -> M                                 (newest version of key)
    copies    T M S           -> expires_ns                        (a copy's own expiry, 0: never)
    copy_expiry expires_ns T M S -> ""                             (those that expire, by time)
    meta      name            -> schema version, name ids, broker state, staging record,
                                 conversion record (store/migrate.py: while an older store is converted)

T is a topic id (u32), S a subscriber id (u16), M a message id and pos a queue
position (u64, both taken from the topic's one sequence, so never reused), prio a
u8, F a pushed batch's number among its subscription's (u64). A batch in flight
is one row, written once and rewritten or deleted as its messages are acked, so
that neither a push nor an ack costs a row per message; which batch holds a
message is looked up in memory (flight_index.FlightIndex). `(prio, pos)` is a message's place in a subscriber's queue: redelivery puts
it back there (PROTOCOL §3), and dedupe may move it.

A subscriber's ready queue is stored as runs, for the same reason: a row holds
the entries of up to READY_RUN places of one priority (2 x READY_RUN after
entries came back into it), so that a publish writes, and a batch takes, a row
per run rather than per message (store/ready.py). The runs of one (T, S, prio)
obey, and fsck checks, one invariant: a run's entries are unique and in
ascending pos, none below its key pos0, and all below the key of the next run.
So the run that holds, or would hold, a place is the one with the largest key
at or below it, and a run that loses its first entries keeps its key.

A holders row is a group: the messages of one publish (up to GROUP_MESSAGES of
them a row) share it, so that a publish writes a row per group and an ack reads
and writes the row of its run of messages once, not a row per message
(store/holders.py). The ids, then the counts (n and each count a u16), come first
as fixed-width columns, so that finding one message is a search of the ids, not
a walk of the entries.
The rows of a topic tile its ids: a row's key M0 is at most each of its ids, and
each of its ids is below the key of the topic's next row; so a message is in at
most one row, the one with the largest key at or below its id. A message whose
holders become empty leaves its row (whose key stays), and an emptied row is
deleted.

A bodies row is a group too, of the messages of one publish (up to
GROUP_MESSAGES a row, fewer once their records pass BODY_ROW_BYTES), so that a
publish writes a row per group and the last ack of a group deletes one, rather
than a row per message each (store/bodies.py). Its ids, then the end of each
record (n a u16, each end a u32, counted from the first record), come first as
columns, so that a message's record is found by a search of the ids and sliced
out. Its rows tile a topic's ids as the holders rows do, and hold only stored
messages: one that goes leaves its row, which is deleted when it empties.

A message has one expiry, its body's, which every subscriber's copy of it
follows, except a copy that a PHPMQ re-queue gave one of its own while other
subscribers held the message too (PROTOCOL §9): that copy's expiry is its row
in `copies`, found by a walk of the topic's few such rows when its subscriber
takes a batch, and swept by `copy_expiry`. The row goes with the copy (an ack,
a removal) and with the message (its deletion, or a new version, whose expiry
is every copy's again).

A publish too large for one transaction is stored over several (core/staging.py):
while meta `staging` names its topic and id range, the rows in that range are
hidden from every walk a delivery, an expiry or a drop makes, so nobody sees the
publish before it is whole.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from functools import lru_cache
from itertools import accumulate, chain, repeat
from operator import itemgetter
from typing import NamedTuple, overload

# Bump when a key or value layout changes, and add the conversion to store/migrate.py.
SCHEMA_VERSION = 6
DBS = (
    b"bodies",
    b"holders",
    b"ready",
    b"inflight",
    b"deadlines",
    b"delayed",
    b"due",
    b"expiry",
    b"dedupe",
    b"copies",
    b"copy_expiry",
    b"meta",
)

TM = struct.Struct(">IQ")
TS = struct.Struct(">IH")
TSPQ = struct.Struct(">IHBQ")
TSM = struct.Struct(">IHQ")
ETM = struct.Struct(">QIQ")
TMS = struct.Struct(">IQH")  # T, M, S: a subscriber's copy of a message (copies)
ETMS = struct.Struct(">QIQH")  # expires_ns, T, M, S (copy_expiry)
DTSM = struct.Struct(">QIHQ")
DUE = struct.Struct(">QIHBQ")  # due_ns, T, S, prio, pos
DELAYED_VAL = struct.Struct(">QIQ")  # M, attempts, due_ns
U64 = struct.Struct(">Q")
READY_ENTRY = struct.Struct(">QQI")  # pos, M, attempts: one entry of a ready run
READY_RUN = 64  # entries a run is built with (see store/ready.py for why this many)
FLIGHT_ENTRY = struct.Struct(">QBQIQ")  # M, prio, pos, attempts, publish_ns: one message of an inflight row
HOLDER = struct.Struct(">HBQ")  # S, prio, pos: one holder of a message, in a holders row
ONE_HOLDERS_HEAD = struct.Struct(">HQH")  # 1, M, holders: the columns of a holders row of one message
# Most messages of one publish that share a holders row: a publish of 100 (a
# batch) is one row, and an ack that covers part of a row rewrites at most this
# many messages' entries. A publish costs the same with any bound from 32 to 512.
GROUP_MESSAGES = 128
# Bytes of records at which a publish starts a new bodies row: a row is rewritten
# whole when some of its messages go before the others, so one is kept small
# enough for that to cost little (64 messages of 1 KiB, or 128 of 200 bytes).
BODY_ROW_BYTES = 1 << 16
U16 = struct.Struct(">H")  # n, the messages of a group row (holders, bodies)


class _U16Bytes(dict[int, bytes]):
    """n -> n as a u16's 2 bytes (a subscriber's id, a holder count), made the
    first time it is asked for and kept: few are ever asked for, and a row
    changed at every ack finds them with a dict lookup, no call."""

    def __missing__(self, n: int) -> bytes:
        value = self[n] = U16.pack(n)
        return value


U16_BYTES = _U16Bytes()
# The columns of a group row of n messages, as one Struct each, made once for
# every n up to twice the most the broker writes in a row (a longer row is a
# damaged one, and gets one made for it): a list is faster to index than a
# cache to ask, and rows are decoded on every ack.
_KEPT_COLUMNS = 2 * GROUP_MESSAGES


class _Columns(dict[int, struct.Struct]):
    """n -> the Struct of `layout` (a struct format, "{n}" standing for n) for n
    messages: made ahead up to _KEPT_COLUMNS, so that a row's columns are a dict
    lookup, no call; made when asked (and not kept) beyond, for the rare longer row."""

    def __init__(self, layout: str) -> None:
        super().__init__((n, struct.Struct(layout.format(n=n))) for n in range(_KEPT_COLUMNS + 1))
        self.layout = layout

    def __missing__(self, n: int) -> struct.Struct:
        return struct.Struct(self.layout.format(n=n))


U32S = _Columns(">{n}I")  # the record ends of a bodies row
# A group row's columns after its n: the ids, then each record's end (bodies)
# or each message's holder count (holders); with n before them, the head a
# row is written with, in one call.
BODY_COLUMNS, HOLDERS_COLUMNS = _Columns(">{n}Q{n}I"), _Columns(">{n}Q{n}H")
BODY_ROW_HEAD, HOLDERS_ROW_HEAD = _Columns(">H{n}Q{n}I"), _Columns(">H{n}Q{n}H")
BODY_HEAD = struct.Struct(">BQQH")  # prio, publish_ns, expires_ns, key length
STAGED = struct.Struct(">IQQ")  # meta `staging`: T, first and last M of a publish being staged
STAGING_KEY = b"staging"
CONVERTING_KEY = b"converting"  # meta: where the conversion of an older store stands (store/migrate.py)


class Body(NamedTuple):
    """A stored message: its delivered JSON object and what the broker needs to know."""

    priority: int
    publish_ns: int
    expires_ns: int  # 0: never
    key: bytes
    fragment: bytes  # {"Key":..,"Payload":..,"Priority":..} as pushed to subscribers


@overload
def decode_body(raw: bytes) -> Body: ...
@overload
def decode_body(raw: bytes | None) -> Body | None: ...
def decode_body(raw: bytes | None) -> Body | None:
    if raw is None:
        return None
    prio, publish_ns, expires_ns, klen = BODY_HEAD.unpack_from(raw)
    start = BODY_HEAD.size
    return Body(prio, publish_ns, expires_ns, raw[start : start + klen], raw[start + klen :])


class Flight(NamedTuple):
    """An in-flight delivery and the queue place it returns to (FLIGHT_ENTRY)."""

    m: int
    prio: int
    pos: int
    attempts: int
    publish_ns: int  # of the version delivered: the journal's ack events carry it without reading the body


class ReadyEntry(NamedTuple):
    prio: int
    pos: int
    msg: int
    attempts: int


class Delayed(NamedTuple):
    """A queue entry that waits (PROTOCOL §8 Delay, NotBefore): it keeps its place
    (prio, pos) and joins the ready queue there when due."""

    prio: int
    pos: int
    msg: int
    attempts: int
    due_ns: int


# A queue entry as a batch takes it into flight, with what the batch and the
# journal need, as a plain tuple:
#   m, prio, pos  int
#   attempts      int    deliveries so far, this one included
#   publish_ns    int
#   fragment      bytes  the message's JSON as delivered
#   flight        bytes  FLIGHT_ENTRY of its first five fields; b"" for a publish
#                        that no open subscriber may take in its step
#   expires_ns    int    0: never
# A publish makes one per message (its first delivery), shared by every
# subscriber's queue: fresh in the step (core/queues.py) and kept in memory after it
# (store/ready_tails.py). A batch from the ready rows makes its own. A plain tuple,
# read by position (the getters below, or unpacking), since a path makes one a
# message, and a NamedTuple costs many times a tuple display to make.
Taken = tuple[int, int, int, int, int, bytes, bytes, int]

# A field of every Taken of a batch, read in C (map, sorted, groupby) where a per-message path needs one.
TAKEN_M, TAKEN_PRIO, TAKEN_ATTEMPTS, TAKEN_FRAGMENT, TAKEN_FLIGHT, TAKEN_EXPIRES = map(itemgetter, (0, 1, 3, 5, 6, 7))

# What a message adds to a batch besides its fragment: a comma, and for a
# Metadata subscriber its Attempt and Published (at most 66 bytes).
BATCH_ENTRY_BYTES = 80


def fitting(fragments: Iterable[bytes], max_bytes: int) -> int:
    """How many of these fragments, in order, a batch of at most `max_bytes`
    holds (BATCH_ENTRY_BYTES each beside them): at least one, so that a message
    larger than the bound still goes out alone."""
    sizes = [len(fragment) + BATCH_ENTRY_BYTES for fragment in fragments]
    if sum(sizes) <= max_bytes:  # the usual case: all of them, in one sum
        return len(sizes)
    ends = list(accumulate(sizes))
    return max(1, bisect_right(ends, max_bytes))


class Staged(NamedTuple):
    """The ids of topic t that a publish in progress has reserved: invisible until it is whole."""

    t: int
    first: int
    last: int

    def hides(self, t: int, m: int) -> bool:
        return t == self.t and self.first <= m <= self.last


def body_records(
    prios: Sequence[int], publish_ns: int, expiries: Sequence[int], keys: Sequence[bytes], fragments: Sequence[bytes]
) -> list[bytes]:
    """Messages published together as their bodies rows hold them, each what
    decode_body reads back: from the publish's columns, packed and joined in
    C, with no Body made. One message (a publish of one, as at a paced rate)
    is packed without columns."""
    if len(keys) == 1:
        key = keys[0]
        return [BODY_HEAD.pack(prios[0], publish_ns, expiries[0], len(key)) + key + fragments[0]]
    heads = map(BODY_HEAD.pack, prios, repeat(publish_ns), expiries, map(len, keys))
    return list(map(b"".join, zip(heads, keys, fragments)))


def encode_body(body: Body) -> bytes:
    """One message as its bodies row holds it."""
    return body_records((body.priority,), body.publish_ns, (body.expires_ns,), (body.key,), (body.fragment,))[0]


def u32(t: int) -> bytes:
    return t.to_bytes(4, "big")


@lru_cache(maxsize=256)
def repeated(entry: struct.Struct, n: int) -> struct.Struct:
    """n entries of `entry` as one Struct: a row's new entries packed in one call."""
    return struct.Struct(">" + entry.format.lstrip(">") * n)


def body_columns(raw: bytes) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """A bodies row's message ids, where each one's record ends (counted from
    the first), and the offset of its first record; struct.error if too short."""
    n = U16.unpack_from(raw)[0]
    columns = BODY_COLUMNS[n].unpack_from(raw, 2)
    return columns[:n], columns[n:], 2 + 12 * n


def body_row_spans(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """How records of these sizes, in id order, are cut into bodies rows, as
    (first, end) indexes: a row ends after GROUP_MESSAGES records, or once its
    records reach BODY_ROW_BYTES. The one rule of a publish (store/bodies.py) and
    of a store converted from schema 4 (store/migrate.py)."""
    starts, count, size = [0], 0, 0
    for i, n in enumerate(sizes):
        if count == GROUP_MESSAGES or size >= BODY_ROW_BYTES:
            starts.append(i)
            count = size = 0
        count += 1
        size += n
    return list(zip(starts, [*starts[1:], len(sizes)]))


def encode_body_row(ids: Sequence[int], records: Sequence[bytes]) -> bytes:
    """A bodies row: ids ascending, records[i] the encoded body of ids[i]."""
    n = len(ids)
    return BODY_ROW_HEAD[n].pack(n, *ids, *accumulate(map(len, records))) + b"".join(records)


def record_span(ends: Sequence[int], base: int, i: int) -> tuple[int, int]:
    """Where the i-th record of a bodies row (whose columns are ends and base) begins and ends."""
    return base + (ends[i - 1] if i else 0), base + ends[i]


def replace_body_record(raw: bytes, ends: Sequence[int], base: int, i: int, record: bytes) -> bytes:
    """The bodies row `raw` (whose columns are ends and base) with its i-th
    record replaced by `record`: the ids and the other records copied as they
    are, the ends from i on moved by the change in size."""
    n = len(ends)
    start, end = record_span(ends, base, i)
    moved = map((len(record) - (end - start)).__add__, ends[i:])
    return b"".join((raw[: 2 + 8 * n], U32S[n].pack(*ends[:i], *moved), raw[base:start], record, raw[end:]))


def new_holders_row(subs: Sequence[int], first: int, prios: Sequence[int]) -> bytes:
    """The holders row of new messages first, first + 1, ... of priorities
    prios, each held by every one of subs at its id as position: its head and
    its entries packed in one call, from columns. A row of one message (a
    publish of one, as at a paced rate) is packed without columns."""
    n, held = len(prios), len(subs)
    if n == 1:
        prio, row = prios[0], ONE_HOLDERS_HEAD.pack(1, first, held)
        for s in subs:
            row += HOLDER.pack(s, prio, first)
        return row
    ids = range(first, first + n)
    columns: list[Iterable[int]] = []
    for s in subs:
        columns += (repeat(s), prios, ids)  # (S, prio, pos) of each holder of a message
    return _new_holders_layout(n, held).pack(n, *ids, *repeat(held, n), *chain(*zip(*columns)))


@lru_cache(maxsize=256)
def _new_holders_layout(n: int, held: int) -> struct.Struct:
    """A holders row of n messages with `held` holders each, as one Struct."""
    return struct.Struct(HOLDERS_ROW_HEAD[n].format + HOLDER.format.lstrip(">") * (n * held))


def holders_columns(raw: bytes) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """A holders row's message ids, the holder count of each, and the offset of
    its first (S, prio, pos) entry; struct.error if the row is too short."""
    n = U16.unpack_from(raw)[0]
    columns = HOLDERS_COLUMNS[n].unpack_from(raw, 2)
    return columns[:n], columns[n:], 2 + 10 * n


def encode_holders_row(ids: Sequence[int], counts: Sequence[int], entries: bytes) -> bytes:
    """A holders row: ids ascending, counts[i] holders of ids[i], and their
    HOLDER entries in that order."""
    n = len(ids)
    return HOLDERS_ROW_HEAD[n].pack(n, *ids, *counts) + entries
