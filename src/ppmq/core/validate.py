"""Checking a publish against its topic before anything is written (PROTOCOL §3 Validation).

A publish is applied whole or not at all, so every message is checked first;
the first problem becomes the reply, naming the message and the field.
"""

from __future__ import annotations

from msgspec import Raw

from ppmq.config import TopicConfig
from ppmq.errors import BadRequest, TooLarge
from ppmq.protocol import messages as p
from ppmq.store.state import NS

MAX_KEY_BYTES = 400  # LMDB keys are at most 511 bytes, and the dedupe index adds 4


# A validated message of a publish, ready to be stored, as a plain tuple:
#   key         bytes | None  the client's, on dedupe topics; None: the broker assigns one
#   prio        int
#   expires_ns  int           0: never
#   payload     bytes | Raw   raw JSON, exactly as received (a Raw: a view of the request's frame)
#   due_ns      int           not delivered before (PROTOCOL §8 Delay, NotBefore); 0: at once
#   origin      bytes | None  a dead-letter copy's Origin object (PROTOCOL §8), delivered with it
# Read by unpacking. prepare() makes one a message, so a plain tuple: a tuple
# display is built inline, a NamedTuple through tuple.__new__ of a subclass.
Prepared = tuple[bytes | None, int, int, bytes | Raw, int, bytes | None]


def prepared(key: bytes | None, prio: int, expires_ns: int, payload: bytes | Raw, due_ns: int = 0, origin: bytes | None = None) -> Prepared:
    """A Prepared made by the broker itself (a dead letter's copy, a redrive, a new expiry), by name."""
    return key, prio, expires_ns, payload, due_ns, origin


def prepare(topic: TopicConfig, messages: list[p.Message], max_message_bytes: int, now_ns: int, first_index: int = 0) -> list[Prepared]:
    """Every message of a publish, checked; raises the RequestError of the first bad one.
    A publish staged in chunks (core/staging.py) passes each chunk's place in the whole
    request as `first_index`, so an error names the message as the client counts it."""
    out: list[Prepared] = []
    max_age_ns = int(topic.max_age * NS) if topic.max_age else 0
    for i, m in enumerate(messages, first_index):
        # The common message is checked without naming it: only an error does (_where).
        if not 0 <= m.priority < topic.priorities:
            raise BadRequest(f"{_where(i)}.Priority: {m.priority} is out of range 0..{topic.priorities - 1} for topic {topic.name!r}")
        payload = m.payload  # not copied: a view of the request's frame, which is bytes (never changed) and which the view keeps alive
        if len(payload) > max_message_bytes:
            raise TooLarge(f"{_where(i)}.Payload: {len(payload)} bytes exceeds MaxMessageBytes ({max_message_bytes})")
        expires = _expires(m, i, now_ns) if m.expires is not None or m.ttl_s is not None else 0
        if not expires and max_age_ns:
            expires = now_ns + max_age_ns
        due = _due(m, i, now_ns) if m.delay is not None or m.not_before is not None else 0
        key = _key(topic, m, i) if topic.dedupe else None
        out.append((key, m.priority, expires, payload, due, None))
    return out


def _where(i: int) -> str:
    """How an error names message i of a publish."""
    return f"Messages[{i}]"


def delayed(messages: list[p.Message]) -> bool:
    """Whether any message of a publish asks to wait (PROTOCOL §8)."""
    return any(m.delay is not None or m.not_before is not None for m in messages)


def _due(m: p.Message, i: int, now_ns: int) -> int:
    """When message i may first be delivered; 0: at once (also for a time already past)."""
    if m.delay is not None and m.not_before is not None:
        raise BadRequest(f"{_where(i)}.NotBefore: give either Delay or NotBefore, not both")
    if m.delay is not None:
        return now_ns + delay_ns(m.delay, f"{_where(i)}.Delay") if m.delay else 0
    if m.not_before is None:
        return 0
    try:
        due = p.expires_ns(m.not_before)
    except ValueError as exc:
        raise BadRequest(f"{_where(i)}.NotBefore: {exc}") from None
    return due if due > now_ns else 0


def delay_ns(seconds: float, field: str) -> int:
    """A Delay in seconds as nanoseconds: a number from 0 up to about 30 years."""
    if not 0 <= seconds < 10**9:
        raise BadRequest(f"{field}: {seconds:g} must be a number of seconds from 0 to 1e9")
    return int(seconds * NS)


def _key(topic: TopicConfig, m: p.Message, i: int) -> bytes:
    """Message i's Key on a Dedupe topic."""
    if not m.key:
        raise BadRequest(f"{_where(i)}.Key: required on topic {topic.name!r}, which has Dedupe")
    key = m.key.encode()
    if len(key) > MAX_KEY_BYTES:
        raise BadRequest(f"{_where(i)}.Key: {len(key)} bytes is longer than {MAX_KEY_BYTES}")
    return key


def _expires(m: p.Message, i: int, now_ns: int) -> int:
    """Message i's expiry from its Expires or TTL; 0: none."""
    try:
        expires = p.expires_ns(m.expires)
    except ValueError as exc:
        raise BadRequest(f"{_where(i)}.Expires: {exc}") from None
    if m.ttl_s is None:
        return expires
    if expires:
        raise BadRequest(f"{_where(i)}.TTL: give either Expires or TTL, not both")
    if not 0 < m.ttl_s < 10**9:
        raise BadRequest(f"{_where(i)}.TTL: {m.ttl_s} must be a positive number of seconds")
    return now_ns + int(m.ttl_s * NS)
