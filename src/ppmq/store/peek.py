"""PEEK (PROTOCOL §8): what a topic's queues hold, read without changing anything.

Entries come in delivery order: subscriber by subscriber (by name), its ready
queue first (by place; delayed entries after the ready ones, by place), then
what is in flight to it (by message id). A page ends after `Limit` entries with
a `Next` cursor: where the last entry stood, so the next page starts right after
it with one cursor move however long the queue, and a queue that changed in
between is read as it is then, never twice the same entry in one place.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import NamedTuple

import msgspec

from ppmq.errors import BadRequest
from ppmq.protocol import messages as p
from ppmq.store.schema import Body
from ppmq.store.store import Txn

DEFAULT_LIMIT = 10
MAX_LIMIT = 1000
STATES = ("ready", "inflight")
_READY, _DELAYED, _INFLIGHT = 0, 1, 2  # the parts of a subscriber's entries, in order


class Cursor(NamedTuple):
    """Where a page ended: after this subscriber's entry at (part, prio, pos)."""

    sub: str
    part: int
    prio: int
    pos: int

    def encode(self) -> str:
        return base64.urlsafe_b64encode(msgspec.msgpack.encode(tuple(self))).decode()

    @classmethod
    def decode(cls, text: str) -> Cursor:
        try:
            return cls(*msgspec.msgpack.decode(base64.urlsafe_b64decode(text.encode()), type=tuple[str, int, int, int]))
        except (ValueError, TypeError, msgspec.DecodeError):
            raise BadRequest("After: not a Next cursor of a PEEK reply") from None


def limit_of(limit: int | None) -> int:
    if limit is None:
        return DEFAULT_LIMIT
    if not 1 <= limit <= MAX_LIMIT:
        raise BadRequest(f"Limit: {limit} is out of range 1..{MAX_LIMIT}")
    return limit


def parts_of(state: str | None) -> tuple[int, ...]:
    if state is None:
        return (_READY, _DELAYED, _INFLIGHT)
    if state not in STATES:
        raise BadRequest(f"State: {state!r} is not one of {', '.join(STATES)}")
    return (_READY, _DELAYED) if state == "ready" else (_INFLIGHT,)


def peek(txn: Txn, t: int, subs: dict[str, int], parts: tuple[int, ...], limit: int, after: Cursor | None) -> dict:
    """The `Body` of a PEEK reply: up to `limit` entries of the subscribers `subs`
    (name -> id) after the cursor, and the cursor of the next page, if any."""
    out: list[dict] = []
    last: Cursor | None = None
    for name in sorted(subs):
        if after is not None and name < after.sub:
            continue
        for part in parts:
            start = after if after is not None and (after.sub, after.part) == (name, part) else None
            if after is not None and name == after.sub and part < after.part:
                continue
            for cursor, entry in _entries(txn, t, subs[name], name, part, start):
                if len(out) == limit:
                    assert last is not None  # limit_of: 1 or more, so an entry came before
                    return {"Messages": out, "Next": last.encode()}
                out.append(entry)
                last = cursor
    return {"Messages": out, "Next": None}


def _entries(txn: Txn, t: int, s: int, name: str, part: int, start: Cursor | None) -> Iterator[tuple[Cursor, dict]]:
    """One part of one subscriber's entries, each with its cursor, after `start`;
    a copy with an expiry of its own (PROTOCOL §9) shows that one."""
    own = txn.copy_expiries(t, s)
    if part == _INFLIGHT:
        for flight, deadline_ns in txn.flights.deadlines_of(t, s):
            body = txn.get_body(t, flight.m)
            if body is not None and (start is None or flight.m > start.pos):
                expires_ns = own.get(flight.m, body.expires_ns)
                yield Cursor(name, part, 0, flight.m), _entry(body, expires_ns, name, "inflight", flight.attempts, deadline_ns)
        return
    after = (0, 0) if start is None else (start.prio, start.pos + 1)
    rows = txn.ready_of(t, s, after) if part == _READY else txn.delayed_of(t, s, after)
    for row in rows:
        body = txn.get_body(t, row.msg)
        if body is not None:
            yield Cursor(name, part, row.prio, row.pos), _entry(body, own.get(row.msg, body.expires_ns), name, "ready", row.attempts, 0)


def _entry(body: Body, expires_ns: int, sub: str, state: str, attempts: int, deadline_ns: int) -> dict:
    """One message as PEEK shows it; a dead letter's entry also has its `Origin`."""
    payload, origin = p.fragment_parts(body.fragment)
    entry = {
        "Key": body.key.decode(),
        "Payload": msgspec.Raw(payload),
        "Priority": body.priority,
        "Expires": p.format_expires(expires_ns) if expires_ns else None,
        "Subscriber": sub,
        "State": state,
        "Attempt": attempts,
        "Published": p.format_expires(body.publish_ns),
        "Deadline": p.format_expires(deadline_ns) if deadline_ns else None,
    }
    return entry if origin is None else entry | {"Origin": origin}
