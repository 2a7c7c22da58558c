"""One consistent snapshot of a store for a read in parallel partitions, and its lifetime.

LMDB hands every new read transaction the newest committed state, and a
transaction cannot leave its process: a partition running in another Python
worker can neither join the planner's transaction nor open one at an older
transaction id. Checking instead that every partition happens to read the
planner's transaction id would fail on any running broker, which commits at
least once a second (its timers). So the planner copies the store
(`mdb_env_copy`: the pages of one read transaction, without blocking the
broker's writer but for the moment it reads the two meta pages) into a
directory of its own and plans from the copy; every partition opens the copy
and checks that it still holds the transaction id planned. The store's own
reader lasts only as long as the copy takes (a quarter of a second for 600 MB
in the page cache).

Spark plans a DataFrame's partitions once and reads them again at every action
on it, so the copy must last as long as the DataFrame may, which the data
source cannot see: it lasts as long as the Spark driver that planned it. A
keeper process, started with the copy in a session of its own, deletes it once
that driver is gone, however it ends (a clean stop, a crash, kill -9).

This module imports neither pyspark nor lmdb at the top: the keeper runs it as
`python -m ppmq.pipeline.snapshot DIR PID START` for as long as a Spark driver
lives, and should weigh little.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING

from ppmq.errors import SnapshotGone

if TYPE_CHECKING:
    from ppmq.store.reader import StoreReader

KEEPER_POLL_S = 1.0  # how often the keeper looks whether the driver still runs
PREFIX = "ppmq-snapshot-"


def copy(store: StoreReader, root: str | None) -> str:
    """A consistent copy of the store in a new directory under root (default: the
    temporary directory), deleted once the Spark driver is gone; returns it."""
    directory = tempfile.mkdtemp(prefix=PREFIX, dir=root)
    try:
        store.env.copy(directory)
        _start_keeper(directory, *_driver())
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory


def check(directory: str, planned: int, found: int) -> None:
    """A partition reads the snapshot that was planned, or fails saying why."""
    if found != planned:
        raise SnapshotGone(f"ppmq: the snapshot copy {directory} holds transaction {found}, not {planned} as planned: read the store again")


def missing(directory: str) -> SnapshotGone:
    return SnapshotGone(f"ppmq: the snapshot copy {directory} is gone (its Spark driver ended?): read the store again")


def _driver() -> tuple[int, int]:
    """The pid and start time of the Spark driver: the nearest `java` among this
    process's ancestors (Python workers are started by the JVM), else the parent."""
    pid = os.getppid()
    while pid > 1:
        comm, ppid, start = _stat(pid)
        if comm == "java":
            return pid, start
        pid = ppid
    parent = os.getppid()
    return parent, _stat(parent)[2]


def _stat(pid: int) -> tuple[str, int, int]:
    """A process's command name, parent pid and start time (clock ticks since boot);
    ("", 0, 0) once it is gone. The start time tells a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return "", 0, 0
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    return comm, int(fields[1]), int(fields[19])


def _start_keeper(directory: str, pid: int, start: int) -> None:
    """A process of its own session, so that neither Spark's worker cleanup nor
    the driver's end takes it down before it has deleted the copy."""
    subprocess.Popen(
        [sys.executable, "-m", "ppmq.pipeline.snapshot", directory, str(pid), str(start)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def keep(directory: str, pid: int, start: int) -> None:
    """Wait until the driver (pid, started at start) is gone, then delete the copy;
    return at once if the copy is deleted by someone else."""
    while os.path.isdir(directory) and _stat(pid)[2] == start:
        time.sleep(KEEPER_POLL_S)
    shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    keep(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
