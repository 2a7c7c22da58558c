"""What goes into a broker step and what comes out of it.

These are the values the writer, the server and the delivery links exchange with
`Broker.step`; they live apart from the state machine so that the asyncio side
can name them without reading (or importing) how a step applies them. Each is a
frozen msgspec Struct: made for every request and every batch, it is built in C
with no call of ours, where a NamedTuple goes through a Python `__new__`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import msgspec

from ppmq.config import Config
from ppmq.core.events import Event
from ppmq.core.staging import Answer
from ppmq.errors import RequestError
from ppmq.protocol import messages as p


class Unwritten(msgspec.Struct, frozen=True):
    """A batch not written whole to its subscriber (its write failed, or its
    connection went first): given back, and not counted as delivered."""

    subscriber: str
    topic: str
    msgs: list[int]


class Written(msgspec.Struct, frozen=True):
    """A batch written whole to a subscriber of an `AckRequired: false` topic."""

    subscriber: str
    topic: str
    msgs: list[int]


class Invalid(msgspec.Struct, frozen=True):
    """A frame the server could not decode: counted, and answered in order."""

    error: RequestError
    id: msgspec.Raw | msgspec.UnsetType


class Reconfigure(msgspec.Struct, frozen=True):
    """Switch to a new config (SIGHUP) in this transaction, or refuse it whole."""

    config: Config


class Guarded(msgspec.Struct, frozen=True):
    """A request from a connection, with that connection's access check: run when
    the request is applied, so it is judged by the rules of the config it is
    applied under, also when a reload comes between its arrival and its step."""

    request: p.Request
    check: Callable[[p.Request], None]  # raises Forbidden


class Take(msgspec.Struct, frozen=True):
    """A TAKE (PROTOCOL §9) on behalf of `taker`: one connection, or one consumer of
    another listener, numbered by whoever makes the ops (`takes.TakeWaits.new_taker`).
    The messages it gets stay that taker's until they are acked or it is
    `Abandoned`; `request` is the wrapper (Command TAKE, Topic, Subscriber, Count,
    Id, and maybe Acks to apply first), `check` its access check, as in Guarded."""

    taker: int
    request: p.Request
    check: Callable[[p.Request], None] | None = None  # raises Forbidden


class Abandoned(msgspec.Struct, frozen=True):
    """The taker is gone (its connection closed): every message it took and has
    not acked goes back to ready at its place, now (PROTOCOL §9 Competing consumers)."""

    taker: int


class Requeue(msgspec.Struct, frozen=True):
    """PHPMQ's re-queue (PROTOCOL §9): `key`, in flight to `subscriber`, goes to
    the end of its priority with a new expiry, as a delivery attempt. Not a
    Request: ServerSocket has no such command, and it needs no Id."""

    topic: str
    subscriber: str
    key: str
    ttl_s: int  # the message's new time to live; 0: it never expires
    check: Callable[[], None]  # raises Forbidden: the connection's access check, run when applied


Op: TypeAlias = p.Request | Guarded | Take | Abandoned | Unwritten | Written | Invalid | Reconfigure | Requeue


class Delivery(msgspec.Struct, frozen=True):
    """A committed batch for one subscriber's connection."""

    subscriber: str
    topic: str
    msgs: list[int]
    frame: bytes
    auto_ack: bool  # AckRequired: false - complete once written
    lane: int = 0  # with Connections > 1, the lane whose connection takes it (core/lanes.py)


class Step(msgspec.Struct, frozen=True):
    """What one transaction produced."""

    # One per op; None for internal ops, and for a publish staged over later steps
    # (core/staging.py), whose reply comes in `finished` of the step that ends it.
    replies: list[p.Reply | None]
    deliveries: list[Delivery]
    events: list[Event] = []  # for the journal; empty unless the config keeps one
    finished: list[Answer] = []  # staged publishes of earlier steps, answered now
    # Subscriber -> topic -> messages that left flight, for subscribers with
    # Connections > 1, whose links free room on the lane that carried each (core/lanes.py).
    left: dict[str, dict[str, list[int]]] = {}


def request_of(op: Op) -> p.Request | None:
    """The client's request an op carries; None for internal ops."""
    if type(op) is p.Request:
        return op
    if type(op) is Guarded or type(op) is Take:
        return op.request
    return None


def request_id(op: Op) -> msgspec.Raw | msgspec.UnsetType:
    """The Id to answer an op with; internal ops have none."""
    req = request_of(op)
    if req is not None:
        return req.id
    return op.id if isinstance(op, Invalid) else msgspec.UNSET
