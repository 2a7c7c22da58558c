"""What the broker's state machine reports having done, for the delivery journal.

`Broker.step` returns these in `Step.events`: one per kind, topic and subscriber
within a step (a batch), with per-message columns. The columns are built a
batch at a time (comprehensions, or zip to transpose rows) and extend the
event's lists in one call each: the state machine's share of the journal's
cost is a few C-level passes per batch, not Python calls per message. The
first batch of an event, which in most steps is its only one, builds the event
whole, its columns given to the constructor rather than extended from empty
lists. The journal writes them as JSON lines; docs/journal.md is the format, field by field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")

PUBLISH = "publish"  # stored by a publish
DELIVER = "deliver"  # pushed to a subscriber
ACK = "ack"  # acknowledged (or written, with Reason "AutoAck"); the report finds each one's publish
REQUEUE = "requeue"  # given back after delivery; Reason AckRetry, Reconnect, Unconfirmed, Abandoned, Requeue, or MaxAttempts (given up)
RETURN = "return"  # an unwritten batch given back; it is not counted as delivered
EXPIRE = "expire"  # expired for a subscriber
OVERFLOW = "overflow"  # dropped by OverflowPolicy drop-oldest, for a subscriber
NACK = "nack"  # given back by the subscriber (PROTOCOL §8 Nacks); DelayNs when delayed
REJECTED = "rejected"  # given up on by the subscriber (PROTOCOL §8 Rejects)
TOUCH = "touch"  # ack deadline restarted (PROTOCOL §8 Touch)
PURGE = "purge"  # removed by PURGE, for a subscriber
REDRIVE = "redrive"  # moved back from a dead-letter topic: Topic and Subscriber are the origin; Ids are the new ids there
PAUSE = "pause"  # PAUSE of a subscription: no columns
RESUME = "resume"  # RESUME of a subscription: no columns
COLUMNLESS = (PAUSE, RESUME)  # kinds whose events carry no message
REJECT = "reject"  # a request answered with an error: Status, Error, Count (messages in it)
DROPPED = "dropped"  # written by the journal itself: Count events lost to a full queue or disk

# The per-message columns of each kind besides Ids (Event's attribute names):
# what the journal folds, and only these, so that a kind that has none (an ack)
# costs its encoder no look at seven empty lists.
COLUMNS = {
    PUBLISH: ("prio", "bytes", "expires_ns", "replaced"),
    DELIVER: ("pub_ns", "attempts", "bytes"),
    EXPIRE: ("pub_ns", "delivered"),
    OVERFLOW: ("pub_ns", "delivered"),
    PURGE: ("pub_ns", "delivered"),
    NACK: ("pub_ns", "attempts"),
    REJECTED: ("pub_ns", "attempts"),
}


class Event(msgspec.Struct, rename="pascal", omit_defaults=True, gc=False):
    """One batch of one kind; the columns of a kind are parallel arrays, one entry
    a message, except that a column of one entry where `ids` has more holds for
    every message: the journal's way of writing a column whose entries are all
    equal (docs/journal.md), kept from the start where a step knows it."""

    event: str  # first field: the journal splices Host and V in front of it
    ts: int  # when the step ran, ns since the Unix epoch
    topic: str | None = None
    subscriber: str | None = None
    reason: str | None = None
    ids: list[int] = []  # message ids: unique per topic, never reused; a dedupe key keeps its id
    # The per-message columns, absent (None) from kinds that have none of them:
    # `new` gives an event the lists of its kind's COLUMNS only, where a default of
    # [] would have every event allocate seven lists it never fills.
    pub_ns: list[int] | None = None  # publish time of the version concerned, ns since the epoch
    attempts: list[int] | None = None  # deliveries of that version to this subscriber so far, this one included
    bytes: list[int] | None = None  # size of the message as delivered (its JSON object)
    prio: list[int] | None = None
    expires_ns: list[int] | None = None  # 0: never
    replaced: list[bool] | None = None  # the publish replaced an unfinished message with the same Key
    delivered: list[bool] | None = None  # the expired (or dropped, or purged) message had been pushed to the subscriber
    delay_ns: int | None = None  # of a nack with a Delay
    status: int | None = None
    error: str | None = None
    count: int | None = None


def new(kind: str, ts: int, topic: str | None, sub: str | None = None, reason: str | None = None) -> Event:
    """An event of `kind` without messages yet: empty Ids and empty columns of its kind."""
    event = Event(event=kind, ts=ts, topic=topic, subscriber=sub, reason=reason)
    for name in COLUMNS.get(kind, ()):
        setattr(event, name, [])
    return event


Column = Sequence[int] | int  # a column's entries for some messages, or one value for all of them


def entries(values: Column, n: int) -> Sequence[int]:
    """A column's part for n messages as n entries."""
    return [values] * n if isinstance(values, int) else values


def extend(event: Event, name: str, before: int, values: Column, n: int) -> None:
    """Add n messages' entries to a column of `before` (or of one for all of them):
    `values` has n entries, or is one value for all n. The column stays one entry
    as long as every part added is that value, so the journal need not fold it."""
    column = getattr(event, name)
    if isinstance(values, int):
        if not before:
            setattr(event, name, [values])
            return
        if len(column) == 1 and column[0] == values:
            return
        values = entries(values, n)
    if before > 1 and len(column) == 1:
        column = column * before
        setattr(event, name, column)
    column += values


class StepEvents:
    """The events of the step being applied, one per kind, topic, subscriber and
    reason. A request collects into batches of its own, kept only if it succeeds:
    a rejected request changed nothing, so it reports nothing but its rejection.
    Whether anything is collected is settled at start, as the journal itself is.

    A batch is found by its key (request, kind, topic, subscriber, reason),
    spelled out where it is looked up and tested with `in`, no call made:
    recording is on the path of every message. `request` is the number of the
    request collecting it, or 0 for the step's own batches (a fill's, a timer's,
    an op the server made), which come after every request's. Only `batch` and
    `file` can leave a batch without messages, and only after them does `take`
    look for one.

    A request's batches are collected by numbering it (`numbered`, then
    `request`) and pointing `collecting` at `requests`; `collecting` goes back
    to `own` and `request` to 0 when it ends. The broker does so itself around
    each request (Broker._apply), which is the path of every request, and
    `forget_from` drops the batches of a request that failed."""

    def __init__(self, journaled: bool, now_ns: int) -> None:
        self.journaled = journaled
        self.now_ns = now_ns  # the time of the step: every event's Ts
        self.requests: dict[tuple, Event] = {}  # the batches and rejections of the step's requests, in their order
        self.own: dict[tuple, Event] = {}  # the step's own batches
        self.collecting = self.own  # where batches are collected now: own, or requests
        self.request = 0  # the number of the request collecting them, 0 outside any
        self.numbered = 0  # requests numbered so far
        self._loose = False  # a batch may have found nothing to do

    def batch(self, kind: str, topic: str | None, sub: str | None = None, reason: str | None = None) -> Event:
        """The event of this kind collecting the current step's (or request's) messages."""
        key = (self.request, kind, topic, sub, reason)
        batches = self.collecting
        if key in batches:
            return batches[key]
        self._loose = True
        batches[key] = event = new(kind, self.now_ns, topic, sub, reason)
        return event

    def file(self, event: Event) -> None:
        """An event collected over several steps (a staged publish) becomes this
        step's, where `batch` would look for it."""
        event.ts = self.now_ns
        self._loose = True
        self.collecting[self.request, event.event, event.topic, event.subscriber, event.reason] = event

    def publish(
        self,
        topic: str,
        ids: Sequence[int],
        prio: Sequence[int],
        size: Sequence[int],
        expires_ns: Sequence[int],
        replaced: Sequence[bool] | bool,
    ) -> None:
        """A request's stored messages, column by column: a few C-level list
        copies or extensions per request instead of five appends per message."""
        key = (self.request, PUBLISH, topic, None, None)
        batches = self.collecting
        if key not in batches:  # the usual case: built whole, with no empty lists to extend
            batches[key] = Event(  # by position, in the order of the fields: event, ts, topic, subscriber, reason, ids, pub_ns, attempts, bytes, prio, expires_ns, replaced
                PUBLISH, self.now_ns, topic, None, None, list(ids), None, None, list(size), list(prio), list(expires_ns),
                [replaced] if type(replaced) is bool else list(replaced),
            )  # fmt: skip
            return
        event = batches[key]
        assert event.prio is not None and event.bytes is not None and event.expires_ns is not None, "a publish has its COLUMNS"
        before = len(event.ids)
        event.ids += ids
        event.prio += prio
        event.bytes += size
        event.expires_ns += expires_ns
        extend(event, "replaced", before, replaced, len(ids))

    def deliver(self, topic: str, sub: str, ids: Sequence[int], pub_ns: Column, attempts: Column, size: Iterable[int]) -> None:
        """A batch pushed to sub, column by column; a batch fresh from this step's
        publish gives its publish time and first attempt as one value each."""
        key = (self.request, DELIVER, topic, sub, None)
        batches = self.collecting
        if key not in batches:
            batches[key] = Event(  # by position: event, ts, topic, subscriber, reason, ids, pub_ns, attempts, bytes
                DELIVER, self.now_ns, topic, sub, None, list(ids),
                # an int is one value for all; mypy does not narrow the rest to a sequence on type()
                [pub_ns] if type(pub_ns) is int else list(pub_ns),  # type: ignore[arg-type]
                [attempts] if type(attempts) is int else list(attempts),  # type: ignore[arg-type]
                list(size),
            )  # fmt: skip
            return
        event = batches[key]
        assert event.bytes is not None, "a delivery has its COLUMNS"
        before, n = len(event.ids), len(ids)
        event.ids += ids
        extend(event, "pub_ns", before, pub_ns, n)
        extend(event, "attempts", before, attempts, n)
        event.bytes += size

    def ack(self, topic: str, sub: str, reason: str | None, ids: Sequence[int]) -> None:
        """Messages sub is done with (acked, or written with Reason AutoAck): their ids
        only, which is all an ack costs nothing to tell; the version acked is the
        one last published before it (docs/journal.md)."""
        key = (self.request, ACK, topic, sub, reason)
        batches = self.collecting
        if key in batches:
            batches[key].ids += ids
        else:
            batches[key] = Event(ACK, self.now_ns, topic, sub, reason, [*ids])  # by position: event, ts, topic, subscriber, reason, ids

    def reject(self, topic: str | None, status: int, error: str | None, count: int) -> None:
        """A request answered with an error: after the requests before it."""
        if self.journaled:
            self.numbered += 1
            self.requests[(self.numbered,)] = Event(event=REJECT, ts=self.now_ns, topic=topic, status=status, error=error, count=count)

    def of_request(self, apply: Callable[..., T], *args: Any) -> T:
        """apply(*args), whose batches join the step's only if it returns."""
        self.numbered = number = self.numbered + 1
        self.collecting, self.request = self.requests, number
        try:
            return apply(*args)
        except BaseException:
            self.forget_from(number)
            raise
        finally:
            self.collecting, self.request = self.own, 0

    def forget_from(self, number: int) -> None:
        """A request numbered `number` failed: its batches go, with those of any
        request numbered within it."""
        for key in [key for key in self.requests if key[0] >= number]:
            del self.requests[key]

    def take(self) -> list[Event]:
        """The step's events; batches that found nothing to do are left out."""
        events = [*self.requests.values(), *self.own.values()]  # the requests' batches, then the step's own
        if self._loose:
            events = [e for e in events if e.ids or e.status or e.event in COLUMNLESS]
        self.requests, self.own, self._loose = {}, {}, False
        self.collecting = self.own
        return events

    def clear(self) -> None:
        self.requests, self.own, self._loose = {}, {}, False
        self.collecting = self.own
