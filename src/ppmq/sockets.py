"""Binding the Unix sockets ppmq listens on: the broker's ServerSocket, a
subscriber's socket (the subscriber kit run by hand) and `ppmq listen`'s.

One place for the rules all three follow: a socket file left by a process that
is gone is removed, but one a live process listens on is never stolen; a socket
that gets a mode is bound under a umask that lets nobody but its owner in, and
gets its mode and group before it listens, so nobody connects through a mode
not yet set. A socket systemd passes in is systemd's: nothing here touches it.
"""

from __future__ import annotations

import grp
import os
import socket


class ListenError(Exception):
    """A socket cannot be listened on (a live process holds it, or the OS says no)."""


def listen(path: str, backlog: int, mode: int | None = None, group: str | None = None) -> socket.socket:
    """A stream socket listening on path; with `mode` (and `group`), those are set
    before it listens. ListenError says why it cannot be."""
    gid = group_id(group) if group is not None else None
    claim(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177) if mode is not None else None
    try:
        sock.bind(path)
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
    return sock


def claim(path: str) -> None:
    """Make way for a new socket at path: remove a stale socket file, but refuse
    to steal one a live process listens on."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
    else:
        raise ListenError(f"another process is already listening on {path}")
    finally:
        probe.close()


def remove(path: str) -> None:
    """Remove a socket file this process bound (gone already is fine)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def group_id(group: str) -> int:
    """A group given by name or number (SocketGroup)."""
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ListenError(f"SocketGroup: no group {group!r} on this host") from None
