"""Bytes -> JSON frames: PROTOCOL §1 Framing."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ppmq.errors import BadRequest, TooLarge
from ppmq.protocol.framing import Framer
from ppmq.protocol.messages import decode_request

LIMIT = 1 << 20


def frames_of(stream: bytes, max_frame_bytes: int = LIMIT) -> list[bytes]:
    return Framer(max_frame_bytes).feed(stream)


def feed_in_pieces(framer: Framer, stream: bytes, cuts: list[int]) -> list[bytes]:
    """Feed `stream` cut at the given offsets, as a socket might deliver it."""
    bounds = [0, *sorted(set(cuts)), len(stream)]
    frames: list[bytes] = []
    for start, end in zip(bounds, bounds[1:]):
        frames += framer.feed(stream[start:end])
    return frames


# --- NDJSON, the fast path -------------------------------------------------------


def test_each_ndjson_line_is_one_frame_with_its_bytes_unchanged():
    lines = [b'{"Topic": "t",  "Messages": [{"Payload": {"a": 1,  "b":[1,2]}}]}', b'{"Acks":["1","2"]}', b"{}"]
    assert frames_of(b"".join(line + b"\n" for line in lines)) == lines


@pytest.mark.parametrize("eol", [b"\n", b"\r\n"], ids=["LF", "CRLF"])
def test_lines_ending_in_lf_or_crlf_give_the_same_frames_without_the_line_end(eol):
    stream = eol.join([b'{"a":1}', b'{"b":"x y"}', b"hello", b""])
    assert frames_of(stream) == [b'{"a":1}', b'{"b":"x y"}', b"hello"]


def test_blank_and_whitespace_only_lines_between_frames_are_skipped():
    stream = b'\n\n   \n{"a":1}\n\r\n\t\n  {"b":2}  \n\n'
    framer = Framer(LIMIT)
    assert framer.feed(stream) == [b'{"a":1}', b'{"b":2}']
    assert not framer.pending


def test_a_complete_object_is_a_frame_before_its_newline_arrives():
    # Go's json.Encoder ends each object with a newline, but json.Decoder does not need one
    framer = Framer(LIMIT)
    assert framer.feed(b'{"a":{"b":[1]}}') == [b'{"a":{"b":[1]}}']
    assert framer.feed(b"\n") == []
    assert not framer.pending


# --- what Go's json.Decoder accepts besides NDJSON --------------------------------


def test_concatenated_objects_on_one_line_are_separate_frames():
    stream = b'{"a":1}{"b":2} {"c":{"d":3}}\t{"e":[]}\n'
    assert frames_of(stream) == [b'{"a":1}', b'{"b":2}', b'{"c":{"d":3}}', b'{"e":[]}']


@pytest.mark.parametrize(
    "line",
    [
        b'{"Payload":"a}{b"}',
        b'{"Payload":"a} {b"}',
        b'{"Payload":"say \\"hi\\" }{"}',
        b'{"Payload":"{{{[[["}',
        b'{"Payload":"]]]}}}"}',
        b'{"Payload":"back\\\\"}',
        b'{"Payload":"back\\\\\\"}{\\\\"}',
    ],
)
def test_brackets_quotes_and_backslashes_inside_strings_do_not_split_a_frame(line):
    # Given the line alone and the line followed by another object on the same line
    # Then the string's content never ends or starts a frame
    assert frames_of(line + b"\n") == [line]
    assert frames_of(line + line + b"\n") == [line, line]


def test_a_pretty_printed_object_comes_out_as_one_line_with_its_tokens_unchanged():
    # Given a multi-line object whose strings and numbers have unusual spellings
    tokens = [b'"caf\\u00e9"', b'"a\\/b"', b'"  two  spaces  "', b"1.0E10", b"1.50", b"-0", b'"\\\\"', b'"}{"']
    pretty = b'{\n  "Payload": [\n' + b",\n".join(b"    " + t for t in tokens) + b"\n  ]\n}\n"
    # When it is framed
    [frame] = frames_of(pretty)
    # Then it is on one line, means the same, and every token is there byte for byte
    assert b"\n" not in frame and b"\r" not in frame
    assert msgspec.json.decode(frame) == json.loads(pretty)
    for token in tokens:
        assert token in frame


def test_pretty_printed_objects_with_crlf_and_tabs_are_framed_one_by_one():
    first = json.dumps({"Topic": "t", "Messages": [{"Payload": "x"}]}, indent="\t").replace("\n", "\r\n")
    second = json.dumps({"Acks": ["1"]}, indent=4)
    frames = frames_of(f"{first}\r\n{second}\n".encode())
    assert [msgspec.json.decode(f) for f in frames] == [json.loads(first), json.loads(second)]
    assert all(b"\n" not in f and b"\r" not in f for f in frames)


def test_a_multi_line_object_whose_first_line_ends_in_a_brace_is_still_one_frame():
    # Go's json.Decoder reads this as one object
    stream = b'{"Topic": "t", "Messages": [{"Payload": {"a": 1}}\n]}\n'
    assert [msgspec.json.decode(f) for f in frames_of(stream)] == [json.loads(stream)]


# --- garbage ------------------------------------------------------------------------


# Objects that are not JSON but whose brackets balance: the first line is
# taken whole, not scanned on into the next one (an open string would swallow it).
BROKEN_OBJECTS = [b'{"a": "x}', b'{"a":}', b'{"a": [1, 2}]', b'{"a":' + b"[" * 5000 + b"]" * 5000 + b"}"]


@pytest.mark.parametrize("garbage", [b"hello world", b"42", b'"a string"', b"null", b"{not json}", b"GET / HTTP/1.1\r", *BROKEN_OBJECTS])
def test_a_garbage_line_is_a_frame_of_its_own_and_the_next_line_still_frames(garbage):
    # Given a garbage line between two valid requests
    stream = b'{"Command":"STATUS"}\n' + garbage + b'\n{"Topic":"t","Acks":["1"]}\n'
    # When it is framed
    first, bad, last = frames_of(stream)
    # Then the decoder rejects the garbage frame and accepts the ones around it
    assert bad == garbage.rstrip(b"\r")
    with pytest.raises(BadRequest):
        decode_request(bad)
    assert decode_request(first).command == "STATUS"
    assert decode_request(last).acks == ["1"]


# --- size limit -------------------------------------------------------------------------


def big_line(n: int) -> bytes:
    """An NDJSON object of exactly n bytes."""
    return b'{"x":"' + b"y" * (n - 8) + b'"}'


def test_a_line_of_exactly_the_limit_is_a_frame():
    line = big_line(64)
    framer = Framer(64)
    assert framer.feed(line + b"\r\n") == [line]
    assert framer.too_large is None


def test_a_line_over_the_limit_sets_too_large_after_returning_the_frames_before_it():
    # Given a valid line, a line one byte over the limit, and another valid line
    framer = Framer(64)
    frames = framer.feed(b'{"a":1}\n' + big_line(65) + b'\n{"b":2}\n')
    # Then the first frame is returned, the stream ends there, and later bytes are ignored
    assert frames == [b'{"a":1}']
    assert isinstance(framer.too_large, TooLarge)
    assert framer.too_large.status == 413
    assert framer.feed(b'{"c":3}\n') == []
    assert not framer.pending


@pytest.mark.parametrize("piece", [1, 7, 1000], ids=lambda n: f"{n}-byte reads")
def test_an_unterminated_frame_that_outgrows_the_limit_sets_too_large(piece):
    # Given frames, then an object that never ends, arriving in reads of `piece` bytes
    stream = b'{"a":1}\n{"b":2}{"x":"' + b"y" * 200
    framer = Framer(64)
    frames = feed_in_pieces(framer, stream, list(range(piece, len(stream), piece)))
    # Then the complete frames came out and the limit stopped the buffer from growing
    assert frames == [b'{"a":1}', b'{"b":2}']
    assert isinstance(framer.too_large, TooLarge)


def test_a_pretty_printed_object_over_the_limit_sets_too_large():
    pretty = json.dumps({"x": "y" * 100}, indent=2).encode() + b"\n"
    framer = Framer(64)
    assert framer.feed(pretty) == []
    assert isinstance(framer.too_large, TooLarge)


def test_blank_lines_before_a_frame_do_not_count_towards_its_size():
    # Given a frame of exactly the limit, preceded by blank lines, split in two reads
    line = big_line(64)
    framer = Framer(64)
    frames = framer.feed(b"\n" * 8 + line[:60]) + framer.feed(line[60:] + b"\n")
    # Then it is a frame, as it is when the same bytes arrive in one read
    assert frames == [line] == frames_of(b"\n" * 8 + line + b"\n", 64)
    assert framer.too_large is None


# --- pending ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stream", "pending"),
    [
        (b"", False),
        (b"\n \r\n\t", False),
        (b'{"a":', True),
        (b'{"a":1}\n{"b"', True),
        (b'{\n  "a": 1,\n', True),
        (b'{"a":"}', True),
        (b"hello", True),
        (b'{"a":1}', False),
        (b'{"a":1}\n', False),
        (b'{\n  "a": 1\n}\n\n', False),
        (b"hello\n", False),
    ],
)
def test_pending_is_true_exactly_while_a_frame_is_partly_buffered(stream, pending):
    framer = Framer(LIMIT)
    framer.feed(stream)
    assert framer.pending is pending


def test_pending_goes_back_to_false_when_the_frame_is_completed():
    framer = Framer(LIMIT)
    assert framer.feed(b'{"Topic":"t","Ac') == []
    assert framer.pending
    assert framer.feed(b'ks":["1"]}\n') == [b'{"Topic":"t","Acks":["1"]}']
    assert not framer.pending


# --- split points -----------------------------------------------------------------------

PRETTY = json.dumps({"Topic": "t", "Messages": [{"Key": "k}{", "Payload": {"a": [1, 2], "b": "\\"}}]}, indent=2)
STREAM = b"".join(
    [
        b'{"Topic":"t","Messages":[{"Payload":"plain"}]}\n',
        b'{"Payload":"a}{b","Esc":"say \\"}{\\" \\\\","Br":"{[}]"}\r\n',
        b"\n\n",
        PRETTY.encode() + b"\n",
        b'{"a":1}{"b":"}{"} {"c":[{"d":"\\\\"}]}\n',
        b"hello world\n",
        b'  {\n\t"x" : "\\\\\\"",\n\t"y" : [ ]\n  }{"z":0}\r\n',
        b'{"last":"\\u00e9"}\n',
    ]
)
EXPECTED = [
    {"Topic": "t", "Messages": [{"Payload": "plain"}]},
    {"Payload": "a}{b", "Esc": 'say "}{" \\', "Br": "{[}]"},
    json.loads(PRETTY),
    {"a": 1},
    {"b": "}{"},
    {"c": [{"d": "\\"}]},
    b"hello world",
    {"x": '\\"', "y": []},
    {"z": 0},
    {"last": "\u00e9"},
]


def test_the_mixed_stream_gives_the_expected_frames_in_one_read():
    frames = frames_of(STREAM)
    decoded = [f if f == b"hello world" else msgspec.json.decode(f) for f in frames]
    assert decoded == EXPECTED
    assert frames[0] == b'{"Topic":"t","Messages":[{"Payload":"plain"}]}'


def test_the_mixed_stream_fed_byte_by_byte_gives_the_same_frames_as_one_read():
    framer = Framer(LIMIT)
    assert feed_in_pieces(framer, STREAM, list(range(1, len(STREAM)))) == frames_of(STREAM)
    assert not framer.pending and framer.too_large is None


@settings(max_examples=300, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=40))
@example(cuts=[STREAM.index(b"}{")])
@example(cuts=[STREAM.index(b"\r\n") + 1])
def test_any_split_of_the_stream_into_reads_gives_the_same_frames_as_one_read(cuts):
    framer = Framer(LIMIT)
    assert feed_in_pieces(framer, STREAM, cuts) == frames_of(STREAM)
    assert not framer.pending and framer.too_large is None


def test_the_mixed_stream_read_a_line_at_a_time_gives_the_same_frames_as_one_read():
    # A client that waits for each reply sends one whole line a read, which skips the buffer
    framer = Framer(LIMIT)
    ends = [i + 1 for i, byte in enumerate(STREAM) if byte == ord("\n")]
    assert feed_in_pieces(framer, STREAM, ends) == frames_of(STREAM)
    assert not framer.pending and framer.too_large is None


def test_a_lone_line_over_the_limit_sets_too_large():
    framer = Framer(64)
    assert framer.feed(big_line(65) + b"\n") == []
    assert isinstance(framer.too_large, TooLarge)


@pytest.mark.parametrize("read", [bytes, bytearray], ids=["bytes", "bytearray"])
def test_frames_are_bytes_whatever_the_read_was(read):
    # a payload is kept as a view of its frame: the frame must not change under it
    frames = Framer(LIMIT).feed(read(b'{"a":1}\n'))
    assert frames == [b'{"a":1}'] and type(frames[0]) is bytes
