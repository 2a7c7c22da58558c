"""The PHPMQ wire format (PROTOCOL §9), sans-IO: bytes in, frames out, and back.

A frame is a message header and its packets, with no separators:

    H 01 001 03                  8 bytes: 'H', version, message type, packet count
    P 01 00000000000000000000000000003   32 bytes: 'P', packet type, content length
    Foo                          the content, exactly that many bytes
    P 02 ...

The numbers are zero-padded ASCII decimals. The protocol's README calls a
packet header 36 bytes long, but its examples and the published implementations
(php-mq/protocol src/Types/PacketHeader.php: '%s%02d%029d', and
src/Constants/PacketLength.php: PACKET_HEADER = 32) write 32: 'P', two digits
of type and 29 of length. Those readers take a message's packets by type, in
any order; so does this one, but each type at most once.

Anything else is a `BadFrame`, and the listener closes the connection: there is
no error reply in the protocol, and after a frame that lies about a length the
rest of the stream cannot be trusted.
"""

from __future__ import annotations

import msgspec

from ppmq.errors import BadFrame, FrameTooLarge

MESSAGE_HEADER_BYTES = 8
PACKET_HEADER_BYTES = 32
VERSION = 1
MAX_TTL_S = 10**9 - 1  # as a ppmq publish's TTL (core/validate.py)
MAX_COUNT = 10**9 - 1  # messages a consume request may keep in flight
MAX_NUMBER_DIGITS = 20  # a count or TTL packet, leading zeros included

# Message types
SEND, CONSUME, DISPATCH, ACK, REQUEUE, DEAD_LETTER = 1, 2, 3, 4, 5, 6
# Packet types
QUEUE, CONTENT, MESSAGE_ID, COUNT, TTL = 1, 2, 3, 4, 5

# The packets each message a client sends carries; the second set may be left
# out: the first published protocol (php-mq/protocol at 90bec61, MessageType's
# PACKET_COUNT_MAP 001 => 2) sent a message without a TTL, H0100102.
PACKETS: dict[int, tuple[frozenset[int], frozenset[int]]] = {
    SEND: (frozenset({QUEUE, CONTENT}), frozenset({TTL})),
    CONSUME: (frozenset({QUEUE, COUNT}), frozenset()),
    ACK: (frozenset({QUEUE, MESSAGE_ID}), frozenset()),
    REQUEUE: (frozenset({QUEUE, MESSAGE_ID, TTL}), frozenset()),
    DEAD_LETTER: (frozenset({QUEUE, MESSAGE_ID}), frozenset()),
}


class Frame(msgspec.Struct, frozen=True):
    """One message from a client, its packets decoded. Fields a type does not
    carry are None; `ttl_s` is 0 for no expiry. A Struct, not a NamedTuple: a
    tuple's own `count` method would stand in the way of the field."""

    type: int
    queue: str
    content: str | None = None
    message_id: str | None = None
    count: int | None = None
    ttl_s: int = 0


class Decoder:
    """Frames out of a byte stream, one at a time, so that the caller can act on
    a frame (and wait for its commit) before it looks at the next."""

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()

    @property
    def pending(self) -> bool:
        """Part of a frame has arrived, but not all of it."""
        return bool(self._buf)

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next_frame(self) -> Frame | None:
        """The next whole frame, taken off the buffer; None until one is whole.
        Raises BadFrame as soon as the bytes so far cannot begin a good one.
        Only the headers are read until the frame is whole: a frame that
        arrives in many reads has its packets copied once."""
        buf = self._buf
        if len(buf) < MESSAGE_HEADER_BYTES:
            return None
        kind, count = _message_header(bytes(buf[:MESSAGE_HEADER_BYTES]))
        spans: dict[int, tuple[int, int]] = {}  # packet type -> where its content lies in the buffer
        at = MESSAGE_HEADER_BYTES
        for _ in range(count):
            if len(buf) < at + PACKET_HEADER_BYTES:
                return None
            ptype, length = _packet_header(bytes(buf[at : at + PACKET_HEADER_BYTES]), kind, spans)
            at += PACKET_HEADER_BYTES
            if at + length > self.max_frame_bytes:
                raise FrameTooLarge(f"frame of at least {at + length} bytes exceeds MaxFrameBytes ({self.max_frame_bytes})")
            if len(buf) < at + length:
                return None
            spans[ptype] = (at, at + length)
            at += length
        packets = {ptype: bytes(buf[start:end]) for ptype, (start, end) in spans.items()}
        del buf[:at]
        return _frame(kind, packets)


def _message_header(head: bytes) -> tuple[int, int]:
    """The message type and packet count of a header, checked against the type."""
    if head[:1] != b"H" or not head[1:].isdigit():
        raise BadFrame(f"bad message header {head!r}: expected 'H', 2 digits of version, 3 of type, 2 of packet count")
    version, kind, count = int(head[1:3]), int(head[3:6]), int(head[6:8])
    if version != VERSION:
        raise BadFrame(f"message header {head!r}: protocol version {version}, expected {VERSION:02d}")
    if kind not in PACKETS:
        raise BadFrame(f"message header {head!r}: message type {kind:03d} is not one a client sends (001, 002, 004, 005, 006)")
    required, optional = PACKETS[kind]
    if count not in (len(required), len(required) + len(optional)):
        raise BadFrame(f"message header {head!r}: {count} packets, but message type {kind:03d} has {_counts(required, optional)}")
    return kind, count


def _counts(required: frozenset[int], optional: frozenset[int]) -> str:
    return f"{len(required)}" + (f" or {len(required) + len(optional)}" if optional else "")


def _packet_header(head: bytes, kind: int, seen: dict[int, tuple[int, int]]) -> tuple[int, int]:
    """A packet header's type and content length; its type must be one of the
    message's, and not one it already had."""
    if head[:1] != b"P" or not head[1:].isdigit():
        raise BadFrame(f"bad packet header {head!r}: expected 'P', 2 digits of packet type, 29 of content length")
    ptype, length = int(head[1:3]), int(head[3:])
    required, optional = PACKETS[kind]
    if ptype not in required | optional:
        raise BadFrame(f"packet type {ptype:02d} does not belong in a message of type {kind:03d}")
    if ptype in seen:
        raise BadFrame(f"packet type {ptype:02d} twice in one message")
    return ptype, length


def _frame(kind: int, packets: dict[int, bytes]) -> Frame:
    missing = PACKETS[kind][0] - packets.keys()
    if missing:  # the count allowed an optional packet in the place of a required one
        raise BadFrame(f"message of type {kind:03d} without packet type {min(missing):02d}")
    return Frame(
        kind,
        _text(packets[QUEUE], "queue name"),
        content=_text(packets[CONTENT], "message content") if CONTENT in packets else None,
        message_id=_text(packets[MESSAGE_ID], "message ID") if MESSAGE_ID in packets else None,
        count=_number(packets[COUNT], "message count", MAX_COUNT) if COUNT in packets else None,
        ttl_s=_number(packets[TTL], "TTL", MAX_TTL_S) if TTL in packets else 0,
    )


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise BadFrame(f"{what} is not UTF-8 (byte {exc.start})") from None


def _number(raw: bytes, what: str, limit: int) -> int:
    """A packet of at most MAX_NUMBER_DIGITS ASCII digits (no sign, no space),
    at most `limit`. The length is checked first: int() refuses (ValueError)
    digit strings longer than Python's limit, and reads long ones slowly."""
    if len(raw) > MAX_NUMBER_DIGITS:
        raise BadFrame(f"{what} of {len(raw)} bytes is longer than {MAX_NUMBER_DIGITS} digits")
    if not raw.isdigit() or int(raw) > limit:
        raise BadFrame(f"{what} {raw!r} is not a whole number from 0 to {limit}")
    return int(raw)


def encode_dispatch(queue: str, content: bytes, message_id: str, ttl_s: int | None) -> bytes:
    """A message for a consumer (type 003): queue, content and ID, in the order
    php-mq/protocol's MessageServerToClient writes them, then the TTL unless
    `ttl_s` is None (PROTOCOL §9 PHPMQ dispatch format: 3 packets, H0100303,
    as php-mq/server sends and php-mq/client reads them; or 4, H0100304)."""
    packets = [(QUEUE, queue.encode()), (CONTENT, content), (MESSAGE_ID, message_id.encode())]
    if ttl_s is not None:
        packets.append((TTL, b"%d" % ttl_s))
    head = b"H%02d%03d%02d" % (VERSION, DISPATCH, len(packets))
    return head + b"".join(b"P%02d%029d%s" % (ptype, len(data), data) for ptype, data in packets)
