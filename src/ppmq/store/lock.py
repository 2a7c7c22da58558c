"""One writer per DataPath (PROTOCOL §1): an exclusive lock on DataPath/ppmq.lock.

A second broker on the same DataPath would push the same messages and close the
first one's journal segment under it; `ppmq migrate` beside a broker would
convert a store the broker is writing. So whoever writes the store takes this
lock before it opens anything under DataPath, and holds it for as long as it
writes: Store does, for its whole life. The lock is flock(2) on a file that
holds the holder's pid, for the error the next one gets; the kernel releases it
when the holder exits, even by kill -9, so a crash leaves nothing to clean up.
Readers (fsck, the Spark data source) take no lock and are never refused.
"""

from __future__ import annotations

import fcntl
import os
import time

from ppmq.errors import StoreError

LOCK_FILE = "ppmq.lock"
PID_WAIT_S = 1.0  # how long a refused process waits for the holder to write its pid


class DataPathLock:
    """The lock on one DataPath, held from `take` until `release` (or exit)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd  # the open lock file; closing it releases the lock

    @classmethod
    def take(cls, data_path: str) -> DataPathLock:
        """Lock DataPath, an existing directory, or raise StoreError naming the holder's pid."""
        path = os.path.join(data_path, LOCK_FILE)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot open the lock file {path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise StoreError(
                f"DataPath {data_path} is in use by ppmq {holder} (a broker, or `ppmq migrate`):"
                " one process writes a DataPath at a time, so stop that one first"
            ) from None
        _write_pid(fd, data_path)
        return cls(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _write_pid(fd: int, data_path: str) -> None:
    """The holder's pid, for the error of whoever is refused. Created by root in
    a directory root does not own (`sudo ppmq migrate`), the file is given to the
    directory's owner, so that the broker's own user can take the lock after it."""
    if os.geteuid() == 0:
        owner = os.stat(data_path)
        os.fchown(fd, owner.st_uid, owner.st_gid)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def _holder(fd: int) -> str:
    """`pid N` from the lock file; the holder writes it just after locking, so an
    empty file is read again for a moment."""
    deadline = time.monotonic() + PID_WAIT_S
    while True:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        if text.isdigit():
            return f"pid {text}"
        if time.monotonic() > deadline:
            return "pid unknown"
        time.sleep(0.01)
