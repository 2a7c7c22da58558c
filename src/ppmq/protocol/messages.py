"""Wire types of PROTOCOL.md sections 2, 4 and 5; a request's error (ppmq.errors) becomes its reply here.

Frames are decoded straight into msgspec Structs spelt the way ppmq writes them
(`Topic`, `Messages`, ...). ppMQ's Go producers write lower-case keys and Go's
decoder matches keys case-insensitively (PROTOCOL §1), so a frame that names a
key in another case takes a slower path: its keys are folded to our spelling and
the frame is decoded again. Payloads stay `msgspec.Raw` from socket to disk to
subscriber: the broker never builds Python objects out of them.
"""

from __future__ import annotations

import codecs
import datetime as dt
import math
import operator
import re
from collections.abc import Iterable, Sequence
from functools import lru_cache
from itertools import repeat
from typing import Any

import msgspec
from msgspec import UNSET, Raw, UnsetType

from ppmq.errors import BadRequest, RequestError

# --- client -> broker -----------------------------------------------------------


class Message(msgspec.Struct, rename="pascal", forbid_unknown_fields=True):
    """One message of a publish (PROTOCOL §2)."""

    payload: Raw
    key: str | None = None
    # RFC 3339 (decoded by msgspec) or Unix seconds; Go's zero time means none.
    expires: dt.datetime | int | float | None = None
    ttl_s: float | None = msgspec.field(default=None, name="TTL")
    priority: int = 0
    # PROTOCOL §8: not delivered before then; both given is an error (core/validate.py).
    delay: float | None = None
    not_before: dt.datetime | int | float | None = None


class Request(msgspec.Struct, rename="pascal", forbid_unknown_fields=True):
    """One wrapper object sent to the server socket (PROTOCOL §2)."""

    topic: str | None = None
    subscriber: str | None = None
    messages: list[Message] | None = None
    acks: list[str] | None = None
    # PROTOCOL §8, applied after Acks and before Command, in this order:
    nacks: list[str] | None = None
    rejects: list[str] | None = None
    touch: list[str] | None = None
    delay: float | None = None  # for Nacks
    keys: list[str] | None = None  # for PURGE, REDRIVE
    state: str | None = None  # for PEEK: "ready" or "inflight"
    limit: int | None = None  # for PEEK
    after: str | None = None  # for PEEK: a previous reply's Next
    # PROTOCOL §9 TAKE: how many messages at most, and how many seconds to wait for one.
    count: int | None = None
    wait: float | None = None
    command: str | None = None
    # Kept raw so that the reply echoes the client's Id byte for byte.
    id: Raw | UnsetType = UNSET


WRAPPER_KEYS = {
    f.lower(): f
    for f in (
        "Topic",
        "Subscriber",
        "Messages",
        "Acks",
        "Nacks",
        "Rejects",
        "Touch",
        "Delay",
        "Keys",
        "State",
        "Limit",
        "After",
        "Count",
        "Wait",
        "Command",
        "Id",
    )
}
MESSAGE_KEYS = {f.lower(): f for f in ("Key", "Payload", "Expires", "TTL", "Priority", "Delay", "NotBefore")}

_request_decoder = msgspec.json.Decoder(Request)
_loose_object = msgspec.json.Decoder(dict[str, Raw])
_loose_messages = msgspec.json.Decoder(list[dict[str, Raw]])
_AT_PATH = re.compile(r"^(?P<msg>.*?)(?: - at `\$\.?(?P<path>[^`]*)`)?$", re.S)
_MISSING = re.compile(r"Object missing required field `(?P<field>[^`]+)`")


def decode_request(frame: bytes) -> Request:
    """Decode one frame into a Request, or raise BadRequest naming what is wrong.

    The frame's `Id` is attached to the error (`err.request_id`) whenever it can be
    found, so that even a rejected request gets its reply.
    """
    try:
        request = _request_decoder.decode(frame)  # the usual frame: keys as PROTOCOL spells them
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        if not frame.isascii():
            _check_utf8(frame)
        request = _decode_otherwise(frame)
    else:
        # msgspec checks the UTF-8 of the strings it decodes, not of the Raw values it keeps
        if (request.messages is not None or request.id is not UNSET) and not frame.isascii():
            _check_utf8(frame)
    # The Id is one JSON value, checked by msgspec: a string or a number is told by its first byte.
    if request.id is not UNSET and bytes(request.id)[:1] not in _ID_STARTS:
        raise _rejected(frame, "Id: must be a string or a number")
    return request


_ID_STARTS = b'"-0123456789'  # how a JSON string or number begins


def _check_utf8(frame: bytes) -> None:
    """Raise BadRequest naming the field of a frame that is not UTF-8."""
    try:
        frame.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _rejected(frame, _utf8_error(frame, exc)) from None


def _decode_otherwise(frame: bytes) -> Request:
    """A frame the decoder did not take as it is: keys in another case, lone
    surrogates, or the BadRequest that says what is wrong with it."""
    try:
        try:
            return _decode_any_case(frame)
        except msgspec.DecodeError as exc:
            if isinstance(exc, msgspec.ValidationError) or not _LONE_SURROGATE.search(frame):
                raise
            frame = _LONE_SURROGATE.sub(rb"\\ufffd", frame)  # what Go's decoder does with them
            return _decode_any_case(frame)
    except msgspec.DecodeError as exc:
        raise _bad(frame, exc) from None
    except RecursionError:
        raise _rejected(frame, "invalid JSON: nested too deeply") from None


def _decode_any_case(frame: bytes) -> Request:
    try:
        return _request_decoder.decode(frame)
    except msgspec.ValidationError as exc:
        if "unknown field" not in str(exc):
            raise
    return _request_decoder.decode(_fold_keys(frame))


_SURROGATE_HI = rb"\\u[dD][89abAB][0-9a-fA-F]{2}"
_SURROGATE_LO = rb"\\u[dD][c-fC-F][0-9a-fA-F]{2}"
_LONE_SURROGATE = re.compile(_SURROGATE_HI + rb"(?!" + _SURROGATE_LO + rb")|(?<!" + _SURROGATE_HI + rb")" + _SURROGATE_LO)
_NOT_UTF8 = "\ufdd0"  # a noncharacter: marks where the bad bytes were


def _mark_not_utf8(exc: UnicodeError) -> tuple[str, int]:
    """The "ppmq-mark" error handler, for decoding only: bad bytes become _NOT_UTF8."""
    assert isinstance(exc, UnicodeDecodeError), "ppmq-mark decodes"
    return _NOT_UTF8, exc.end


codecs.register_error("ppmq-mark", _mark_not_utf8)


def _utf8_error(frame: bytes, exc: UnicodeDecodeError) -> str:
    """Name the field that holds bytes which are not UTF-8, as for any bad field."""
    message = "bytes that are not valid UTF-8"
    try:
        marked = msgspec.json.decode(frame.decode("utf-8", "ppmq-mark").encode())
    except (msgspec.DecodeError, RecursionError):
        return f"{message} (byte {exc.start} of the frame)"
    path = _marked_path(marked) if isinstance(marked, dict) else None
    return f"{path}: {message}" if path else f"{message} (byte {exc.start} of the frame)"


def _marked_path(wrapper: dict) -> str | None:
    for key, value in wrapper.items():
        name = WRAPPER_KEYS.get(key.lower(), key)
        if name == "Messages" and isinstance(value, list):
            for i, m in enumerate(value):
                for mkey, mvalue in m.items() if isinstance(m, dict) else ():
                    if _has_mark(mkey) or _has_mark(mvalue):
                        return f"Messages[{i}].{MESSAGE_KEYS.get(mkey.lower(), mkey)}"
        if _has_mark(key) or _has_mark(value):
            return name
    return None


def _has_mark(value: Any) -> bool:
    if isinstance(value, str):
        return _NOT_UTF8 in value
    if isinstance(value, list):
        return any(map(_has_mark, value))
    if isinstance(value, dict):
        return any(_has_mark(k) or _has_mark(v) for k, v in value.items())
    return False


_ID = re.compile(rb'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"|-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?')


def _is_id(raw: Raw) -> bool:
    """A JSON string or number in UTF-8: what a reply can echo byte for byte and
    still be JSON. An Id dug out of a broken frame may be neither."""
    data = bytes(raw)
    if _ID.fullmatch(data) is None:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _fold_keys(frame: bytes) -> bytes:
    """Re-spell a wrapper's and its messages' keys as ppmq writes them.

    Unknown keys are dropped, as Go's decoder ignores them.
    """
    wrapper = _fold(_loose_object.decode(frame), WRAPPER_KEYS)
    raw_messages = wrapper.get("Messages")
    if raw_messages is not None:
        try:
            messages = _loose_messages.decode(raw_messages)
        except msgspec.ValidationError:
            pass  # not a list of objects: the strict decoder names the problem
        else:
            wrapper["Messages"] = [_fold(m, MESSAGE_KEYS) for m in messages]
    return msgspec.json.encode(wrapper)


def _fold(obj: dict[str, Raw], names: dict[str, str]) -> dict[str, Any]:
    return {names[k.lower()]: v for k, v in obj.items() if k.lower() in names}


def _bad(frame: bytes, exc: Exception) -> BadRequest:
    """Turn a msgspec error into `Messages[2].Priority: Expected int, got str`."""
    text = str(exc)
    m = _AT_PATH.match(text)
    msg, path = (m["msg"], m["path"]) if m else (text, None)
    missing = _MISSING.match(msg)
    if missing:
        path = f"{path}.{missing['field']}" if path else missing["field"]
        msg = "required field is missing"
    if not isinstance(exc, msgspec.ValidationError):  # ValidationError subclasses DecodeError
        msg = f"invalid JSON: {msg.removeprefix('JSON is malformed: ')}"
    return _rejected(frame, f"{path}: {msg}" if path else msg)


def _rejected(frame: bytes, message: str) -> BadRequest:
    err = BadRequest(message)
    err.request_id = find_request_id(frame)
    return err


def find_request_id(frame: bytes) -> Raw | UnsetType:
    """The `Id` of a frame that failed to decode as a Request, if it has one."""
    try:
        obj = _loose_object.decode(frame)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):  # msgspec checks UTF-8 in keys only
        return _leading_id(frame)
    for key, value in obj.items():
        if key.lower() == "id" and _is_id(value):
            return value
    return UNSET


_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+')
ID_SEARCH_BYTES = 1 << 16


def _leading_id(frame: bytes) -> Raw | UnsetType:
    """The top-level `Id` of a frame that is not valid JSON, if it stands in the
    first 64 KiB (ppmq's clients write it first). Keys inside payloads are
    skipped by following the nesting, so no reply goes to a request without Id."""
    depth, key, after_colon = 0, None, False
    for m in _JSON_TOKEN.finditer(frame, 0, ID_SEARCH_BYTES):
        tok = m.group()
        if tok in (b"{", b"["):
            depth += 1
        elif tok in (b"}", b"]"):
            depth -= 1
        elif depth == 1 and tok == b":":
            after_colon = True
            continue
        elif depth == 1 and after_colon and key == b'"id"':
            return Raw(tok) if _is_id(Raw(tok)) else UNSET
        elif depth == 1 and tok[:1] == b'"':
            key = tok.lower()
        after_colon = False
    return UNSET


# --- broker -> client -------------------------------------------------------------


class Reply(msgspec.Struct, omit_defaults=True, rename="pascal"):
    """The one reply to a request that carried an `Id` (PROTOCOL §4)."""

    status: int
    id: Raw | UnsetType = UNSET
    accepted: int | None = None
    error: str | None = None
    body: Any = None


_reply_encoder = msgspec.json.Encoder()


def encode_reply(reply: Reply) -> bytes:
    return _reply_encoder.encode(reply) + b"\n"


def error_reply(exc: RequestError, request_id: Raw | UnsetType = UNSET) -> Reply:
    """The reply to a request that failed with exc: the status its class carries, its text."""
    return Reply(status=exc.status, id=request_id, error=str(exc))


# --- broker -> subscriber (PROTOCOL §5) --------------------------------------------

_GO_ZERO_TIME = dt.datetime(1, 1, 1, tzinfo=dt.UTC)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MAX_EXPIRES_S = 2**63 // 10**9 - 1


def expires_ns(value: dt.datetime | int | float | None) -> int:
    """`Expires` as Unix nanoseconds; 0 means the message never expires.

    Go's zero time is what every ppMQ producer sends for "no expiry", and 0
    means the same as a number. A time without an offset is read as UTC.
    """
    if value is None or value == 0:
        return 0
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        if value == _GO_ZERO_TIME:
            return 0
        delta = value - _EPOCH
        ns = (delta.days * 86400 + delta.seconds) * 10**9 + delta.microseconds * 1000
    elif isinstance(value, int):
        ns = value * 10**9
    elif math.isfinite(value) and abs(value) <= _MAX_EXPIRES_S:  # else the nanoseconds overflow a float
        ns = round(value * 1e9)
    else:
        ns = 0
    if not 0 < ns < _MAX_EXPIRES_S * 10**9:
        raise ValueError(f"{_shown(value)} is outside the range of Unix seconds 1..{_MAX_EXPIRES_S}")
    return ns


def _shown(value: dt.datetime | int | float) -> str:
    """A time as an error names it: a number too long to read by its size."""
    if isinstance(value, int) and not -(10**20) < value < 10**20:
        return f"a number of {len(str(abs(value)))} digits"
    return f"{value:g}" if isinstance(value, float) else str(value)


def format_expires(ns: int) -> str:
    """RFC 3339 in UTC with up to nanosecond precision, as Go writes it."""
    seconds, frac = divmod(ns, 10**9)
    base = dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{frac:09d}".rstrip("0").rstrip(".") + "Z"


_str_encoder = msgspec.json.Encoder()


GENERATED_FRAGMENT = b'{"Key":"%d","Payload":%s,"Priority":%d}'
"""message_fragment of a message whose key the broker generated (its id), with
no Expires and no Origin: formatted from (id, payload, priority) in one step,
the publish's common case."""

GENERATED_EXPIRING_FRAGMENT = b'{"Key":"%d","Payload":%s,"Priority":%d,"Expires":"%s"}'
"""The same with an Expires, from (id, payload, priority, expires_bytes(Expires)):
a topic whose messages have TTLs, or a MaxAge."""


@lru_cache(maxsize=256)
def expires_bytes(ns: int) -> bytes:
    """format_expires as the bytes of a fragment, kept for the times last asked:
    a publish's messages share theirs (its time, and an Expires from one TTL or
    MaxAge), and strftime took a fifth of a step that stores messages with a TTL."""
    return format_expires(ns).encode()


def message_fragment(key: bytes, payload: bytes, priority: int, expires: int, origin: bytes | None = None) -> bytes:
    """A delivered message's JSON object, built once at publish and stored as is,
    from its key as stored (UTF-8); a dead-letter copy carries its `Origin`
    object (PROTOCOL §8)."""
    # A generated key is digits, which are their own JSON string: no decoding and encoding.
    quoted = b'"%s"' % key if key.isdigit() else _str_encoder.encode(key.decode())
    extra = b',"Expires":"%s"' % expires_bytes(expires) if expires else b""
    if origin is not None:
        extra += b',"Origin":' + origin
    return b'{"Key":%s,"Payload":%s,"Priority":%d%s}' % (quoted, payload, priority, extra)


def with_metadata(fragments: Sequence[bytes], attempts: int | Sequence[int], published_ns: int | Sequence[int]) -> list[bytes]:
    """Stored fragments as a `Metadata: true` subscriber receives them (PROTOCOL
    §8), given each one's attempt and publish time, or one of either for all of
    them (a batch of fresh messages). A fragment's closing brace gives way to
    its metadata's suffix; suffixes are cached, since a batch's messages share
    them by the publish, and every loop runs in C."""
    if isinstance(attempts, int) and isinstance(published_ns, int):
        suffixes: Iterable[bytes] = repeat(_metadata_suffix(attempts, published_ns))
    else:
        suffixes = map(_metadata_suffix, _each(attempts), _each(published_ns))
    return list(map(operator.add, map(_ALL_BUT_LAST, fragments), suffixes))


_ALL_BUT_LAST = operator.itemgetter(slice(None, -1))


def _each(column: int | Sequence[int]) -> Iterable[int]:
    """A value for every message: one for all of them repeated."""
    return repeat(column) if isinstance(column, int) else column


@lru_cache(maxsize=256)
def _metadata_suffix(attempt: int, published_ns: int) -> bytes:
    """What follows a fragment's last field for a Metadata subscriber, its closing brace included."""
    return b',"Attempt":%d,"Published":"%s"}' % (attempt, expires_bytes(published_ns))


class Origin(msgspec.Struct, rename="pascal", omit_defaults=True):
    """Where a dead letter comes from and why (PROTOCOL §8), delivered with it.
    `Key` is the message's key on its origin topic: a dead-letter topic without
    Dedupe gives the copy a key of its own, and REDRIVE puts the original back.
    `Priority` is the message's on its origin topic, which a dead-letter topic
    of fewer priorities holds lower; an Origin an older ppmq stored has none,
    and REDRIVE then goes by the copy's."""

    topic: str
    subscriber: str
    reason: str  # attempts, rejected, expired, overflow
    attempts: int
    published: str
    key: str
    priority: int | None = None


class _Fragment(msgspec.Struct, rename="pascal"):
    payload: Raw
    origin: Origin | None = None


_fragment_decoder = msgspec.json.Decoder(_Fragment)


def origin(topic: str, sub: str, reason: str, attempts: int, publish_ns: int, key: bytes, priority: int) -> bytes:
    """The Origin object of a dead-letter copy, as JSON."""
    return _str_encoder.encode(Origin(topic, sub, reason, attempts, format_expires(publish_ns), key.decode(), priority))


def fragment_parts(fragment: bytes) -> tuple[bytes, Origin | None]:
    """The raw Payload of a stored message and its Origin, if it is a dead letter."""
    parts = _fragment_decoder.decode(fragment)
    return bytes(parts.payload), parts.origin


def fragment_payload(fragment: bytes) -> bytes:
    """The raw Payload of a message built by message_fragment, byte for byte."""
    return bytes(_fragment_decoder.decode(fragment).payload)


def batch_frame(topic: str, subscriber: str, fragments: list[bytes]) -> bytes:
    """The line pushed to a subscriber: `{"Topic":..,"Subscriber":..,"Messages":[..]}`."""
    return b"%s%s]}\n" % (_batch_head(topic, subscriber), b",".join(fragments))


@lru_cache(maxsize=1024)
def _batch_head(topic: str, subscriber: str) -> bytes:
    """What a subscription's batches begin with, up to their first message: the
    same for every batch, and kept for as many subscriptions as a broker mostly has."""
    head = _str_encoder.encode({"Topic": topic, "Subscriber": subscriber})
    return head[:-1] + b',"Messages":['
