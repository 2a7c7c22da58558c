"""What systemd hands a service, read without libsystemd.

Three conventions of sd-daemon(3): sockets passed as fds 3.. (`LISTEN_FDS`,
`LISTEN_PID`, `LISTEN_FDNAMES`), a datagram socket for state changes
(`NOTIFY_SOCKET`, with `WATCHDOG_USEC` saying how often to ping), and a stderr
connected to journald (`JOURNAL_STREAM`), where a `<N>` prefix carries the
syslog priority. Outside systemd every function here is a no-op, so the broker,
a subscriber and the tests run the same code with and without it.
"""

from __future__ import annotations

import logging
import os
import socket
import time

import sdnotify

LISTEN_FDS_START = 3  # sd-daemon.h SD_LISTEN_FDS_START
_LISTEN_VARS = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


def listen_fds(unset: bool = True) -> dict[str, list[socket.socket]]:
    """Sockets systemd passed to this process, by FileDescriptorName.

    Only honoured when LISTEN_PID is our pid (the variables are inherited by
    children that did not get the fds). Unsetting them keeps our own children
    from believing the same. Call before starting threads.
    """
    pid, count, names = (os.environ.get(k) for k in _LISTEN_VARS)
    if unset:
        for key in _LISTEN_VARS:
            os.environ.pop(key, None)
    if not pid or not count or not pid.isdigit() or int(pid) != os.getpid() or not count.isdigit():
        return {}
    labels = names.split(":") if names else []
    found: dict[str, list[socket.socket]] = {}
    for i in range(int(count)):
        fd = LISTEN_FDS_START + i
        os.set_inheritable(fd, False)
        label = labels[i] if i < len(labels) and labels[i] else "unknown"
        found.setdefault(label, []).append(socket.socket(fileno=fd))
    return found


def listening_unix_socket(name: str | None = None) -> socket.socket | None:
    """The one inherited listening AF_UNIX stream socket, preferring `name`."""
    fds = listen_fds()
    candidates = fds.get(name, []) if name and name in fds else [s for group in fds.values() for s in group]
    for sock in candidates:
        if sock.family == socket.AF_UNIX and sock.type == socket.SOCK_STREAM:
            return sock
    return None


class Notifier:
    """sd_notify(3) messages; silent when NOTIFY_SOCKET is not set."""

    def __init__(self) -> None:
        self.enabled = bool(os.environ.get("NOTIFY_SOCKET"))
        self._notifier = sdnotify.SystemdNotifier() if self.enabled else None
        self.watchdog_interval_s = _watchdog_interval_s()

    def send(self, *lines: str) -> None:
        if self._notifier is not None:
            self._notifier.notify("\n".join(lines))

    def ready(self, status: str) -> None:
        self.send("READY=1", _status_line(status))

    def status(self, status: str) -> None:
        self.send(_status_line(status))

    def reloading(self) -> None:
        # MONOTONIC_USEC lets systemd >= 253 (Type=notify-reload) match the reload to this signal.
        self.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def stopping(self) -> None:
        self.send("STOPPING=1")

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")


def _status_line(status: str) -> str:
    return "STATUS=" + status.replace("\n", " ")


def _watchdog_interval_s() -> float | None:
    """Half of WATCHDOG_USEC, as sd_watchdog_enabled(3) advises; None when off or not ours."""
    usec, pid = os.environ.get("WATCHDOG_USEC", ""), os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and (not pid.isdigit() or int(pid) != os.getpid()):
        return None
    return int(usec) / 2e6


def under_journald() -> bool:
    """stderr is the journal stream systemd set up (systemd.exec(5): compare dev:inode)."""
    stream = os.environ.get("JOURNAL_STREAM", "")
    dev, _, ino = stream.partition(":")
    if not dev.isdigit() or not ino.isdigit():
        return False
    try:
        st = os.fstat(2)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}


class JournalFormatter(logging.Formatter):
    """`<N>message`: journald strips the prefix and records N as PRIORITY; it adds the time itself."""

    def __init__(self) -> None:
        super().__init__("%(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        priority = _PRIORITY.get(record.levelno, 6 if record.levelno < logging.WARNING else 3)
        text = super().format(record).replace("\n", "\n" + f"<{priority}>")
        return f"<{priority}>{text}"


def configure_logging(level: int = logging.INFO) -> None:
    """Journal-style lines under systemd, timestamped lines elsewhere."""
    handler = logging.StreamHandler()
    if under_journald():
        handler.setFormatter(JournalFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
