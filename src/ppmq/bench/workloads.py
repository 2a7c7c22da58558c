"""The named workloads: what is published, how, and what is measured."""

from __future__ import annotations

from typing import NamedTuple


class Workload(NamedTuple):
    name: str
    messages: int  # published in all (latency: rate_per_s * duration_s)
    size: int  # payload bytes
    durable: bool  # every confirmed publish is on disk (fsync) before the reply
    backlog: bool  # subscribers start reading only once everything is published
    rate_per_s: int = 0  # 0: as fast as confirms come back; else paced
    subscribers: int = 2
    batch: int = 100  # messages per publish, each batch confirmed before the next
    priorities: int = 3
    window: int = 1000  # messages in flight per subscriber (ppmq's Window; the peers' prefetch)
    server_acks: bool = False  # ppmq subscribers ack the ppMQ way: one-way, to ServerSocket
    dedupe: bool = False  # ppmq's topic has Dedupe, and every message a unique Key
    metrics_s: float = 0.0  # ppmq writes a Metrics textfile this often; 0: no Metrics section
    pull: bool = False  # the subscribers are competing workers of one Pull subscriber (ppmq only: TAKE)

    @property
    def paced(self) -> bool:
        return self.rate_per_s > 0


def workloads(backlog_messages: int = 200_000, latency_s: float = 30.0) -> dict[str, Workload]:
    """Every workload by name; the sizes that a flag may change are parameters."""
    rate = 1000
    return {
        w.name: w
        for w in (
            Workload("fanout-durable", 50_000, 200, durable=True, backlog=False),
            Workload("fanout-fast", 50_000, 200, durable=False, backlog=False),
            # one subscriber's messages shared by 4 worker processes, each TAKE with Count and Wait, acks by batch
            Workload("pull", 50_000, 200, durable=True, backlog=False, subscribers=4, pull=True),
            Workload("backlog", backlog_messages, 1024, durable=False, backlog=True),
            Workload("latency", int(rate * latency_s), 200, durable=True, backlog=False, rate_per_s=rate),
            # the broker's own share, without the disk's fsync latency
            Workload("latency-fast", int(rate * latency_s), 200, durable=False, backlog=False, rate_per_s=rate),
        )
    }


def scaled(w: Workload, factor: float) -> Workload:
    """A smaller (or larger) run of the same workload, for a quick look."""
    return w._replace(messages=max(w.batch, int(w.messages * factor)))
