"""Bytes from a socket -> JSON frames (PROTOCOL §1).

The fast path is newline-delimited JSON: a line that starts with `{`, ends with
`}`, whose brackets balance and that has no `}{` seam is taken as one frame
without parsing it. Anything
else (pretty-printed objects spanning lines, several objects on one line, what
Go's `json.Decoder` accepts) goes through a small scanner that follows strings and
brackets to find where each value ends; such frames are put on one line with
`msgspec.json.format`, so payloads from them arrive compacted. Garbage that is
not an object is cut at the next newline and handed on as a frame of its own,
so that the decoder rejects it and the stream resynchronises.
"""

from __future__ import annotations

import re

import msgspec

from .protocol import TooLarge

_SEAM = re.compile(rb"}\s*{")
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|"|[{}\[\]]', re.S)
_SPACE = b" \t\r\n"


class Framer:
    """Splits a byte stream into frames of at most `max_frame_bytes` each."""

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.too_large: TooLarge | None = None  # set once; the stream is unusable after it
        self._buf = bytearray()

    @property
    def pending(self) -> bool:
        """True while a partial frame is buffered (the peer is mid-frame)."""
        return bool(self._buf.strip(_SPACE))

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return the complete frames they finish, in order.

        A frame that grows past the limit sets `too_large` and ends the stream:
        there is no telling where the next frame would start, so the caller
        answers 413 and closes.
        """
        if self.too_large is not None:
            return []
        self._buf += data
        frames: list[bytes] = []
        while (frame := self._next_frame()) is not None:
            if len(frame) > self.max_frame_bytes:
                break
            frames.append(frame)
        else:
            if len(self._buf) <= self.max_frame_bytes:
                return frames
        self.too_large = TooLarge(f"frame exceeds MaxFrameBytes ({self.max_frame_bytes} bytes)")
        self._buf.clear()
        return frames

    def _next_frame(self) -> bytes | None:
        buf = self._buf
        blank = len(buf) - len(buf.lstrip(_SPACE))
        if blank:
            del buf[:blank]  # blank lines between frames count towards no frame's size
        if not buf:
            return None
        nl = buf.find(b"\n")
        if nl >= 0:
            line = bytes(buf[:nl]).rstrip(_SPACE)
            if line[:1] == b"{" and line[-1:] == b"}" and _looks_whole(line):
                self._take(nl + 1)
                return line
        if buf[0] not in b"{[":
            if nl < 0:
                return None
            self._take(nl + 1)
            return line
        if nl < 0 and not _may_hold_whole_value(buf):
            return None  # the usual NDJSON line still arriving: don't scan it
        end = _value_end(buf)
        if end is None:
            return None
        frame = bytes(buf[:end])
        self._take(end)
        return _one_line(frame)

    def _take(self, n: int) -> None:
        del self._buf[:n]


def _looks_whole(line: bytes) -> bool:
    """One whole object, judged without parsing: brackets balance and no `}{` seam.

    Brackets inside strings can only make this say no, sending the line to the
    scanner, which is slower but exact.
    """
    return (
        line.count(b"{") == line.count(b"}")
        and line.count(b"[") == line.count(b"]")
        and not _SEAM.search(line)
    )


def _may_hold_whole_value(buf: bytearray) -> bool:
    """Cheap test before scanning a buffer that has no newline yet."""
    i = len(buf) - 1
    while i >= 0 and buf[i] in _SPACE:
        i -= 1
    return buf[i : i + 1] in (b"}", b"]") or _SEAM.search(buf) is not None


def _value_end(buf: bytearray) -> int | None:
    """Index just past the object or array that starts the buffer, or None if incomplete."""
    depth = 0
    for m in _TOKEN.finditer(buf):
        tok = m.group()
        if tok == b'"':
            return None  # a string that is not closed yet
        if tok in (b"{", b"["):
            depth += 1
        elif tok in (b"}", b"]"):
            depth -= 1
            if depth == 0:
                return m.end()
    return None


def _one_line(frame: bytes) -> bytes:
    """Put a multi-line frame on one line; leave invalid JSON for the decoder to name."""
    if b"\n" not in frame and b"\r" not in frame:
        return frame
    try:
        return msgspec.json.format(frame, indent=0)
    except msgspec.DecodeError:
        return frame
