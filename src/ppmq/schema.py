"""The store's schema: its databases, the layout of their keys and values, and
the values they decode to, shared by the writer (store.py) and the readers
(reader.py), so that one layout has one definition.

One environment under DataPath holds named databases. Keys are fixed-width
big-endian integers, so a cursor walks them in the order the broker needs:

    bodies    T M             -> Body header, key, message JSON   (stored once per topic)
    holders   T M             -> (S, prio, pos) for every subscriber not done with M
    ready     T S prio pos0   -> entries (pos, M, attempts) ...   (a run of a subscriber's queue)
    inflight  T S F           -> deadline_ns, then per message: M, prio, pos, attempts, publish_ns
                                                                   (a pushed batch's messages not acked yet)
    deadlines deadline_ns T S F -> ""                              (AckRetry, by time)
    delayed   T S prio pos    -> M, attempts, due_ns              (queued, not to be delivered before due_ns)
    due       due_ns T S prio pos -> ""                            (delayed entries, by time)
    expiry    expires_ns T M  -> ""                                (sweep by time)
    dedupe    T key           -> M                                 (newest version of key)
    meta      name            -> schema version, name ids, broker state, staging record

T is a topic id (u32), S a subscriber id (u16), M a message id and pos a queue
position (u64, both taken from the topic's one sequence, so never reused), prio a
u8, F a pushed batch's number among its subscription's (u64). A batch in flight
is one row, written once and rewritten or deleted as its messages are acked, so
that neither a push nor an ack costs a row per message; which batch holds a
message is looked up in memory (queue_rows.FlightIndex). `(prio, pos)` is a message's place in a subscriber's queue: redelivery puts
it back there (PROTOCOL §3), and dedupe may move it.

A subscriber's ready queue is stored as runs, for the same reason: a row holds
the entries of up to READY_RUN places of one priority (2 x READY_RUN after
entries came back into it), so that a publish writes, and a batch takes, a row
per run rather than per message (ready_rows.py). The runs of one (T, S, prio)
obey, and fsck checks, one invariant: a run's entries are unique and in
ascending pos, none below its key pos0, and all below the key of the next run.
So the run that holds, or would hold, a place is the one with the largest key
at or below it, and a run that loses its first entries keeps its key.

A publish too large for one transaction is stored over several (staging.py):
while meta `staging` names its topic and id range, the rows in that range are
hidden from every walk a delivery, an expiry or a drop makes, so nobody sees the
publish before it is whole.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

# Bump when a key or value layout changes, and add the conversion to migrate.py.
SCHEMA_VERSION = 4
DBS = (b"bodies", b"holders", b"ready", b"inflight", b"deadlines", b"delayed", b"due", b"expiry", b"dedupe", b"meta")

TM = struct.Struct(">IQ")
TS = struct.Struct(">IH")
TSPQ = struct.Struct(">IHBQ")
TSM = struct.Struct(">IHQ")
ETM = struct.Struct(">QIQ")
DTSM = struct.Struct(">QIHQ")
DUE = struct.Struct(">QIHBQ")  # due_ns, T, S, prio, pos
DELAYED_VAL = struct.Struct(">QIQ")  # M, attempts, due_ns
U64 = struct.Struct(">Q")
READY_ENTRY = struct.Struct(">QQI")  # pos, M, attempts: one entry of a ready run
READY_RUN = 64  # entries a run is built with (see ready_rows.py for why this many)
FLIGHT_ENTRY = struct.Struct(">QBQIQ")  # M, prio, pos, attempts, publish_ns: one message of an inflight row
HOLDER = struct.Struct(">HBQ")  # S, prio, pos
BODY_HEAD = struct.Struct(">BQQH")  # prio, publish_ns, expires_ns, key length
STAGED = struct.Struct(">IQQ")  # meta `staging`: T, first and last M of a publish being staged
STAGING_KEY = b"staging"


class Body(NamedTuple):
    """A stored message: its delivered JSON object and what the broker needs to know."""

    priority: int
    publish_ns: int
    expires_ns: int  # 0: never
    key: bytes
    fragment: bytes  # {"Key":..,"Payload":..,"Priority":..} as pushed to subscribers


def decode_body(raw: bytes | None) -> Body | None:
    if raw is None:
        return None
    prio, publish_ns, expires_ns, klen = BODY_HEAD.unpack_from(raw)
    start = BODY_HEAD.size
    return Body(prio, publish_ns, expires_ns, raw[start : start + klen], raw[start + klen :])


class Gone(NamedTuple):
    """A deleted message, as far as the indexes and counters care."""

    expires_ns: int
    key: bytes
    size: int  # bytes of its delivered JSON (Body.fragment)


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


class Taken(NamedTuple):
    """A ready entry a batch moved into flight, with what the batch and the journal
    need; its first five fields are its Flight."""

    m: int
    prio: int
    pos: int
    attempts: int  # deliveries so far, this one included
    publish_ns: int
    fragment: bytes


class Staged(NamedTuple):
    """The ids of topic t that a publish in progress has reserved: invisible until it is whole."""

    t: int
    first: int
    last: int

    def hides(self, t: int, m: int) -> bool:
        return t == self.t and self.first <= m <= self.last


class StoreError(Exception):
    """The store cannot be opened or used."""


class StoreFullError(StoreError):
    """LMDB's map is full: the transaction was rolled back."""


def encode_body(body: Body) -> bytes:
    head = BODY_HEAD.pack(body.priority, body.publish_ns, body.expires_ns, len(body.key))
    return b"".join((head, body.key, body.fragment))


def u32(t: int) -> bytes:
    return t.to_bytes(4, "big")
