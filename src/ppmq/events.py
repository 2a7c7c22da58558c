"""What the broker's state machine reports having done, for the delivery journal.

`Broker.step` returns these in `Step.events`: one per kind, topic and subscriber
within a step (a batch), with per-message columns, so the cost is a few list
appends per message and one small object per batch. The journal writes them as
JSON lines; docs/journal.md is the format, field by field.
"""

from __future__ import annotations

import msgspec

PUBLISH = "publish"  # stored by a publish: Ids, Prio, Bytes, ExpiresNs, Replaced
DELIVER = "deliver"  # pushed to a subscriber: Ids, PubNs, Attempts, Bytes
ACK = "ack"  # acknowledged (or written, with Reason "AutoAck"): Ids, PubNs, Attempts
REQUEUE = "requeue"  # back to ready after delivery: Ids; Reason AckRetry, Reconnect, Unconfirmed, or MaxAttempts (given up)
RETURN = "return"  # a batch that never reached the subscriber: Ids; it is not counted as delivered
EXPIRE = "expire"  # expired for a subscriber: Ids, PubNs, Delivered
OVERFLOW = "overflow"  # dropped by OverflowPolicy drop-oldest, for a subscriber: Ids, PubNs, Delivered
REJECT = "reject"  # a request answered with an error: Status, Error, Count (messages in it)
DROPPED = "dropped"  # written by the journal itself: Count events lost to a full queue or disk


class Event(msgspec.Struct, rename="pascal", omit_defaults=True, kw_only=True):
    """One batch of one kind; the columns of a kind are parallel arrays, one entry a message."""

    event: str  # first field: the journal splices Host and V in front of it
    ts: int  # when the step ran, ns since the Unix epoch
    topic: str | None = None
    subscriber: str | None = None
    reason: str | None = None
    ids: list[int] = []  # message ids: unique per topic, never reused; a dedupe key keeps its id
    pub_ns: list[int] = []  # publish time of the version concerned, ns since the epoch
    attempts: list[int] = []  # deliveries of that version to this subscriber so far, this one included
    bytes: list[int] = []  # size of the message as delivered (its JSON object)
    prio: list[int] = []
    expires_ns: list[int] = []  # 0: never
    replaced: list[bool] = []  # the publish replaced an unfinished message with the same Key
    delivered: list[bool] = []  # the expired (or dropped) message had been pushed to the subscriber
    status: int | None = None
    error: str | None = None
    count: int | None = None
