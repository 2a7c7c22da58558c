"""Every request the client library sends, and how its reply becomes a result.

Each function here makes one `Call`: the wrapper it sends (PROTOCOL §2, §8, §9)
and how its reply reads. `Client` and `AsyncClient` only carry calls over their
connection (`Exchange` frames them and matches replies), so each request kind
is defined once, for both.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

import msgspec
from msgspec import UNSET, Raw, UnsetType

from ppmq.client.results import (
    Message,
    PeekResult,
    PingResult,
    PublishResult,
    PurgeResult,
    RedriveResult,
    SettleResult,
    Status,
    Taken,
)
from ppmq.errors import ClientError
from ppmq.protocol.messages import Reply

R = TypeVar("R")
# A publish's messages: objects, or each one's JSON object already encoded
Messages: TypeAlias = Sequence[dict[str, Any]] | Sequence[Raw]

_encoder = msgspec.json.Encoder()
_NULL = Raw(b"null")


class Envelope(msgspec.Struct, rename="pascal"):
    """A reply line with its Body left undecoded: the line is read before it is
    known to be the reply the caller waits for, and so of the type it expects."""

    status: int
    id: Raw | UnsetType = UNSET
    accepted: int | None = None
    error: str | None = None
    body: Raw = _NULL


_envelope = msgspec.json.Decoder(Envelope)


@dataclass(frozen=True, slots=True)
class Call(Generic[R]):
    """One request: the wrapper sent, and what its reply (status 200) returns."""

    wrapper: dict[str, Any]
    result: Callable[[Envelope], R]
    wait_s: float = 0.0  # how much longer than the client's timeout the reply may take: a TAKE's Wait


class Exchange:
    """One connection's request ids, and the reading of its reply lines."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def frame(self, call: Call[Any]) -> tuple[bytes, Raw]:
        rid = Raw(b"%d" % next(self._ids))
        # Id first: the broker can find it even in a frame it cannot parse
        return _encoder.encode({"Id": rid, **call.wrapper}) + b"\n", rid

    @staticmethod
    def reply(line: bytes, rid: Raw) -> Envelope | None:
        """The reply to request `rid`, None for a line answering an earlier request
        (one whose caller stopped waiting). A status other than 200 raises
        ClientError, also one without Id: the broker's answer to a frame it
        could not read (413, 408) or a connection it refuses (503). A line
        that is no reply raises msgspec.DecodeError: not the broker's error but
        something else answering on its socket."""
        if not line:
            raise ClientError(0, "the broker closed the connection")
        reply = _envelope.decode(line)
        if reply.id is not UNSET and reply.id != rid:
            return None
        if reply.status != 200:
            raise ClientError(reply.status, reply.error or "")
        return reply


def _body(kind: type[R]) -> Callable[[Envelope], R]:
    """A reply's Body as `kind`, with one decoder made here, once."""
    decoder = msgspec.json.Decoder(kind)
    return lambda reply: decoder.decode(reply.body)


def _nothing(reply: Envelope) -> None:
    return None


_status, _taken, _peek = _body(Status), _body(Taken), _body(PeekResult)
_purge, _redrive, _ping = _body(PurgeResult), _body(RedriveResult), _body(PingResult)
_any_body = msgspec.json.Decoder()


def _given(**keys: Any) -> dict[str, Any]:
    """A wrapper of the keys given: an argument left None is a key not sent, so
    the broker's default applies."""
    return {name: value for name, value in keys.items() if value is not None}


# --- the requests ---------------------------------------------------------------------------


def request(wrapper: dict[str, Any]) -> Call[Reply]:
    """Any wrapper as it is; the reply whole, its Body as plain JSON values."""
    return Call(wrapper, lambda r: Reply(status=r.status, id=r.id, accepted=r.accepted, error=r.error, body=_any_body.decode(r.body)))


def publish(topic: str, messages: Messages) -> Call[PublishResult]:
    """PROTOCOL §2: the messages stored all or none, in order."""
    return Call({"Topic": topic, "Messages": messages}, lambda r: PublishResult(r.accepted or 0))


def settle(field: str, topic: str, subscriber: str, keys: Sequence[str], delay_s: float | None = None) -> Call[SettleResult]:
    """`Acks` (PROTOCOL §3), `Nacks`, `Rejects` or `Touch` (§8) of keys in flight
    to the subscriber; `delay_s` is the `Delay` of Nacks."""
    keys = list(keys)
    wrapper = _given(Topic=topic, Subscriber=subscriber, Delay=delay_s) | {field: keys}
    return Call(wrapper, lambda r: SettleResult(r.accepted or 0, len(keys) - (r.accepted or 0)))


def take(topic: str, subscriber: str, count: int, wait_s: float, acks: Sequence[str] | None) -> Call[list[Message]]:
    """PROTOCOL §9 TAKE, the `acks` (the last batch's) applied first."""
    wrapper = {"Topic": topic, "Subscriber": subscriber, "Command": "TAKE", "Count": count, "Wait": wait_s}
    return Call(wrapper | {"Acks": list(acks)} if acks else wrapper, lambda r: _taken(r).messages, wait_s)


def reconnect(subscriber: str, topic: str | None) -> Call[None]:
    """PROTOCOL §3 RECONNECT: everything in flight to the subscriber (on the topic) back to its queue."""
    return Call(_given(Subscriber=subscriber, Command="RECONNECT", Topic=topic), _nothing)


def status(topic: str | None) -> Call[Status]:
    """PROTOCOL §4 STATUS, of every topic or of `topic`."""
    return Call(_given(Command="STATUS", Topic=topic), _status)


def peek(topic: str, subscriber: str | None, state: str | None, limit: int | None, after: str | None) -> Call[PeekResult]:
    """PROTOCOL §8 PEEK: a page of what waits, changing nothing."""
    return Call(_given(Command="PEEK", Topic=topic, Subscriber=subscriber, State=state, Limit=limit, After=after), _peek)


def purge(topic: str, subscriber: str | None, keys: Sequence[str] | None) -> Call[PurgeResult]:
    """PROTOCOL §8 PURGE: remove ready, delayed and in-flight copies."""
    return Call(_given(Command="PURGE", Topic=topic, Subscriber=subscriber, Keys=_listed(keys)), _purge)


def redrive(topic: str, keys: Sequence[str] | None) -> Call[RedriveResult]:
    """PROTOCOL §8 REDRIVE: the dead letters of `topic` back to their origin."""
    return Call(_given(Command="REDRIVE", Topic=topic, Keys=_listed(keys)), _redrive)


def pause(command: str, subscriber: str, topic: str | None) -> Call[None]:
    """PROTOCOL §8 PAUSE or RESUME of pushes to the subscriber (on the topic)."""
    return Call(_given(Command=command, Subscriber=subscriber, Topic=topic), _nothing)


def ping() -> Call[PingResult]:
    """PROTOCOL §8 PING."""
    return Call({"Command": "PING"}, _ping)


def _listed(keys: Sequence[str] | None) -> list[str] | None:
    return None if keys is None else list(keys)
