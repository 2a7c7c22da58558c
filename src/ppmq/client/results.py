"""What the client library returns: each reply of the broker as a typed value.

The Structs are spelt as the broker writes the replies (`rename="pascal"`), so
`msgspec.json.encode(status)` or `msgspec.to_builtins(status)` is the reply's
`Body` as the broker sent it. Times stay the RFC 3339 text the broker
wrote: it has nanoseconds, which a `datetime` would round away.
"""

from __future__ import annotations

from typing import Any

import msgspec

# --- what a request's Accepted counts ----------------------------------------------------


class PublishResult(msgspec.Struct, frozen=True):
    """A publish the broker has committed: every message of it is stored (all or none,
    PROTOCOL §2). The reply names no keys: the broker assigns them as it stores."""

    accepted: int  # messages stored


class SettleResult(msgspec.Struct, frozen=True):
    """Keys acked, nacked, rejected or touched: those applied, and those the broker
    ignored because they were unknown, not in flight to the subscriber, or already
    settled (counted in its `IgnoredAcks`, PROTOCOL §3)."""

    accepted: int  # keys applied
    ignored: int  # keys sent less keys applied


# --- messages -----------------------------------------------------------------------------


class Origin(msgspec.Struct, rename="pascal", omit_defaults=True):
    """Where a dead letter comes from (PROTOCOL §8): always delivered with it."""

    topic: str
    subscriber: str
    reason: str  # attempts, rejected, expired, overflow
    attempts: int  # deliveries it had, 0 if none
    published: str | None = None  # the original's, RFC 3339
    priority: int | None = None  # the original's
    key: str | None = None  # the original's, which REDRIVE puts back on a Dedupe topic


class Message(msgspec.Struct, rename="pascal", omit_defaults=True):
    """One delivered message (PROTOCOL §5): pushed in a batch, or answered to a TAKE.
    `payload` is the decoded JSON value; `attempt` and `published` come to a
    subscriber with `Metadata: true`, `origin` with every dead letter."""

    key: str
    payload: Any
    priority: int = 0
    expires: str | None = None  # RFC 3339, present only when the message has one
    attempt: int | None = None  # 1 on the first delivery to this subscriber
    published: str | None = None  # RFC 3339 with nanoseconds
    origin: Origin | None = None


class PeekedMessage(msgspec.Struct, rename="pascal", omit_defaults=True):
    """One copy PEEK shows (PROTOCOL §8): a subscriber's, ready or in flight."""

    key: str
    payload: Any
    priority: int
    expires: str | None
    subscriber: str
    state: str  # "ready" (delayed ones included) or "inflight"
    attempt: int  # deliveries so far, 0 if never delivered
    published: str
    deadline: str | None  # when an in-flight copy goes back to ready; None when unset
    origin: Origin | None = None  # a dead letter's


class Taken(msgspec.Struct, rename="pascal"):
    """The Body of a TAKE reply (PROTOCOL §9)."""

    messages: list[Message]


class PeekResult(msgspec.Struct, rename="pascal"):
    """A page of PEEK (PROTOCOL §8); `next` is passed as `after` for the next page,
    None when this page is the last."""

    messages: list[PeekedMessage]
    next: str | None


# --- operator commands ----------------------------------------------------------------------


class PurgeResult(msgspec.Struct, rename="pascal"):
    """PURGE: how many copies (ready, delayed and in flight) were removed."""

    purged: int


class RedriveResult(msgspec.Struct, rename="pascal"):
    """REDRIVE: dead letters published again on their origin topic, and those left
    where they are (origin gone, no Origin, or a newer version waiting there)."""

    redriven: int
    skipped: int


class PingResult(msgspec.Struct, rename="pascal"):
    """PING: the broker's version and how long it has been running."""

    version: str
    uptime_seconds: float


# --- STATUS (PROTOCOL §4, §8, §9, §10) -----------------------------------------------------


class SubscriberStatus(msgspec.Struct, rename="pascal", omit_defaults=True):
    """One subscriber on one topic. `takers` and `waiting_takes` are a Pull
    subscriber's only (None for a push subscriber)."""

    ready: list[int]  # per priority, 0 first
    in_flight: int
    oldest_ready_age: float | None  # seconds; None when nothing is ready
    delivered: int  # every push, redeliveries included
    acked: int
    redelivered: int  # deliveries after a message's first
    expired: int
    ignored_acks: int
    dead_lettered: int
    paused: bool
    delayed: int  # stored, not yet due
    connected: bool  # a connection to its socket now, or a taker for a Pull subscriber
    takers: int | None = None
    waiting_takes: int | None = None


class TopicStatus(msgspec.Struct, rename="pascal"):
    stored: int  # messages not yet finished by every subscriber
    published: int
    replaced: int  # by a newer version of their key (Dedupe)
    expired: int
    stored_bytes: int  # what MaxBytes limits
    dropped: int  # by OverflowPolicy: drop-oldest
    subscribers: dict[str, SubscriberStatus]


class CommitSeconds(msgspec.Struct, rename="pascal"):
    """How long the broker's commits took since it started: cumulative counts by
    upper bound in seconds (Prometheus' `le`, "+Inf" last), and their sum."""

    buckets: dict[str, int]
    sum: float


class ListenerStatus(msgspec.Struct, rename="pascal", omit_defaults=True):
    connections: int
    unknown_queue: int | None = None  # PhpmqSocket's only: frames naming no topic


class Status(msgspec.Struct, rename="pascal", omit_defaults=True):
    """The Body of a STATUS reply: of every topic, or of the one asked for.
    `commit_seconds` and `listeners` are the running process's, the rest survives
    a restart."""

    topics: dict[str, TopicStatus]
    rejected: int  # requests refused, Forbidden ones included
    forbidden: int
    commits: int  # write transactions
    store_used_bytes: int
    store_max_bytes: int
    commit_seconds: CommitSeconds | None = None
    listeners: dict[str, ListenerStatus] = msgspec.field(default_factory=dict)
