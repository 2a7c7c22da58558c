"""Wire types and error texts: PROTOCOL §1 (key case), §2 (requests), §4 (replies), §5 (batches)."""

from __future__ import annotations

import datetime as dt

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from msgspec import UNSET, Raw

from ppmq.errors import BadRequest, NotFound, RequestError, ShuttingDown, StoreFull, TooLarge
from ppmq.protocol.messages import (
    GENERATED_EXPIRING_FRAGMENT,
    GENERATED_FRAGMENT,
    Reply,
    batch_frame,
    decode_request,
    encode_reply,
    error_reply,
    expires_bytes,
    expires_ns,
    format_expires,
    message_fragment,
    with_metadata,
)

UTC = dt.UTC
NOV21_S = 1795291200  # 2026-11-21T20:00:00Z in Unix seconds
NOV21_NS = NOV21_S * 10**9


def rejected(frame: bytes) -> BadRequest:
    with pytest.raises(BadRequest) as info:
        decode_request(frame)
    return info.value


def plain(req) -> dict:
    """A decoded request as builtins, raw values as their bytes, to compare two requests."""
    return msgspec.to_builtins(req, enc_hook=lambda raw: bytes(raw).decode())


def decode_datetime(text: str) -> dt.datetime:
    """An `Expires` string as the request decoder reads it."""
    [message] = decode_request(b'{"Messages":[{"Payload":0,"Expires":"%s"}]}' % text.encode()).messages
    return message.expires


# --- decoding requests (§2) ----------------------------------------------------------


def test_a_wrapper_with_every_key_decodes_into_its_fields():
    req = decode_request(
        b'{"Topic":"filescan","Subscriber":"rt","Acks":["1","2"],"Command":"RECONNECT","Id":"r1",'
        b'"Messages":[{"Key":"k","Payload":"p","Expires":1795291200,"TTL":2.5,"Priority":1}]}'
    )
    assert (req.topic, req.subscriber, req.acks, req.command, bytes(req.id)) == ("filescan", "rt", ["1", "2"], "RECONNECT", b'"r1"')
    [m] = req.messages
    assert (m.key, bytes(m.payload), m.expires, m.ttl_s, m.priority) == ("k", b'"p"', 1795291200, 2.5, 1)


def test_absent_keys_decode_to_none_priority_zero_and_an_unset_id():
    req = decode_request(b'{"Messages":[{"Payload":"p"}]}')
    assert (req.topic, req.subscriber, req.acks, req.command, req.id) == (None, None, None, None, UNSET)
    [m] = req.messages
    assert (m.key, m.expires, m.ttl_s, m.priority) == (None, None, None, 0)


# ppMQ's Go producers write lower-case keys; Go matches keys case-insensitively (§1).
SAME_REQUEST = [
    b'{"Topic":"t","Subscriber":"s","Acks":["a"],"Command":"STATUS","Id":1,'
    b'"Messages":[{"Key":"k","Payload":{"x": 1},"Expires":"2026-11-21T20:00:00Z","TTL":3,"Priority":1}]}',
    b'{"topic":"t","subscriber":"s","acks":["a"],"command":"STATUS","id":1,'
    b'"messages":[{"key":"k","payload":{"x": 1},"expires":"2026-11-21T20:00:00Z","ttl":3,"priority":1}]}',
    b'{"TOPIC":"t","SUBSCRIBER":"s","ACKS":["a"],"COMMAND":"STATUS","ID":1,'
    b'"MESSAGES":[{"KEY":"k","PAYLOAD":{"x": 1},"EXPIRES":"2026-11-21T20:00:00Z","TTL":3,"PRIORITY":1}]}',
    b'{"tOpIc":"t","Subscriber":"s","aCKs":["a"],"Command":"STATUS","iD":1,'
    b'"Messages":[{"Key":"k","pAyLoAd":{"x": 1},"Expires":"2026-11-21T20:00:00Z","Ttl":3,"Priority":1}]}',
]


@pytest.mark.parametrize("frame", SAME_REQUEST, ids=["ppmq", "lower", "upper", "mixed"])
def test_keys_are_matched_whatever_their_case(frame):
    assert plain(decode_request(frame)) == plain(decode_request(SAME_REQUEST[0]))
    req = decode_request(frame)
    assert (req.topic, req.acks, bytes(req.id), req.messages[0].priority) == ("t", ["a"], b"1", 1)
    assert bytes(req.messages[0].payload) == b'{"x": 1}'


def test_a_go_producers_lower_case_publish_decodes():
    # What ppMQ's Go producer writes for a message without expiry
    frame = b'{"topic":"filescan","messages":[{"key":"/home/u/a.php","payload":"scan","expires":"0001-01-01T00:00:00Z","priority":1}]}'
    req = decode_request(frame)
    [m] = req.messages
    assert (req.topic, m.key, bytes(m.payload), m.priority, expires_ns(m.expires)) == ("filescan", "/home/u/a.php", b'"scan"', 1, 0)


@pytest.mark.parametrize(
    "frame",
    [
        b'{"Topic":"t","Extra":{"deep":[1,2]},"Messages":[{"Payload":1,"Trace":"x"}]}',
        b'{"topic":"t","extra":{"deep":[1,2]},"messages":[{"payload":1,"trace":"x"}]}',
        b'{"Version":2,"Topic":"t","Messages":[{"Payload":1}]}',
    ],
)
def test_unknown_keys_are_ignored_as_go_ignores_them(frame):
    req = decode_request(frame)
    assert req.topic == "t"
    assert bytes(req.messages[0].payload) == b"1"


@pytest.mark.parametrize(
    "payload",
    [
        b'{"a": 1,  "b":[1,2]}',
        b'"caf\\u00e9 \\/ \\"quoted\\" \\\\"',
        b"1.50e+3",
        b"-0",
        b"[ ]",
        b"null",
        b'"\xc3\xa9 \xf0\x9f\x98\x80"',
    ],
)
@pytest.mark.parametrize("spelling", [b"Payload", b"payload"])
def test_a_payload_passes_through_byte_for_byte(payload, spelling):
    frame = b'{"Topic":"t","Messages":[{"Key":"k","%s":%s}]}' % (spelling, payload)
    assert bytes(decode_request(frame).messages[0].payload) == payload


@pytest.mark.parametrize("id_", [b'"r1"', b'"r\\u0031"', b"7", b"-1.50", b'""'])
def test_the_id_is_kept_as_the_client_wrote_it(id_):
    assert bytes(decode_request(b'{"Command":"STATUS","Id":%s}' % id_).id) == id_


# --- rejected requests ---------------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [b"", b"{", b'{"Topic": }', b'{"Topic":"t"', b'{"Topic":"t"}}', b"{'Topic': 't'}", b'{"Topic":"t",}', b"hello"],
)
def test_invalid_json_is_rejected_as_invalid_json(frame):
    assert str(rejected(frame)).startswith("invalid JSON")


@pytest.mark.parametrize("frame", [b'{"Topic":"\xff"}', b'{"Messages":[{"Payload":"caf\xe9"}]}', b'{"T\xc3":1}'])
def test_bytes_that_are_not_utf8_are_rejected_naming_utf8(frame):
    assert "UTF-8" in str(rejected(frame))


# (frame, path named at the start of the error)
WRONG_TYPES = [
    (b'{"Topic":1}', "Topic"),
    (b'{"Subscriber":["s"]}', "Subscriber"),
    (b'{"Messages":"m"}', "Messages"),
    (b'{"Messages":[{"Payload":1},"m"]}', "Messages[1]"),
    (b'{"Acks":"1"}', "Acks"),
    (b'{"Acks":["1",2]}', "Acks[1]"),
    (b'{"Command":true}', "Command"),
    (b'{"Messages":[{"Payload":1},{"Payload":1},{"Payload":1,"Priority":"high"}]}', "Messages[2].Priority"),
    (b'{"Messages":[{"Payload":1,"Priority":1.5}]}', "Messages[0].Priority"),
    (b'{"Messages":[{"Payload":1,"Key":7}]}', "Messages[0].Key"),
    (b'{"Messages":[{"Payload":1,"Expires":"tomorrow"}]}', "Messages[0].Expires"),
    (b'{"Messages":[{"Payload":1,"Expires":true}]}', "Messages[0].Expires"),
    (b'{"Messages":[{"Payload":1,"TTL":"1m"}]}', "Messages[0].TTL"),
    (b'{"messages":[{"payload":1},{"payload":1},{"payload":1,"priority":"high"}]}', "Messages[2].Priority"),
    (b'{"topic":1}', "Topic"),
    (b'{"Messages":[{"Payload":1},{"Key":"k"}]}', "Messages[1].Payload"),
    (b'{"messages":[{"payload":1},{"key":"k"}]}', "Messages[1].Payload"),
]


@pytest.mark.parametrize(("frame", "path"), WRONG_TYPES)
def test_a_wrong_type_or_missing_field_is_rejected_naming_its_path(frame, path):
    assert str(rejected(frame)).startswith(f"{path}: ")


def test_a_missing_payload_is_called_missing():
    assert str(rejected(b'{"Messages":[{"Payload":1},{"Key":"k"}]}')).endswith("required field is missing")


@pytest.mark.parametrize(
    "frame",
    [
        b'{"Messages":[{"Payload":1},{"Payload":1},{"Payload":1,"Priority":"high"}]}',
        b'{"Messages":[{"Payload":1},{"Key":"k"}]}',
        b"[1]",
    ],
)
def test_a_well_formed_frame_with_wrong_content_is_not_called_invalid_json(frame):
    assert "invalid JSON" not in str(rejected(frame))


@pytest.mark.parametrize("frame", [b"[1]", b'"a string"', b"42", b"null", b"true"])
def test_a_top_level_that_is_not_an_object_is_rejected(frame):
    assert "object" in str(rejected(frame))


@pytest.mark.parametrize("id_", [b"true", b"{}", b'["r1"]'])
def test_an_id_that_is_neither_a_string_nor_a_number_is_rejected(id_):
    assert str(rejected(b'{"Command":"STATUS","Id":%s}' % id_)).startswith("Id: ")


# --- the Id of a rejected request (§4: it still gets its reply) ----------------------


@pytest.mark.parametrize(
    "frame",
    [
        b'{"Topic": }',
        b"[1]",
        b'{"Topic":1}',
        b'{"messages":[{"key":"k"}]}',
        b'{"Topic":"\xff"}',
    ],
)
def test_a_rejected_frame_without_an_id_has_an_unset_request_id(frame):
    assert rejected(frame).request_id is UNSET


@pytest.mark.parametrize(
    "frame",
    [
        b'{"Id":"r1","Messages":[{"Payload":1},{"Key":"k"}]}',
        b'{"Topic":1,"Id":"r1"}',
        b'{"id":"r1","messages":[{"payload":1,"priority":"x"}]}',
        b'{"ID":"r1","Extra":1,"Acks":[2]}',
    ],
)
def test_a_rejected_frames_id_is_recovered_verbatim(frame):
    assert bytes(rejected(frame).request_id) == b'"r1"'


def test_a_frame_with_bytes_that_are_not_utf8_in_its_payload_keeps_its_id():
    err = rejected(b'{"Id":7,"Topic":"t","Messages":[{"Payload":"\xff"}]}')
    assert bytes(err.request_id) == b"7"


@pytest.mark.parametrize(
    "frame, request_id",
    [
        (b'{"Id":"r1","Topic": }', b'"r1"'),
        (b'{"Id":"r1","Topic": {"id": 2}', b'"r1"'),
        (b'{"Topic":{"id": 2},"iD":3,,}', b"3"),
        (b'{"Topic":"t","Messages":[{"Payload":{"Id":7}},]}', None),
        (b'{"Id":{"a":1},}', None),
    ],
)
def test_a_frame_that_is_not_json_has_its_top_level_id_recovered_and_no_other(frame, request_id):
    found = rejected(frame).request_id
    assert (bytes(found) if found is not UNSET else None) == request_id


# --- Expires (§2, §3 Expiry) -----------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [None, dt.datetime(1, 1, 1, tzinfo=UTC), dt.datetime(1, 1, 1)],
    ids=["null", "go-zero-time", "go-zero-time-naive"],
)
def test_null_and_gos_zero_time_mean_no_expiry(value):
    assert expires_ns(value) == 0


def test_gos_zero_time_as_a_producer_writes_it_means_no_expiry():
    assert expires_ns(decode_datetime("0001-01-01T00:00:00Z")) == 0


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("2026-11-21T20:00:00Z", NOV21_NS),
        ("2026-11-21T22:00:00+02:00", NOV21_NS),
        ("2026-11-21T14:30:00-05:30", NOV21_NS),
        ("2026-11-21T20:00:00.5Z", NOV21_NS + 500_000_000),
        ("2026-11-21T20:00:00", NOV21_NS),
    ],
)
def test_rfc3339_expires_with_any_offset_is_the_same_instant(text, ns):
    assert expires_ns(decode_datetime(text)) == ns


def test_nanoseconds_in_expires_are_kept_to_the_microsecond():
    # Python's datetime holds microseconds: the instant is right within 1 µs
    ns = expires_ns(decode_datetime("2026-11-21T22:00:00.123456789+02:00"))
    assert abs(ns - (NOV21_NS + 123_456_789)) <= 1000


def test_a_datetime_without_an_offset_is_read_as_utc():
    assert expires_ns(dt.datetime(2026, 11, 21, 20)) == expires_ns(dt.datetime(2026, 11, 21, 20, tzinfo=UTC)) == NOV21_NS


@pytest.mark.parametrize(("seconds", "ns"), [(NOV21_S, NOV21_NS), (NOV21_S + 0.5, NOV21_NS + 500_000_000), (1, 10**9)])
def test_a_number_is_unix_seconds(seconds, ns):
    assert expires_ns(seconds) == ns


@pytest.mark.parametrize(
    "value",
    [-1, -0.5, 10**12, float("inf"), float("nan"), dt.datetime(1969, 12, 31, tzinfo=UTC), dt.datetime(9999, 12, 31, tzinfo=UTC)],
)
def test_an_expires_outside_the_range_of_unix_nanoseconds_raises_value_error(value):
    with pytest.raises(ValueError):
        expires_ns(value)


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (NOV21_NS, "2026-11-21T20:00:00Z"),
        (NOV21_NS + 500_000_000, "2026-11-21T20:00:00.5Z"),
        (NOV21_NS + 120_000_000, "2026-11-21T20:00:00.12Z"),
        (NOV21_NS + 123_456_789, "2026-11-21T20:00:00.123456789Z"),
        (NOV21_NS + 1, "2026-11-21T20:00:00.000000001Z"),
        (1, "1970-01-01T00:00:00.000000001Z"),
    ],
)
def test_format_expires_writes_rfc3339_utc_with_trailing_zeros_trimmed(ns, text):
    assert format_expires(ns) == text


@settings(max_examples=200, deadline=None)
@given(seconds=st.integers(1, 2**32))
def test_an_expires_in_whole_seconds_ppmq_wrote_reads_back_as_the_same_instant(seconds):
    ns = seconds * 10**9
    assert expires_ns(decode_datetime(format_expires(ns))) == ns


@settings(max_examples=200, deadline=None)
@given(seconds=st.integers(1, 2**33), micros=st.integers(0, 999_999))
@example(seconds=NOV21_S, micros=1)
@example(seconds=2_305_843_009, micros=500_000)
def test_an_expires_with_microseconds_reads_back_exactly(seconds, micros):
    ns = seconds * 10**9 + micros * 1000
    assert expires_ns(decode_datetime(format_expires(ns))) == ns


# --- broker -> subscriber (§5) ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((b"k1", b'"p"', 0, 0), {"Key": "k1", "Payload": "p", "Priority": 0}),
        ((b'k"\\\n', b'{"a": [1, 2]}', 3, 0), {"Key": 'k"\\\n', "Payload": {"a": [1, 2]}, "Priority": 3}),
        ((b"7", b"null", 1, NOV21_NS), {"Key": "7", "Payload": None, "Priority": 1, "Expires": "2026-11-21T20:00:00Z"}),
        ((b"7", b"1.50", 0, NOV21_NS + 5), {"Key": "7", "Payload": 1.5, "Priority": 0, "Expires": "2026-11-21T20:00:00.000000005Z"}),
        (("ключ٣".encode(), b"[]", 2, 0), {"Key": "ключ٣", "Payload": [], "Priority": 2}),
        (("٣٤".encode(), b"0", 0, 0), {"Key": "٣٤", "Payload": 0, "Priority": 0}),
    ],
)
def test_a_message_fragment_is_json_with_expires_only_when_set(args, expected):
    fragment = message_fragment(*args)
    assert msgspec.json.decode(fragment) == expected
    assert args[1] in fragment  # the payload's bytes, unchanged


@settings(max_examples=300)
@given(st.text(min_size=1, max_size=40))
@example('k"\\')
@example("a\x1fb")
@example("\x7f\u2028ключ")
def test_a_fragment_quotes_any_key_as_json_does(key):
    fragment = message_fragment(key.encode(), b"0", 0, 0)
    assert fragment.startswith(b'{"Key":' + msgspec.json.encode(key) + b",")
    assert msgspec.json.decode(fragment)["Key"] == key


@pytest.mark.parametrize("m, payload, prio", [(1, b"0", 0), (18446744073709551615, b'{"a": [1, "x"]}', 2)])
def test_the_generated_fragment_is_the_message_fragment_of_a_generated_key(m, payload, prio):
    assert GENERATED_FRAGMENT % (m, payload, prio) == message_fragment(b"%d" % m, payload, prio, 0)


@pytest.mark.parametrize("expires", [NOV21_NS, NOV21_NS + 5, 1])
def test_the_generated_expiring_fragment_is_the_message_fragment_of_a_generated_key_with_expires(expires):
    assert GENERATED_EXPIRING_FRAGMENT % (7, b"[]", 1, expires_bytes(expires)) == message_fragment(b"7", b"[]", 1, expires)


@pytest.mark.parametrize(
    ("attempts", "published"),
    [(1, NOV21_NS), ((1, 3, 2), (NOV21_NS, NOV21_NS, NOV21_NS + 5)), (2, (NOV21_NS + 5, NOV21_NS, NOV21_NS + 5))],
)
def test_metadata_joins_each_fragment_given_one_value_for_all_or_one_each(attempts, published):
    fragments = [
        message_fragment(b"k}", b'{"a": "}"}', 0, 0),
        message_fragment(b"2", b'"x"', 1, NOV21_NS),
        message_fragment(b"3", b"[]", 2, 0),
    ]
    each = [[v] * 3 if isinstance(v, int) else list(v) for v in (attempts, published)]
    delivered = [msgspec.json.decode(f) for f in with_metadata(fragments, attempts, published)]
    expected = [{**msgspec.json.decode(f), "Attempt": a, "Published": format_expires(ns)} for f, a, ns in zip(fragments, *each)]
    assert delivered == expected
    assert [list(m) for m in delivered] == [[*msgspec.json.decode(f), "Attempt", "Published"] for f in fragments]  # after what it held


def test_a_batch_frame_is_one_json_line_carrying_the_fragments_in_order():
    fragments = [message_fragment(b"%d" % i, b'{"n": %d}' % i, i % 2, NOV21_NS if i else 0) for i in range(3)]
    frame = batch_frame('to"pic', "sub", fragments)
    assert frame.endswith(b"\n") and frame.count(b"\n") == 1
    assert msgspec.json.decode(frame) == {
        "Topic": 'to"pic',
        "Subscriber": "sub",
        "Messages": [msgspec.json.decode(f) for f in fragments],
    }


def test_a_batch_frame_without_messages_is_still_valid_json():
    assert msgspec.json.decode(batch_frame("t", "s", [])) == {"Topic": "t", "Subscriber": "s", "Messages": []}


# --- replies (§4) ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (Reply(status=200, id=Raw(b'"r1"'), accepted=3), {"Id": "r1", "Status": 200, "Accepted": 3}),
        (Reply(status=200, accepted=1), {"Status": 200, "Accepted": 1}),
        (Reply(status=200, id=Raw(b"7"), body={"Topics": {}}), {"Id": 7, "Status": 200, "Body": {"Topics": {}}}),
        (error_reply(BadRequest("Messages[2].Priority: bad\nline")), {"Status": 400, "Error": "Messages[2].Priority: bad\nline"}),
        (error_reply(NotFound("unknown topic 'x'"), Raw(b'"r2"')), {"Id": "r2", "Status": 404, "Error": "unknown topic 'x'"}),
    ],
)
def test_a_reply_is_one_json_line(reply, expected):
    line = encode_reply(reply)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert msgspec.json.decode(line) == expected


@pytest.mark.parametrize("id_", [b'"r\\u0031"', b"-1.50", b"1e3", b'"\xc3\xa9"'])
def test_a_reply_echoes_the_id_byte_for_byte(id_):
    req = decode_request(b'{"Command":"STATUS","Id":%s}' % id_)
    assert b'"Id":%s' % id_ in encode_reply(Reply(status=200, id=req.id))


@pytest.mark.parametrize(
    ("error", "status"),
    [(BadRequest, 400), (NotFound, 404), (TooLarge, 413), (ShuttingDown, 503), (StoreFull, 507), (RequestError, 500)],
)
def test_each_error_class_replies_with_its_status(error, status):
    assert msgspec.json.decode(encode_reply(error_reply(error("why"))))["Status"] == status
