"""Bench payloads carry their publish instant, so subscribers can time delivery.

CLOCK_MONOTONIC is one clock for every process of the host, so a subscriber can
subtract a publisher's reading from its own.
"""

from __future__ import annotations

import time

STAMP = 20  # digits of time.monotonic_ns() at the start of every payload


def make(size: int, stamp_ns: int) -> bytes:
    return b"%020d" % stamp_ns + b"x" * (size - STAMP)


def latency_us(payload: bytes, now_ns: int) -> int:
    """Microseconds from publish to now; payload may start with a JSON quote."""
    start = 1 if payload[:1] == b'"' else 0
    return (now_ns - int(payload[start : start + STAMP])) // 1000


def now_ns() -> int:
    return time.monotonic_ns()
