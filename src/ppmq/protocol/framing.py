"""Bytes from a socket -> JSON frames (PROTOCOL §1).

The fast path is newline-delimited JSON: a line that starts with `{`, ends with
`}` and is one JSON value is taken as one frame, checked by msgspec reading it
through without building anything (a fifth of the cost of counting its
brackets); a broken line is still taken whole when its brackets balance and
it has no `}{` seam, so that the decoder names what is wrong with it and the
next line starts afresh. Anything else (pretty-printed objects spanning lines,
several objects on one line: what Go's `json.Decoder` accepts) goes through a
small scanner that follows strings and brackets to find where each value ends;
such frames are compacted with `msgspec.json.format` (whitespace between tokens
removed, numbers and strings exactly as sent). Garbage that is not an object is
cut at the next newline and handed on as a frame of its own, so that the
decoder rejects it and the stream resynchronises.
"""

from __future__ import annotations

import re

import msgspec

from ppmq.errors import TooLarge

_SEAM = re.compile(rb"}\s*{")
_STRUCTURE = re.compile(rb'["{}\[\]]')
_STRING_STOP = re.compile(rb'["\\]')
_SPACE = b" \t\r\n"
# A buffer this large without a newline is scanned read by read, so that the
# scanner's work is spread over the reads instead of landing on one of them.
SCAN_AFTER_BYTES = 1 << 20
_SPACE_BYTES = (b" ", b"\t", b"\r", b"\n")
_LEADING_SPACE = re.compile(rb"[ \t\r\n]+")
_read_one_value = msgspec.json.Decoder(msgspec.Raw).decode  # validates, builds nothing


class Framer:
    """Splits a byte stream into frames of at most `max_frame_bytes` each.

    Every byte is looked at a bounded number of times however the stream is cut
    into reads, so a peer trickling a large frame costs linear time, not
    quadratic: where the newline search and the scanner stopped is remembered.
    """

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.too_large: TooLarge | None = None  # set once; the stream is unusable after it
        # What is buffered of a frame not yet complete; read-only to callers, for
        # whom an empty one means nothing is pending (the usual case, after a
        # lone line) without asking `pending`.
        self.buffer = bytearray()
        self._no_newline_before = 0  # the buffer has no newline before this index
        self._no_seam_before = 0  # ... and no `}{` seam starting before this index
        self._scan = _Scanner()
        self._scanning = False  # the frame at the start is being read by the scanner

    @property
    def pending(self) -> bool:
        """True while a partial frame is buffered (the peer is mid-frame)."""
        return bool(self.buffer.strip(_SPACE))

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return the complete frames they finish, in order.

        A frame that grows past the limit sets `too_large` and ends the stream:
        there is no telling where the next frame would start, so the caller
        answers 413 and closes.
        """
        if self.too_large is not None:
            return []
        self.buffer += data
        frames: list[bytes] = []
        while (frame := self._next_frame()) is not None:
            if len(frame) > self.max_frame_bytes:
                break
            frames.append(frame)
        else:
            if len(self.buffer) <= self.max_frame_bytes:
                return frames
        self.too_large = TooLarge(f"frame exceeds MaxFrameBytes ({self.max_frame_bytes} bytes)")
        self.buffer.clear()
        return frames

    def _next_frame(self) -> bytes | None:
        buf = self.buffer
        if buf[:1] in _SPACE_BYTES:
            blanks = _LEADING_SPACE.match(buf)
            assert blanks is not None, "buf starts with one"
            self._take(blanks.end())  # blanks between frames belong to none
        if not buf:
            return None
        nl = buf.find(b"\n", self._no_newline_before)
        if nl < 0:
            self._no_newline_before = len(buf)
        if buf[0] not in b"{[":
            return self._take_line(nl) if nl >= 0 else None
        if not self._scanning:
            if nl >= 0:
                line = self._whole_line(nl)
                if line is not None:
                    return line
                self._scanning = True  # the first line is not a frame of its own
            elif len(buf) < SCAN_AFTER_BYTES and not _ends_like_a_value(buf) and not self._has_seam(buf):
                return None  # the usual NDJSON line still arriving: don't scan it
        end = self._scan.end(buf)
        if end is None:
            return None
        frame = bytes(buf[:end])
        self._take(end)
        return _one_line(frame) if end <= self.max_frame_bytes else frame  # too large: as it came

    def _whole_line(self, nl: int) -> bytes | None:
        """The NDJSON fast path: the first line, if it is one whole object."""
        end = nl
        while end and self.buffer[end - 1] in _SPACE:
            end -= 1
        if self.buffer[end - 1 : end] != b"}":
            return None
        line = bytes(self.buffer[:end])
        if not _is_one_value(line) and not _looks_whole(line):
            return None
        self._take(nl + 1)
        return line

    def _take_line(self, nl: int) -> bytes:
        line = bytes(self.buffer[:nl]).rstrip(_SPACE)
        self._take(nl + 1)
        return line

    def _has_seam(self, buf: bytearray) -> bool:
        """Whether `}{` (maybe with blanks between) appears, looking only at new bytes."""
        if _SEAM.search(buf, self._no_seam_before):
            return True
        last = buf.rfind(b"}", self._no_seam_before)
        tail_is_blank = last >= 0 and _LEADING_SPACE.fullmatch(buf, last + 1) is not None
        self._no_seam_before = last if tail_is_blank or last == len(buf) - 1 else len(buf)
        return False

    def _take(self, n: int) -> None:
        del self.buffer[:n]
        self._no_newline_before = self._no_newline_before - n if self._no_newline_before > n else 0
        self._no_seam_before = self._no_seam_before - n if self._no_seam_before > n else 0
        if self._scan.pos:  # the scanner looked at what is taken: it starts afresh
            self._scan = _Scanner()
        self._scanning = False


class _Scanner:
    """Finds where the object or array at the start of a buffer ends, resuming
    where it stopped when called again on the same, longer buffer."""

    def __init__(self) -> None:
        self.pos = 0  # next byte to look at
        self.depth = 0
        self.in_string = False

    def end(self, buf: bytearray) -> int | None:
        """Index just past the value, or None while it is incomplete."""
        while True:
            if self.in_string:
                m = _STRING_STOP.search(buf, self.pos)
                if m is None:
                    self.pos = len(buf)
                    return None
                if m.group() == b"\\":
                    if m.end() >= len(buf):
                        self.pos = m.start()  # the escaped byte has not arrived yet
                        return None
                    self.pos = m.end() + 1
                    continue
                self.in_string = False
                self.pos = m.end()
                continue
            m = _STRUCTURE.search(buf, self.pos)
            if m is None:
                self.pos = len(buf)
                return None
            self.pos = m.end()
            tok = m.group()
            if tok == b'"':
                self.in_string = True
            elif tok in b"{[":
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth == 0:
                    return self.pos


def _is_one_value(line: bytes) -> bool:
    """Exactly one JSON value and nothing after it (one nested too deeply for
    msgspec is left to the bracket counts, and then to the decoder to refuse)."""
    try:
        _read_one_value(line)
    except (msgspec.DecodeError, RecursionError):
        return False
    return True


def _looks_whole(line: bytes) -> bool:
    """One whole object, judged without parsing: brackets balance and no `}{` seam.

    Brackets inside strings can only make this say no, sending the line to the
    scanner, which is slower but exact.
    """
    return line.count(b"{") == line.count(b"}") and line.count(b"[") == line.count(b"]") and not _SEAM.search(line)


def _ends_like_a_value(buf: bytearray) -> bool:
    """Cheap test before scanning a buffer that has no newline yet: a sender that
    stops at the end of a value (and waits for its reply) ends on a bracket."""
    end = len(buf)
    while end and buf[end - 1] in _SPACE:
        end -= 1
    return buf[end - 1 : end] in (b"}", b"]")


def _one_line(frame: bytes) -> bytes:
    """Put a multi-line frame on one line; leave invalid JSON for the decoder to name."""
    if b"\n" not in frame and b"\r" not in frame:
        return frame
    try:
        return msgspec.json.format(frame, indent=-1)
    except msgspec.DecodeError:
        return frame
