"""Prometheus metrics (PROTOCOL §10): the STATUS body in the text exposition format.

The figures are STATUS's, so there is one way to read them: the broker's
persisted counters (which survive a restart as STATUS's do), taken in one step,
plus what only the running process knows (connections, commit times), which the
daemon adds to every STATUS body. The same rendering serves the textfile the
daemon writes every Metrics.Interval and `ppmq metrics`, which asks a running
broker for STATUS over ServerSocket. Reading them costs one step whatever the
message rate: counters, plus the head of each ready queue for the oldest age.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

# fsync on a local SSD takes well under a millisecond to a few; a dying disk, seconds.
COMMIT_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
COMMIT_HELP = "Time of each write step, commit and fsync included, as the writer thread saw it."


class CommitTimes:
    """How long the writer's steps take: kept by the daemon for its lifetime (not
    persisted: a histogram's reset is what rate() expects after a restart).

    A count per bucket and a sum, observed by the event loop after every step.
    prometheus_client's Histogram takes two locks an observation, a fixed cost
    of every step that would show at a paced rate. body()
    may run on the writer's thread: it copies the counts in one C call, and
    at worst sees the sum of one observation more or less than the counts.
    """

    def __init__(self) -> None:
        self._counts = [0] * (len(COMMIT_BUCKETS_S) + 1)  # per bucket, not cumulative; the last above every bound
        self._sum_s = 0.0

    def observe(self, seconds: float) -> None:
        self._counts[bisect_left(COMMIT_BUCKETS_S, seconds)] += 1  # a bucket holds what is at most its bound
        self._sum_s += seconds

    def body(self) -> dict[str, Any]:
        """The STATUS `CommitSeconds`: cumulative counts by upper bound, and the sum."""
        counts = self._counts[:]
        return {"Buckets": dict(zip(_BUCKET_LABELS, accumulate(counts))), "Sum": self._sum_s}


_BUCKET_LABELS = [*map(floatToGoString, COMMIT_BUCKETS_S), "+Inf"]  # as Prometheus writes `le`


class StatusCollector(Collector):
    """The families of one STATUS body; labels as PROTOCOL §10 names them."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    def collect(self) -> Iterator[Metric]:
        yield from _topic_families(self.body["Topics"])
        yield from _subscriber_families(self.body["Topics"])
        yield from _broker_families(self.body)
        yield from _listener_families(self.body.get("Listeners", {}))


def _topic_families(topics: dict[str, Any]) -> Iterator[Metric]:
    for key, name, doc in _TOPIC_COUNTERS:
        yield _family(CounterMetricFamily, name, doc, ["topic"], [([t], s[key]) for t, s in topics.items()])
    for key, name, doc in _TOPIC_GAUGES:
        yield _family(GaugeMetricFamily, name, doc, ["topic"], [([t], s[key]) for t, s in topics.items()])


def _subscriber_families(topics: dict[str, Any]) -> Iterator[Metric]:
    """Per topic and subscriber, from each topic's Subscribers; `Connected` per subscriber alone."""
    subs = [(topic, name, s) for topic, t in topics.items() for name, s in t["Subscribers"].items()]
    ready = [([t, n, str(prio)], count) for t, n, s in subs for prio, count in enumerate(s["Ready"])]
    yield _family(
        GaugeMetricFamily,
        "ppmq_ready_messages",
        "Messages queued for a subscriber, not in flight.",
        ["topic", "subscriber", "priority"],
        ready,
    )
    for key, name, doc in _SUB_COUNTERS:
        yield _family(CounterMetricFamily, name, doc, ["topic", "subscriber"], [([t, n], s[key]) for t, n, s in subs])
    for key, name, doc in _SUB_GAUGES:  # OldestReadyAge is null when nothing is ready: 0 here
        yield _family(GaugeMetricFamily, name, doc, ["topic", "subscriber"], [([t, n], s[key] or 0) for t, n, s in subs])
    for key, name, doc in _PULL_GAUGES:  # in the entries of Pull subscribers only (PROTOCOL §9)
        yield _family(GaugeMetricFamily, name, doc, ["topic", "subscriber"], [([t, n], s[key]) for t, n, s in subs if key in s])
    connected = {n: int(s.get("Connected", False)) for _, n, s in subs}
    yield _family(
        GaugeMetricFamily,
        "ppmq_subscriber_connected",
        "1 while the broker has a connection to the subscriber's socket.",
        ["subscriber"],
        [([n], c) for n, c in connected.items()],
    )


def _broker_families(body: dict[str, Any]) -> Iterator[Metric]:
    """The broker's own; those the running process adds are missing from the
    STATUS of a broker without them (an older one, during an upgrade)."""
    for key, name, doc in _BROKER_COUNTERS:
        yield CounterMetricFamily(name, doc, value=body[key])
    for key, name, doc in _BROKER_GAUGES:
        if key in body:
            yield GaugeMetricFamily(name, doc, value=body[key])
    if "CommitSeconds" in body:
        commits = body["CommitSeconds"]
        yield HistogramMetricFamily(
            "ppmq_commit_duration_seconds", COMMIT_HELP, buckets=list(commits["Buckets"].items()), sum_value=commits["Sum"]
        )


def _listener_families(listeners: dict[str, Any]) -> Iterator[Metric]:
    """Per listener (ServerSocket, PhpmqSocket), from STATUS `Listeners`, which
    the running process adds; a key only some listeners have (UnknownQueue) is
    a row of those only."""
    for kind, key, name, doc in _LISTENER_FAMILIES:
        yield _family(kind, name, doc, ["listener"], [([n], s[key]) for n, s in listeners.items() if key in s])


def _family(kind: type, name: str, doc: str, labels: list[str], rows: list[tuple[list[str], float]]) -> Metric:
    family = kind(name, doc, labels=labels)
    for values, value in rows:
        family.add_metric(values, value)
    return family


# (STATUS key, family, help): counters end in _total in the exposition.
_TOPIC_COUNTERS = (
    ("Published", "ppmq_published_messages", "Messages accepted for the topic."),
    ("Expired", "ppmq_expired_messages", "Messages of the topic removed past their Expires."),
    ("Replaced", "ppmq_replaced_messages", "Messages replaced by a newer one with the same Key (Dedupe)."),
    ("Dropped", "ppmq_dropped_messages", "Messages dropped to make room (OverflowPolicy: drop-oldest)."),
)
_TOPIC_GAUGES = (
    ("Stored", "ppmq_stored_messages", "Messages of the topic not yet finished by every subscriber."),
    ("StoredBytes", "ppmq_stored_bytes", "Bytes of the topic's stored messages, as delivered (what MaxBytes limits)."),
)
_SUB_COUNTERS = (
    ("Delivered", "ppmq_delivered_messages", "Pushes of a message to the subscriber, redeliveries included."),
    ("Acked", "ppmq_acked_messages", "Messages the subscriber acknowledged."),
    ("Redelivered", "ppmq_redelivered_messages", "Pushes of a message to the subscriber after its first."),
    (
        "DeadLettered",
        "ppmq_dead_lettered_messages",
        "Messages given up for the subscriber (MaxAttempts, Rejects) or dead-lettered for it (expired, overflow).",
    ),
)
_SUB_GAUGES = (
    ("InFlight", "ppmq_inflight_messages", "Messages delivered to the subscriber and not yet acknowledged."),
    ("OldestReadyAge", "ppmq_oldest_ready_age_seconds", "Age of the oldest message ready for the subscriber; 0 when none is."),
    ("Delayed", "ppmq_delayed_messages", "Messages queued for the subscriber that are not due yet (Delay, NotBefore)."),
    ("Paused", "ppmq_subscriber_paused", "1 while the subscription is paused (PAUSE), else 0."),
)
_PULL_GAUGES = (
    (
        "Takers",
        "ppmq_takers",
        "Takers (ServerSocket connections, PHPMQ consumers) holding the Pull subscriber's messages or waiting in a TAKE.",
    ),
    ("WaitingTakes", "ppmq_waiting_takes", "TAKEs of the Pull subscriber waiting for messages."),
)
_BROKER_COUNTERS = (
    ("Rejected", "ppmq_rejected_requests", "Requests answered with an error status."),
    ("Forbidden", "ppmq_forbidden_requests", "Requests refused for the peer's credentials (also in rejected)."),
    ("Commits", "ppmq_commits", "Write transactions committed."),
)
_LISTENER_FAMILIES = (
    (
        GaugeMetricFamily,
        "Connections",
        "ppmq_connections",
        "Connections open on the listener (MaxConnections bounds all listeners' together).",
    ),
    (CounterMetricFamily, "UnknownQueue", "ppmq_unknown_queue", "Frames naming a queue that is no topic; each closed its connection."),
)
_BROKER_GAUGES = (
    ("StoreUsedBytes", "ppmq_store_used_bytes", "Bytes of the store's pages in use."),
    ("StoreMaxBytes", "ppmq_store_max_bytes", "MaxStoreBytes: past it, publishes get status 507."),
)


def exposition(body: dict[str, Any]) -> bytes:
    """A STATUS body in the Prometheus text format, by prometheus_client's own writer."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(body))
    return generate_latest(registry)


TEXTFILE_MODE = 0o644  # node_exporter runs as a user of its own; the service's UMask is 0077


def write_textfile(path: str, text: bytes) -> None:
    """Replace `path` whole, so that node_exporter never reads half a file: a
    temp file beside it, whose name does not end in .prom (the collector would
    read it), renamed over it."""
    folder, name = os.path.split(path)
    temp = os.path.join(folder, f".{name}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, TEXTFILE_MODE)
    with open(fd, "wb") as f:
        os.fchmod(fd, TEXTFILE_MODE)  # whatever the umask took away
        f.write(text)
    os.replace(temp, path)
