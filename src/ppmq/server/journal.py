"""The delivery journal: the broker's events as JSON lines under DataPath/journal/.

The writer hands each step's events to `Journal.put`, which encodes them
(server/journal_lines.py) and never waits: a bounded queue feeds one journal thread
that appends, rotates and gzips, so a slow or full disk costs journal records
(counted, and reported by a `dropped` record once writing works again), never
broker latency or memory. The journal thread holds the interpreter lock only
briefly: writing and gzipping release it. The journal is an operator's record,
not a durability promise: it is flushed after every batch of steps but never
fsynced. docs/journal.md is the format.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import queue
import shutil
import socket
import threading
import time
from collections import deque
from itertools import repeat
from pathlib import Path
from typing import BinaryIO

from ppmq.core import events as ev
from ppmq.core.events import Event
from ppmq.server.journal_lines import Lines

log = logging.getLogger("ppmq.journal")

QUEUE_STEPS = 4096  # steps waiting for the journal thread; past it their events are dropped
GATHER_S = 0.05  # after waking, the thread lets steps pile up this long: fewer wake-ups, bigger writes
# gzip level of closed segments: the thread gzips while the broker runs, on the
# cores the broker needs, and level 1 takes a fraction of level 6's CPU for files
# somewhat larger (docs/performance.md, "Design choices measured").
GZIP_LEVEL = 1
ACTIVE_SUFFIX = ".jsonl"  # the segment being written
CLOSED_SUFFIX = ".jsonl.gz"


class Journal:
    """Appends events to size-bounded, gzipped segments in `directory`."""

    def __init__(self, directory: str | os.PathLike[str], segment_bytes: int, max_bytes: int, host: str | None = None) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes
        self._lines = Lines(host or socket.gethostname())
        # Each step's lines, appended by the putter and taken off by the journal thread:
        # a deque's append and popleft are single C calls, where a queue.Queue costs a
        # few microseconds of Python locking per step on each side.
        self._pending: deque[bytes] = deque()
        # One item a wake-up of the journal thread: there is something to write,
        # or it is to stop. A SimpleQueue's put and get are single C calls, where
        # a threading.Event's set, wait and clear run a Condition in Python.
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        # The putter woke the thread since the thread last took the lines: a plain
        # attribute, cleared by the thread before it takes them, so that a put
        # never finds it set while its lines would go untaken.
        self._woken = False
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="ppmq-journal", daemon=True)
        self._file: BinaryIO | None = None
        self._size = 0
        self.dropped_queue = 0  # events put while the queue was full (counted by the putter)
        self.dropped_io = 0  # events lost to write errors (counted by the journal thread)
        self._reported = 0

    def start(self) -> Journal:
        """Close what a previous run left open and open the first segment before
        the broker says READY: the broker's descriptors are settled from then on,
        and a disk that refuses the journal is logged at start."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._close_leftovers()
        self._open_first()
        self._thread.start()
        return self

    def put(self, events: list[Event]) -> None:
        """Encode one step's events and queue them; drop them (counted) rather than wait.
        Called from one thread at a time (the broker's event loop)."""
        if len(self._pending) >= QUEUE_STEPS:
            self.dropped_queue += len(events)
            return
        self._pending.append(self._lines.encode(events))
        if not self._woken:
            self._woken = True
            self._wake.put(None)

    def close(self) -> None:
        """Write what is queued, close and gzip the current segment."""
        self._stopping = True
        self._wake.put(None)
        self._thread.join()

    # --- the journal thread ---------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.get()  # a wake-up left over from a round that took its lines already costs one empty round
            if not self._stopping:
                time.sleep(GATHER_S)
            stopping = self._stopping
            # Cleared before taking: a step put after this wakes the thread again.
            self._woken = False
            # What is queued now, each step's lines taken off in one loop in C (the
            # putter may append meanwhile): the lines put later wait for the next round.
            pending = self._pending
            self._write(b"".join(map(deque.popleft, repeat(pending, len(pending)))))
            if stopping:
                self._rotate()
                return

    def _write(self, data: bytes) -> None:
        """Append the lines, closing a segment as soon as it reaches segment_bytes."""
        lost = self.dropped_queue + self.dropped_io - self._reported
        if lost:
            data += self._lines.encode([Event(event=ev.DROPPED, ts=time.time_ns(), count=lost)])
        start = 0
        while start < len(data):
            end = self._segment_end(data, start)
            if not self._append(data[start:end]):
                self.dropped_io += data.count(b"\n", start) - (1 if lost else 0)
                return
            start = end
            if self._size >= self.segment_bytes:
                self._rotate()
        self._reported += lost

    def _segment_end(self, data: bytes, start: int) -> int:
        """Where the part of data[start:] that goes to the current segment ends: at
        the end of the line that fills it to segment_bytes, or of data."""
        room = max(self.segment_bytes - self._size, 1)
        if len(data) - start <= room:
            return len(data)
        return data.index(b"\n", start + room - 1) + 1

    def _append(self, data: bytes) -> bool:
        """Write to the current segment, opening one if needed; False if the disk refused."""
        try:
            file = self._file
            if file is None:
                file = self._open()
            file.write(data)
            file.flush()
        except OSError as exc:
            if not self.dropped_io:
                log.error("journal: cannot write to %s: %s; events are dropped until it works again", self.directory, exc)
            self._discard()
            return False
        self._size += len(data)
        return True

    def _open_first(self) -> None:
        """Open a segment before the broker says READY rather than at its first
        write, so that the descriptors it holds are settled once it serves."""
        try:
            self._open()
        except OSError as exc:
            log.error("journal: cannot open a segment in %s: %s; events are dropped until it works again", self.directory, exc)

    def _discard(self) -> None:
        """Forget a segment that could not be written; the next write starts a new one."""
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None

    def _open(self) -> BinaryIO:
        """A new segment, current from now on."""
        # Names sort by creation time, so the oldest segment is the first name.
        now_ns = time.time_ns()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now_ns // 1_000_000_000)) + f"{now_ns % 1_000_000_000:09d}Z"
        self._file = file = open(self.directory / f"journal-{stamp}{ACTIVE_SUFFIX}", "ab")
        self._size = 0
        return file

    def _rotate(self) -> None:
        """Close the current segment, gzip it, and keep the total under max_bytes."""
        if self._file is not None:
            path = Path(self._file.name)
            try:
                self._file.close()
            except OSError as exc:
                log.error("journal: closing %s failed: %s", path, exc)
            self._file = None
            self._compress(path)
        self._bound()

    def _close_leftovers(self) -> None:
        """Segments left open by a previous run (a crash, a kill -9) are closed now."""
        for path in sorted(self.directory.glob("*" + ACTIVE_SUFFIX)):
            self._compress(path)
        self._bound()

    @staticmethod
    def _compress(path: Path) -> None:
        """Gzip a closed segment; one that was opened ahead of writes that never
        came is empty and simply removed."""
        target = path.with_name(path.name + ".gz")
        partial = path.with_name(path.name + ".gz.part")
        try:
            if not path.stat().st_size:
                path.unlink()
                return
            with open(path, "rb") as src, gzip.open(partial, "wb", compresslevel=GZIP_LEVEL) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(partial, target)
            path.unlink()
        except OSError as exc:
            log.error("journal: cannot gzip %s: %s; left as it is", path, exc)
            with contextlib.suppress(OSError):  # the directory itself may be gone: the thread must live on
                partial.unlink(missing_ok=True)

    def _bound(self) -> None:
        """Delete the oldest closed segments until they and a full new one fit in max_bytes."""
        try:
            closed = sorted(self.directory.glob("*" + CLOSED_SUFFIX))
            sizes = [p.stat().st_size for p in closed]
            total = sum(sizes) + self.segment_bytes
            for path, size in zip(closed, sizes):
                if total <= self.max_bytes:
                    break
                path.unlink(missing_ok=True)
                total -= size
        except OSError as exc:
            log.error("journal: cannot trim %s: %s", self.directory, exc)
