"""Binding the Unix sockets ppmq listens on: the broker's ServerSocket and
PhpmqSocket, a subscriber's socket (the subscriber kit run by hand) and `ppmq
listen`'s.

One place for the rules all of them follow (PROTOCOL §1): a path is replaced
only when it holds a stale socket, one no process listens on; a live one is
never stolen, and anything else there (a file, a directory, a symbolic link) is
refused and left as it is, so that a typo in a path never costs a file. The
directory must exist: nothing here creates one. At stop, a socket file is
removed only while it is still the one this process bound. A socket that gets a
mode is bound under a umask that lets nobody but its owner in, and gets its mode
and group before it listens, so nobody connects through a mode not yet set. A
socket systemd passes in is systemd's: nothing here touches it.
"""

from __future__ import annotations

import grp
import logging
import os
import socket
import stat
import struct
from dataclasses import dataclass

from ppmq.errors import ListenError

log = logging.getLogger("ppmq.sockets")


@dataclass(frozen=True)
class SocketFile:
    """A socket file by path and identity (device and inode), so that it is
    removed only while the path still holds that very file."""

    path: str
    dev: int
    ino: int

    @classmethod
    def of(cls, path: str) -> SocketFile:
        st = os.lstat(path)
        return cls(path, st.st_dev, st.st_ino)

    def remove(self) -> None:
        """Unlink the file if the path still holds it (gone already is fine)."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode) or (st.st_dev, st.st_ino) != (self.dev, self.ino):
            log.warning("not removing %s: it is no longer the socket this process bound", self.path)
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def listen(path: str, backlog: int, mode: int | None = None, group: str | None = None) -> tuple[socket.socket, SocketFile]:
    """A stream socket listening on path, and its file, for `SocketFile.remove`
    at stop; with `mode` (and `group`), those are set before it listens.
    ListenError says why it cannot be."""
    gid = group_id(group) if group is not None else None
    claim(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177) if mode is not None else None
    try:
        sock.bind(path)
        bound = SocketFile.of(path)
        if mode is not None:
            if gid is not None:
                os.chown(path, -1, gid)
            os.chmod(path, mode)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {path}: {exc.strerror or exc}") from None
    finally:
        if old_umask is not None:
            os.umask(old_umask)
    return sock, bound


def claim(path: str) -> None:
    """Make way for a new socket at path: remove a stale socket file; refuse a
    live one, anything that is not a socket, and a directory that does not exist."""
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        missing = not os.path.lexists(folder)
        raise ListenError(
            f"cannot listen on {path}: " + (f"directory {folder} does not exist" if missing else f"{folder} is not a directory")
        )
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ListenError(f"cannot listen on {path}: it is {_kind(st.st_mode)}, not a socket; it is left as it is")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:  # nobody listens: the socket is stale
        SocketFile(path, st.st_dev, st.st_ino).remove()
    except OSError as exc:
        raise ListenError(f"cannot listen on {path}: cannot tell whether a process listens on it ({exc.strerror or exc})") from None
    else:
        raise ListenError(f"another process is already listening on {path}")
    finally:
        probe.close()


def occupant(path: str) -> str | None:
    """What is at path when it is not a socket ("a regular file", "a directory",
    ...), which nothing binding there may replace; None when the path is free,
    holds a socket, or cannot be looked at."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return None if stat.S_ISSOCK(st.st_mode) else _kind(st.st_mode)


def _kind(mode: int) -> str:
    """A file type as an error message names it."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    return "a device or other special file"


def group_id(group: str) -> int:
    """A group given by name or number (SocketGroup)."""
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ListenError(f"SocketGroup: no group {group!r} on this host") from None


_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """The uid, gid and pid of the process at the other end of a Unix socket,
    as the kernel vouches for them (SO_PEERCRED)."""
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return uid, gid, pid
