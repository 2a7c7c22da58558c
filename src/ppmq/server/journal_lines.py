"""A step's events as the journal's JSON lines, format version 2 (docs/journal.md).

The journal encodes each step's events where they are put, on the thread that
ran the step, with msgspec into one buffer for the whole step, and hands the
journal thread bytes only. Encoding on the journal thread would take the
interpreter lock from the event loop in a burst every few milliseconds, and the
loop would wait; inline, the encoding costs its CPU and no more
(docs/performance.md, "Design choices measured").

Version 2 writes less than version 1 for the same events: an `ack` record has
its ids only (the report finds each one's publish), and a column whose entries
are all equal is written once.
"""

from __future__ import annotations

import msgspec

from ppmq.core.events import COLUMNS, Event

VERSION = 2  # the V field of every record; bump when a field changes meaning or type
# Where one event's JSON ends and the next begins in the encoding of a list of
# events: an event has no object inside it, and a quote inside a string is
# escaped, so this is found nowhere else.
BETWEEN = b'},{"Event":'
FIRST = len(b'[{"Event":')  # what comes before the first event's kind


class Lines:
    """Encodes events as the journal lines of one host."""

    def __init__(self, host: str) -> None:
        # Every record starts with these fields; the event's own fields follow.
        head = b'{"V":%d,"Host":%s,' % (VERSION, msgspec.json.encode(host))
        self._head = head + b'"Event":'
        self._between = b"}\n" + self._head
        self._encode = msgspec.json.Encoder().encode

    def encode(self, events: list[Event]) -> bytes:
        """One line per event, each ending in a newline; the events' columns are
        folded in place (the journal owns the events it is given). The events
        are encoded as one list, whose brackets and joining commas become the
        head of each record and the newlines between them."""
        if not events:
            return b""
        for event in events:
            if event.event in COLUMNS and len(event.ids) > 1:  # a column of one message has nothing to fold
                fold(event)
        listed = self._encode(events)  # [{"Event":...},{"Event":...}]
        return self._head + listed[FIRST:-1].replace(BETWEEN, self._between) + b"\n"


def fold(event: Event) -> None:
    """Write each column whose entries are all equal as its first entry only:
    a batch's messages usually share their publish time, attempt, priority and expiry."""
    n = len(event.ids)  # at least 2: encode folds no event of one message
    for name in COLUMNS[event.event]:
        column = getattr(event, name)
        # Its middle and last entries first: a column of mixed entries (priorities
        # in turn, sizes that vary) is told apart at once, without counting it all.
        if column and len(column) == n and column[-1] == column[0] == column[n // 2] and column.count(column[0]) == n:
            setattr(event, name, column[:1])
