"""The zbus MQ protocol (PROTOCOL §11), sans-IO: HTTP/1.1 and WebSocket on one
stream, bytes in, zbus messages out, and replies back to bytes.

A zbus message is `{"headers": {...}, "body": ..., "status": N}`. On a
WebSocket each text frame is one such object; over plain HTTP the request's
headers, then its query parameters, are the message's headers and its body the
message's body, and the reply's status is the response's status line. Header
names are matched case-insensitively and a header's value may be a string, a
number or a boolean: `window: 2` and `window: "2"` are the same.

HTTP is parsed by h11 and WebSocket by wsproto, both sans-IO like the rest of
ppmq: `Stream.feed` takes what the socket read and returns the whole messages
it completed; `Stream.reply` returns the bytes that answer one. A request or
frame over `max_bytes`, bytes that are not HTTP, a WebSocket frame that breaks
the protocol or JSON that is not a zbus message raise BadFrame (FrameTooLarge
for size): the listener closes that connection, after `Stream.refusal`'s bytes
where an answer can still be given.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import h11
import msgspec
import wsproto
import wsproto.events as ws
from wsproto.utilities import RemoteProtocolError as WsProtocolError

from ppmq.errors import BadFrame, BadRequest, FrameTooLarge, NotFound, RequestError

EMPTY = 604  # a take that found nothing ready (zbus's own status)
COMMANDS = ("pub", "sub", "take", "ack", "query", "create", "remove", "ping")
MAX_HEADER_BYTES = 16 * 1024  # an HTTP request's line and headers
MAX_WINDOW = 10_000  # messages one take asks for at most

Scalar = str | int | float | bool | None


class Message(msgspec.Struct):
    """One zbus request: its headers by lower-cased name, its body (any JSON),
    and whether it came over HTTP (answered by a response) or a WebSocket."""

    headers: dict[str, Scalar]
    body: Any = None
    http: bool = False
    sent: dict[str, Any] = msgspec.field(default_factory=dict)  # as sent, header names unchanged: what a signature covers

    def header(self, name: str) -> str | None:
        """A header's value as text (a number as its digits); None when absent or null."""
        value = self.headers.get(name)
        if value is None:
            return None
        if isinstance(value, bool):
            return "true" if value else "false"
        return value if isinstance(value, str) else msgspec.json.encode(value).decode()


class Call(msgspec.Struct, frozen=True):
    """A request's command and the headers it needs, checked (PROTOCOL §11)."""

    cmd: str
    mq: str | None = None
    channel: str | None = None
    window: int = 1
    ids: list[str] = msgspec.field(default_factory=list)
    body: Any = None
    key: str | None = None
    priority: int | None = None
    ttl: int | None = None
    answer: bool = True  # `ack: false` asks for no reply


def call_of(message: Message) -> Call:
    """The command a message asks for: NotFound for a command there is none of,
    BadRequest for a missing `mq` or `channel` or a header that is not a number."""
    cmd = (message.header("cmd") or "").lower()
    if cmd not in COMMANDS:
        raise NotFound(f"Command({message.header('cmd') or ''}) Not Found")
    mq = message.header("mq")
    channel = message.header("channel")
    if cmd != "ping" and not mq:
        raise BadRequest("missing mq")
    if cmd in ("sub", "take", "ack") and not channel:
        raise BadRequest("missing channel")
    return Call(
        cmd,
        mq=mq,
        channel=channel,
        window=_number(message, "window", 1, 1, MAX_WINDOW),
        ids=_ids(message) if cmd == "ack" else [],
        body=message.body,
        key=message.header("key"),
        priority=_optional_number(message, "priority", 0, 255),
        ttl=_optional_number(message, "ttl", 1, 10**9 - 1),
        answer=(message.header("ack") or "true").lower() != "false",
    )


def _optional_number(message: Message, name: str, low: int, high: int) -> int | None:
    return None if message.header(name) is None else _number(message, name, 0, low, high)


def _number(message: Message, name: str, default: int, low: int, high: int) -> int:
    text = message.header(name)
    if text is None:
        return default
    if not text.isdigit() or len(text) > 12 or not low <= int(text) <= high:
        raise BadRequest(f"{name} {text[:40]!r} is not a whole number from {low} to {high}")
    return int(text)


def _ids(message: Message) -> list[str]:
    """An ack's ids: the `ids` header, comma separated, or a body that is a list of them."""
    text = message.header("ids")
    if text is not None:
        return [i.strip() for i in text.split(",") if i.strip()]
    if isinstance(message.body, list) and all(isinstance(i, str) for i in message.body):
        return list(message.body)
    raise BadRequest("ack needs ids: an ids header, or a body that is a list of ids")


# --- messages out ---------------------------------------------------------------------------


def delivered(mq: str, channel: str, key: str, payload: msgspec.Raw, window: int) -> dict[str, Any]:
    """A message as pushed to a consumer or returned by a take (PROTOCOL §11)."""
    return {"headers": {"mq": mq, "channel": channel, "id": key, "window": window}, "body": payload}


def error_body(exc: RequestError) -> str:
    return str(exc)


# --- the stream -----------------------------------------------------------------------------


_json = msgspec.json.Encoder()


class Stream:
    """One connection's bytes: HTTP requests until one asks for a WebSocket,
    then WebSocket frames."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._http: h11.Connection | None = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        self._ws: wsproto.WSConnection | None = None
        self._request: h11.Request | None = None
        self._body = bytearray()
        self._text: list[str] = []
        self._text_bytes = 0
        self.pending = False  # part of a request or frame has arrived, not all of it
        self.closed = False  # the peer ended the stream (EOF or a WebSocket close)

    @property
    def open(self) -> bool:
        """A WebSocket that may still be written to (neither side closed it)."""
        return self._ws is not None and self._ws.state is wsproto.connection.ConnectionState.OPEN

    def feed(self, data: bytes | None) -> tuple[list[Message], bytes]:
        """The messages `data` completes, and bytes to send at once (a WebSocket
        handshake's answer, a pong, a close). b"" is the end of the stream;
        None looks again at what arrived already: HTTP requests sent one after
        the other are read one at a time, the next once the last is answered."""
        if self._ws is not None:
            return self._feed_ws(data) if data is not None else ([], b"")
        return self._feed_http(data)

    # --- HTTP -----------------------------------------------------------------------------

    def _feed_http(self, data: bytes | None) -> tuple[list[Message], bytes]:
        http = self._http
        assert http is not None, "not yet a WebSocket"
        if data is not None:
            http.receive_data(data)
        messages: list[Message] = []
        out = b""
        while True:
            try:
                event = http.next_event()
            except h11.RemoteProtocolError as exc:
                raise BadFrame(f"malformed HTTP: {exc}") from None
            if event is h11.NEED_DATA or event is h11.PAUSED:
                break
            if isinstance(event, h11.Request):
                self._request = event
                self._body.clear()
                if _upgrade(event):
                    return messages, out + self._upgrade_to_ws(event, http.trailing_data[0])
                length = _content_length(event)
                if length is not None and length > self.max_bytes:
                    raise FrameTooLarge(f"HTTP body of {length} bytes exceeds MaxFrameBytes ({self.max_bytes})")
                if http.they_are_waiting_for_100_continue:  # curl asks so before a large body
                    out += http.send(h11.InformationalResponse(status_code=100, headers=[])) or b""
            elif isinstance(event, h11.Data):
                self._body += event.data
                if len(self._body) > self.max_bytes:
                    raise FrameTooLarge(f"HTTP body of more than {self.max_bytes} bytes exceeds MaxFrameBytes")
            elif isinstance(event, h11.EndOfMessage):
                assert self._request is not None, "h11 ends only a message it began"
                messages.append(_from_http(self._request, bytes(self._body)))
                self._body.clear()
            elif isinstance(event, h11.ConnectionClosed):
                self.closed = True
                break
        self.pending = http.their_state is h11.SEND_BODY or (bool(data) and not messages and http.their_state is h11.IDLE)
        return messages, out

    def reply_http(self, status: int, body: Any) -> bytes:
        """The response to the HTTP request read last; the connection then
        waits for the next request (keep-alive) unless either side closes."""
        http = self._http
        assert http is not None, "answered over HTTP"
        content = _json.encode(body)
        headers = [("content-type", "application/json"), ("content-length", str(len(content)))]
        out = http.send(h11.Response(status_code=status, headers=headers, reason=_reason(status))) or b""
        out += http.send(h11.Data(data=content)) or b""
        out += http.send(h11.EndOfMessage()) or b""
        if http.our_state is h11.DONE and http.their_state is h11.DONE:
            http.start_next_cycle()
        return out

    @property
    def keep_alive(self) -> bool:
        """Whether the connection stays open after the last response (HTTP/1.0 or `Connection: close` end it)."""
        return self._ws is not None or (self._http is not None and self._http.our_state is h11.IDLE)

    def refusal(self, exc: BadFrame) -> bytes:
        """The bytes that tell the peer why its connection closes, where any can
        be sent: a 400 or 413 response, or a WebSocket close frame."""
        status = 413 if isinstance(exc, FrameTooLarge) else 400
        try:
            if self._ws is not None:
                code = 1009 if status == 413 else 1002
                return self._ws.send(ws.CloseConnection(code=code, reason=str(exc)[:100]))
            http = self._http
            assert http is not None, "either HTTP or a WebSocket"
            if http.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
                return b""
            content = _json.encode(str(exc)[:200])
            headers = [("content-type", "application/json"), ("content-length", str(len(content))), ("connection", "close")]
            return (http.send(h11.Response(status_code=status, headers=headers)) or b"") + (http.send(h11.Data(data=content)) or b"")
        except (h11.LocalProtocolError, wsproto.utilities.LocalProtocolError):
            return b""

    # --- WebSocket ------------------------------------------------------------------------

    def _upgrade_to_ws(self, request: h11.Request, rest: bytes) -> bytes:
        """Hand the stream to wsproto from the parsed upgrade request on."""
        conn = wsproto.WSConnection(wsproto.ConnectionType.SERVER)
        conn.initiate_upgrade_connection(list(request.headers), request.target)
        self._ws, self._http = conn, None
        out = b""
        for event in conn.events():
            if isinstance(event, ws.Request):
                out += conn.send(ws.AcceptConnection())
        messages, more = self._feed_ws(rest) if rest else ([], b"")
        if messages:
            raise BadFrame("a WebSocket message before the handshake's answer")
        return out + more

    def _feed_ws(self, data: bytes) -> tuple[list[Message], bytes]:
        conn = self._ws
        assert conn is not None, "a WebSocket"
        if not data:  # the peer went away without a close frame
            self.closed = True
            return [], b""
        conn.receive_data(data)
        messages: list[Message] = []
        out = b""
        events = 0
        try:
            for event in conn.events():
                events += 1
                if isinstance(event, ws.TextMessage):
                    self._text.append(event.data)
                    self._text_bytes += len(event.data)
                    if self._text_bytes > self.max_bytes:
                        raise FrameTooLarge(f"WebSocket message of more than {self.max_bytes} bytes exceeds MaxFrameBytes")
                    if event.message_finished:
                        text = "".join(self._text)
                        self._text.clear()
                        self._text_bytes = 0
                        messages.append(decode(text))
                elif isinstance(event, ws.BytesMessage):
                    raise BadFrame("a binary WebSocket frame: zbus messages are JSON text")
                elif isinstance(event, ws.Ping):
                    out += conn.send(event.response())
                elif isinstance(event, ws.CloseConnection):
                    if conn.state is not wsproto.connection.ConnectionState.REMOTE_CLOSING:
                        # wsproto reports a frame it cannot parse as a close of its own
                        raise BadFrame(f"malformed WebSocket frame: {event.reason}")
                    self.closed = True
                    out += conn.send(event.response())
        except WsProtocolError as exc:
            raise BadFrame(f"malformed WebSocket frame: {exc}") from None
        self.pending = bool(self._text) or not events  # bytes that finished no frame are part of one
        return messages, out

    def reply_ws(self, message: dict[str, Any]) -> bytes:
        """A message (a reply or a push) as one WebSocket text frame."""
        conn = self._ws
        assert conn is not None, "a WebSocket"
        return conn.send(ws.Message(data=_json.encode(message).decode()))


def reply(request: Message, status: int, body: Any) -> dict[str, Any]:
    """A WebSocket reply: the request's `id` echoed, so that a client matches it."""
    headers: dict[str, Any] = {}
    if "id" in request.headers:
        headers["id"] = request.headers["id"]
    return {"headers": headers, "status": status, "body": body}


_wire = msgspec.json.Decoder(dict[str, Any])


def decode(text: str) -> Message:
    """A WebSocket text frame as a message; BadFrame unless it is a JSON object
    whose headers have strings, numbers or booleans for values."""
    try:
        sent = _wire.decode(text)
        headers = msgspec.convert(sent.get("headers", {}), dict[str, Scalar])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BadFrame(f"not a zbus message: {exc}") from None
    sent["headers"] = headers
    return Message({name.lower(): value for name, value in headers.items()}, sent.get("body"), sent=sent)


def signature_text(message: Message) -> str:
    """What a signed message's signature covers, as zbuspy 1.2.0 makes it: the
    JSON text (keys sorted, no spaces, non-ASCII escaped) of its apiKey and
    signFields headers, each header `h.NAME` that signFields lists (null when
    absent; `h.*` is every header but the signature) and each top-level field
    it lists that the message has."""
    sent_headers: dict[str, Any] = message.sent.get("headers", {})
    fields = message.header("signfields") or ""
    headers: dict[str, Any] = {"apiKey": message.headers.get("apikey"), "signFields": message.headers.get("signfields")}
    signed: dict[str, Any] = {"headers": headers}
    for field in (f.strip() for f in fields.split(",")):
        if field == "h.*":
            headers.update((name, value) for name, value in sent_headers.items() if name.lower() != "signature")
        elif field.startswith("h."):
            headers[field[2:]] = message.headers.get(field[2:].lower())
        elif field and field != "headers" and field in message.sent:
            signed[field] = message.sent[field]
    return json.dumps(signed, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def signed_with(message: Message, secret: str) -> bool:
    """Whether the message's signature header is its signature with `secret`
    (upper- or lower-case hex)."""
    given = (message.header("signature") or "").lower()
    wanted = hmac.new(secret.encode(), signature_text(message).encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(given.encode(), wanted.encode())


def _from_http(request: h11.Request, body: bytes) -> Message:
    """An HTTP request as a message: its headers, then its query parameters
    (`body=` is the body); a body that is application/json is JSON, any other a string."""
    headers: dict[str, Scalar] = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in request.headers}
    content_type = headers.get("content-type")
    text = _text(body)
    payload: Any = text if body else None
    if body and isinstance(content_type, str) and content_type.split(";")[0].strip().lower() == "application/json":
        try:
            payload = msgspec.json.decode(body)
        except msgspec.DecodeError as exc:
            raise BadFrame(f"HTTP body is not the JSON its Content-Type says: {exc}") from None
    query = urlsplit(_text(request.target)).query
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name.lower() == "body":
            payload = value if payload is None else payload
        else:
            headers.setdefault(name.lower(), value)
    return Message(headers, payload, http=True, sent={"headers": headers, "body": payload})


def _text(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise BadFrame(f"not UTF-8 (byte {exc.start})") from None


def _upgrade(request: h11.Request) -> bool:
    return any(name == b"upgrade" and value.lower() == b"websocket" for name, value in request.headers)


def _content_length(request: h11.Request) -> int | None:
    for name, value in request.headers:
        if name == b"content-length" and value.isdigit():
            return int(value)
    return None


def _reason(status: int) -> bytes:
    return {200: b"OK", 400: b"Bad Request", 403: b"Forbidden", 404: b"Not Found", 500: b"Internal Server Error", EMPTY: b"No Message"}.get(
        status, b""
    )
