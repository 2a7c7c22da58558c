"""A PHPMQ client for the tests, written from the protocol's layout (PROTOCOL §9),
not from the broker's code: a message header `H` + 2-digit version + 3-digit type
+ 2-digit packet count, then per packet `P` + 2-digit type + 29-digit length
(32 bytes, as php-mq/protocol's PacketHeader writes it) and the content.

Dispatches (003) are read two ways. `receive` reads the packets the header
counts. `receive_as_published` reads them as the published php-mq/client does
with the protocol version its composer.lock pins: the packet count comes from
its own table of message types (003: 3 packets, queue, content and ID), never
from the header, and a header whose type is not in the table is an error
("Message type not implemented"), which ends that client.
"""

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


# php-mq/client's MessageType (its own, and php-mq/protocol's at the commit its
# composer.lock pins): the packets of each message type a client reads.
PUBLISHED_PACKET_COUNTS = {3: 3, 5: 2}  # MESSAGE_E2C (dispatch), MESSAGE_RECEIPT


class NotImplementedType(Exception):
    """What php-mq/client throws on a message type its table does not have."""


class Dispatched(NamedTuple):
    """A 003 message, its packets by type; `ttl_s` None without a TTL packet."""

    queue: str
    content: bytes
    message_id: str
    ttl_s: int | None


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
        """The next dispatched message (003), of as many packets as its header says."""
        head = self.read_exactly(8)
        assert head[:6] == b"H01003", head
        return self._dispatched(int(head[6:8]))

    def receive_as_published(self) -> Dispatched:
        """The next dispatched message, read as php-mq/client reads it: the
        type from the header (a header that is not one reads as type 0), the
        packet count from PUBLISHED_PACKET_COUNTS."""
        head = self.read_exactly(8)
        mtype = int(head[3:6]) if head[3:6].isdigit() else 0
        if mtype not in PUBLISHED_PACKET_COUNTS:
            raise NotImplementedType(f"Message type not implemented: {mtype}")
        assert mtype == 3, head
        return self._dispatched(PUBLISHED_PACKET_COUNTS[mtype])

    def _dispatched(self, count: int) -> Dispatched:
        packets = {}
        for _ in range(count):
            ph = self.read_exactly(32)
            assert ph[:1] == b"P", ph
            packets[ph[1:3].decode()] = self.read_exactly(int(ph[3:]))
        ttl_s = int(packets[TTL]) if TTL in packets else None
        return Dispatched(packets[QUEUE].decode(), packets[CONTENT], packets[MESSAGE_ID].decode(), ttl_s)

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

    def read_until_closed(self, timeout_s: float = TIMEOUT_S) -> bytes:
        """Everything the broker sends until it closes the connection; TimeoutError
        if it has not within timeout_s of the last byte."""
        self.sock.settimeout(timeout_s)
        got = []
        try:
            while chunk := self.sock.recv(1 << 16):
                got.append(chunk)
        except ConnectionResetError:
            pass
        finally:
            self.sock.settimeout(TIMEOUT_S)
        return b"".join(got)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> PhpmqClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
