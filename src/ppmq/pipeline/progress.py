"""Where a long `ppmq report` is, on the terminal that started it.

Spark's own console progress bar writes to the JVM's stderr, which a quiet
report sends to a log file, and it names stages by number only; this line
names the report's step and counts the tasks of its running stages (reading
the journals, one task is one segment file).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from pyspark import SparkContext

INTERVAL_S = 0.5


class Progress:
    """Rewrites one status line on `stream` (a terminal) while a step runs."""

    def __init__(self, sc: SparkContext, stream: TextIO) -> None:
        self.sc = sc
        self.stream = stream
        self.name = ""
        self.done = threading.Event()

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Show `name` and its tasks until the block ends, then how long it took."""
        self.name = name
        self.sc.setJobDescription(name)
        self.done.clear()
        ticker = threading.Thread(target=self._tick, daemon=True)
        start = time.monotonic()
        ticker.start()
        try:
            yield
        finally:
            self.done.set()
            ticker.join()
            self._show(f"{name}: {time.monotonic() - start:.1f} s\n")

    def _tick(self) -> None:
        while not self.done.wait(INTERVAL_S):
            self._show(self._tasks())

    def _tasks(self) -> str:
        tracker = self.sc.statusTracker()
        stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
        done = sum(s.numCompletedTasks for s in stages if s)
        total = sum(s.numTasks for s in stages if s)
        return f"{self.name}: {done}/{total} tasks" if total else f"{self.name}..."

    def _show(self, text: str) -> None:
        self.stream.write(f"\rppmq report: {text}\x1b[K")
        self.stream.flush()
