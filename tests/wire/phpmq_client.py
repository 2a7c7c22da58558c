"""A PHPMQ client for the tests, written from the protocol's layout (PROTOCOL §9),
not from the broker's code: a message header `H` + 2-digit version + 3-digit type
+ 2-digit packet count, then per packet `P` + 2-digit type + 29-digit length
(32 bytes, as php-mq/protocol's PacketHeader writes it) and the content."""

from __future__ import annotations

import socket
from typing import NamedTuple

QUEUE, CONTENT, MESSAGE_ID, COUNT, TTL = "01", "02", "03", "04", "05"
TIMEOUT_S = 15.0


def packet(ptype: str, content: bytes | str) -> bytes:
    data = content.encode() if isinstance(content, str) else content
    return b"P" + ptype.encode() + b"%029d" % len(data) + data


def message(mtype: str, *packets: bytes, count: int | None = None, version: str = "01") -> bytes:
    """A whole message; `count` overrides the header's packet count (to send a wrong one)."""
    n = len(packets) if count is None else count
    return b"H" + version.encode() + mtype.encode() + b"%02d" % n + b"".join(packets)


def send(queue: str, content: bytes | str, ttl_s: int | None = 0) -> bytes:
    """001; `ttl_s=None` leaves the TTL packet out, as the first published protocol did."""
    extra = () if ttl_s is None else (packet(TTL, str(ttl_s)),)
    return message("001", packet(QUEUE, queue), packet(CONTENT, content), *extra)


def consume(queue: str, count: int) -> bytes:
    return message("002", packet(QUEUE, queue), packet(COUNT, str(count)))


def ack(queue: str, message_id: str) -> bytes:
    return message("004", packet(QUEUE, queue), packet(MESSAGE_ID, message_id))


def requeue(queue: str, message_id: str, ttl_s: int) -> bytes:
    return message("005", packet(QUEUE, queue), packet(MESSAGE_ID, message_id), packet(TTL, str(ttl_s)))


def dead_letter(queue: str, message_id: str) -> bytes:
    return message("006", packet(QUEUE, queue), packet(MESSAGE_ID, message_id))


class Dispatched(NamedTuple):
    """A 003 message, its packets by type."""

    queue: str
    content: bytes
    message_id: str
    ttl_s: int


class PhpmqClient:
    """One connection to PhpmqSocket."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(TIMEOUT_S)
        self.sock.connect(path)

    def write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_exactly(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
            buf += chunk
        return buf

    def receive(self) -> Dispatched:
        """The next dispatched message (003, 4 packets), read by its layout."""
        head = self.read_exactly(8)
        assert head[:6] == b"H01003", head
        packets = {}
        for _ in range(int(head[6:8])):
            ph = self.read_exactly(32)
            assert ph[:1] == b"P", ph
            packets[ph[1:3].decode()] = self.read_exactly(int(ph[3:]))
        return Dispatched(packets[QUEUE].decode(), packets[CONTENT], packets[MESSAGE_ID].decode(), int(packets[TTL]))

    def closed_by_peer(self, timeout_s: float = TIMEOUT_S) -> bool:
        """Whether the broker closes the connection (EOF) within timeout_s."""
        self.sock.settimeout(timeout_s)
        try:
            return self.sock.recv(1 << 16) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        finally:
            self.sock.settimeout(TIMEOUT_S)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> PhpmqClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
