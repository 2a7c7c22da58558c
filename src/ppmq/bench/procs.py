"""What a broker process costs, read from /proc: CPU, memory, and its store on disk.

A broker may be several processes (RabbitMQ's shell wrapper and its Erlang VM),
so every figure covers the process tree the bench started.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

_TICK_S = 1 / os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def tree(pid: int) -> list[int]:
    """pid and all its descendants that are alive now."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def cpu_s(pids: list[int]) -> float:
    """User plus system CPU seconds the processes have used so far."""
    return sum(cpu_times(pids))


def cpu_times(pids: list[int]) -> tuple[float, float]:
    """User and system CPU seconds the processes have used so far, apart: the
    system part is the kernel's work for them (system calls, waking the peers
    they write to, fsync), which their own code costs only by how often it asks."""
    user = system = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user += int(fields[11]) * _TICK_S
        system += int(fields[12]) * _TICK_S
    return user, system


def memory(pids: list[int]) -> dict[str, int]:
    """VmRSS, RssAnon and RssFile summed over the processes, in bytes.

    RssAnon is what the broker itself holds; RssFile is mostly LMDB's (or a log's)
    pages of the page cache, which the kernel reclaims when memory is short.
    """
    out = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in out:
                out[key] += int(value.split()[0]) * 1024
    return out


def disk_bytes(path: Path) -> int:
    """Bytes allocated on disk under path (sparse files count what they use)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


class Sampler:
    """Samples a process tree's memory and a directory's size on a thread: the peaks
    happen between the moments the bench looks."""

    def __init__(self, pid: int, data_dir: Path, interval_s: float = 0.1) -> None:
        self.pid, self.data_dir, self.interval_s = pid, data_dir, interval_s
        self.peak: dict[str, int] = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0, "disk": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(self.interval_s):
            for key, value in memory(tree(self.pid)).items():
                self.peak[key] = max(self.peak[key], value)
            if n % 5 == 0:  # walking a directory costs more than reading /proc
                self.peak["disk"] = max(self.peak["disk"], disk_bytes(self.data_dir))
            n += 1
