"""A step's events as the journal's JSON lines, format version 2 (docs/journal.md).

The journal encodes each step's events where they are put, on the thread that
ran the step, in one msgspec call for the whole step, and hands the journal
thread bytes only. Measured (docs/performance.md), encoding on the journal
thread cost the fan-out 8 to 12% of its throughput for some 0.3 us of CPU a
message: every few milliseconds it took the interpreter lock from the event loop
for a burst, and the loop waited, whereas the same encoding inline costs its
CPU and no more.

Version 2 writes less than version 1 for the same events: an `ack` record has
its ids only (the report finds each one's publish), and a column whose entries
are all equal is written once.
"""

from __future__ import annotations

import msgspec

from .events import Event

VERSION = 2  # the V field of every record; bump when a field changes meaning or type
# The per-message columns besides Ids (Event's attribute names). A record with more
# than one message writes a column once when every message has the same value: a
# batch's messages usually share their publish time, attempt, priority and expiry.
COLUMNS = ("pub_ns", "attempts", "bytes", "prio", "expires_ns", "replaced", "delivered")


class Lines:
    """Encodes events as the journal lines of one host."""

    def __init__(self, host: str) -> None:
        # Every record starts with these fields; the event's own fields follow.
        self._head = b'{"V":%d,"Host":%s,' % (VERSION, msgspec.json.encode(host))
        self._encode = msgspec.json.Encoder().encode

    def encode(self, events: list[Event]) -> bytes:
        """One line per event, each ending in a newline; the events' columns are
        folded in place (the journal owns the events it is given)."""
        # An event's JSON with its "{" replaced by the head: cheaper than encode_lines
        # and a pass over its output to put the head in front of each line.
        head, encode = self._head, self._encode
        for event in events:
            fold(event)
        return b"".join([head + encode(event)[1:] + b"\n" for event in events])


def fold(event: Event) -> None:
    """Write each column whose entries are all equal as its first entry only."""
    n = len(event.ids)
    if n < 2:
        return
    for name in COLUMNS:
        column = getattr(event, name)
        if len(column) == n and column.count(column[0]) == n:
            setattr(event, name, column[:1])
