"""Bad input on the server socket, sent as literal bytes to a real `ppmq serve`.

PROTOCOL §3 Validation: a publish is applied whole or not at all, a rejected
request changes nothing, and bad input never stops the broker nor affects other
connections. PROTOCOL §1 Framing and §4 Replies: every request with an `Id` gets
exactly one reply, one without gets none, a frame over MaxFrameBytes gets a 413
without `Id` and the connection is closed.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time

import pytest

from ..conftest import WAIT_S, wait_for

MAX_MESSAGE_BYTES = 1024
MAX_FRAME_BYTES = 65536
# A reply this late means a stalled client held the others up (a busy CI host stays well below it).
SLOW_S = 2.5
TOPICS = [
    {"Name": "t", "Priorities": 2, "Expire": True, "Subscribers": ["s"]},
    {"Name": "d", "Dedupe": True, "Subscribers": ["s"]},
    {"Name": "n"},  # nobody subscribes: payloads no subscriber could decode go here
]
STATUS = b'{"Id":"status","Command":"STATUS"}\n'


class Conn:
    """One client connection on the server socket: literal bytes out, reply lines in."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)  # blocking: waits for room in a full accept queue
        self.sock.settimeout(WAIT_S)
        self._buf = b""

    def send(self, data: bytes) -> Conn:
        self.sock.sendall(data)
        return self

    def line(self) -> bytes | None:
        """The next reply line, or None once the broker has closed the connection."""
        while b"\n" not in self._buf:
            try:
                data = self.sock.recv(1 << 16)
            except ConnectionResetError:  # closed while our unread bytes were still queued
                data = b""
            if not data:
                return None
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def reply(self) -> dict:
        line = self.line()
        assert line is not None, "the broker closed the connection instead of replying"
        return json.loads(line)

    def ask(self, data: bytes) -> dict:
        return self.send(data).reply()

    def replies_until_closed(self) -> list[dict]:
        replies = []
        while (line := self.line()) is not None:
            replies.append(json.loads(line))
        return replies

    def send_in_background(self, data: bytes, shut_write: bool = False) -> threading.Thread:
        """Send while the test reads replies, so that neither side blocks the other."""

        def run() -> None:
            try:
                self.sock.sendall(data)
                if shut_write:
                    self.sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the broker closed on us: what the test checks

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def frame(obj: dict) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def publish(topic: str, payload: object, rid: object = "p") -> bytes:
    """One message; its Key matters only on the dedupe topic `d`."""
    return frame({"Id": rid, "Topic": topic, "Messages": [{"Payload": payload, "Key": "k"}]})


def counts(body: dict) -> dict:
    """What a rejected request must not move: Published and Stored of every topic."""
    return {name: (t["Published"], t["Stored"]) for name, t in body["Topics"].items()}


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def settled_fd_count(pid: int, quiet_s: float = 0.5) -> int:
    """The broker's descriptors once the count has not moved for quiet_s: a
    connection a client just closed stays open in the broker until its loop
    reads the end of it, which on a loaded machine can come after the count is
    read, and a baseline counting it can never be reached again."""
    count, since = fd_count(pid), time.monotonic()
    deadline = since + WAIT_S
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, f"the broker's descriptors did not settle: {count}"
        time.sleep(0.02)
        now = fd_count(pid)
        if now != count:
            count, since = now, time.monotonic()
    return count


@pytest.fixture
def broker(broker_factory):
    """A broker with small limits and subscriber `s` acking on its delivery connection."""
    b = broker_factory(TOPICS, ["s"], MaxMessageBytes=MAX_MESSAGE_BYTES, MaxFrameBytes=MAX_FRAME_BYTES)
    return b, broker_factory.subscriber(b, "s")


# --- PROTOCOL §3 Validation: the right status, an error naming index and field ---------


def third_is(topic: str, bad: dict | bytes, rid: bytes = b'"bad"') -> bytes:
    """A publish of four messages of which only Messages[2] is `bad` (a dict, or raw bytes)."""
    good = [json.dumps({"Payload": f"good{i}", "Key": f"k{i}"}).encode() for i in range(4)]
    good[2] = bad if isinstance(bad, bytes) else json.dumps(bad).encode()
    return b'{"Id":%s,"Topic":%s,"Messages":[%s]}\n' % (rid, json.dumps(topic).encode(), b",".join(good))


def wrapper(**fields: object) -> bytes:
    return frame({"Id": "bad", **fields})


REJECTED = [
    pytest.param(third_is("nope", {"Payload": "x"}), 404, r"^Topic: unknown topic 'nope'$", id="unknown topic"),
    pytest.param(
        third_is("t", {"Payload": "x", "Priority": 5}),
        400,
        "^" + re.escape("Messages[2].Priority: 5 is out of range 0..1 for topic 't'") + "$",
        id="priority above the range",
    ),
    pytest.param(third_is("t", {"Payload": "x", "Priority": -1}), 400, r"^Messages\[2\]\.Priority: -1 ", id="negative priority"),
    pytest.param(third_is("t", {"Payload": "x", "Priority": "high"}), 400, r"^Messages\[2\]\.Priority: ", id="priority of the wrong type"),
    pytest.param(third_is("d", {"Payload": "x", "Key": 7}), 400, r"^Messages\[2\]\.Key: ", id="key of the wrong type"),
    pytest.param(third_is("t", {"Priority": 0}), 400, r"^Messages\[2\]\.Payload: ", id="payload missing"),
    pytest.param(third_is("d", {"Payload": "x"}), 400, r"^Messages\[2\]\.Key: ", id="key missing on a dedupe topic"),
    pytest.param(third_is("d", {"Payload": "x", "Key": ""}), 400, r"^Messages\[2\]\.Key: ", id="key empty on a dedupe topic"),
    pytest.param(
        third_is("t", {"Payload": "x" * MAX_MESSAGE_BYTES}),
        413,
        r"^Messages\[2\]\.Payload: .*MaxMessageBytes",
        id="payload over MaxMessageBytes",
    ),
    pytest.param(third_is("t", {"Payload": "x", "Expires": "tomorrow"}), 400, r"^Messages\[2\]\.Expires: ", id="Expires not a time"),
    pytest.param(third_is("t", {"Payload": "x", "Expires": -5}), 400, r"^Messages\[2\]\.Expires: ", id="Expires before 1970"),
    pytest.param(
        third_is("t", {"Payload": "x", "Expires": "2099-01-01T00:00:00Z", "TTL": 60}),
        400,
        r"^Messages\[2\]\.(TTL|Expires): ",
        id="both Expires and TTL",
    ),
    pytest.param(third_is("t", {"Payload": "x", "TTL": -5}), 400, r"^Messages\[2\]\.TTL: ", id="negative TTL"),
    pytest.param(
        third_is("t", b'{"Payload": "caf\xe9", "Key": "k2"}'),
        400,
        r"^Messages\[2\]\.Payload: ",
        id="bytes that are not UTF-8",
    ),
    *(
        pytest.param(
            third_is("t", b'{"Payload": "x", "Key": "k2", "%s": %s}' % (field.encode(), value)),
            400,
            r"^Messages\[2\]\.%s: " % field,
            id=f"{field} of {value.decode()[:12]}",
        )
        for field in ("Expires", "NotBefore", "TTL", "Delay")
        for value in (b"1e308", b"-1e308", b"1" + b"0" * 400, b"-1" + b"0" * 30, b'"NaN"')
    ),
    pytest.param(wrapper(Topic="t", Subscriber="s", Nacks=["1"], Delay=1e308), 400, r"^Delay: ", id="nack Delay of 1e308"),
    pytest.param(wrapper(Topic="t", Subscriber="s", Command="TAKE", Wait=-1e308), 400, r"^Wait: ", id="TAKE Wait of -1e308"),
    pytest.param(wrapper(Topic="t", Subscriber="s", Command="TAKE", Wait=1e308), 400, r"^Wait: ", id="TAKE Wait of 1e308"),
    pytest.param(wrapper(Messages=[{"Payload": "x"}]), 400, r"^Topic: ", id="messages without a topic"),
    pytest.param(wrapper(Command="FLUSH"), 400, r"^Command: .*'FLUSH'", id="unknown command"),
    pytest.param(wrapper(Topic="t", Acks=["1"]), 400, r"^Subscriber: ", id="acks without a subscriber"),
    pytest.param(wrapper(Topic="t", Subscriber="ghost", Acks=["1"]), 404, r"^Subscriber: .*'ghost'", id="acks from an unknown subscriber"),
    pytest.param(wrapper(Subscriber="ghost", Command="RECONNECT"), 404, r"^Subscriber: .*'ghost'", id="reconnect of an unknown subscriber"),
    pytest.param(
        wrapper(Topic="t", Messages=[{"Payload": "x"}], Subscriber="ghost", Acks=["1"]),
        404,
        r"^Subscriber: ",
        id="good messages with acks from an unknown subscriber",
    ),
    pytest.param(
        wrapper(Topic="t", Messages=[{"Payload": "x"}], Command="FLUSH"),
        400,
        r"^Command: ",
        id="good messages with an unknown command",
    ),
]


@pytest.mark.parametrize(("request_bytes", "status", "error"), REJECTED)
def test_a_rejected_request_gets_its_status_and_an_error_naming_the_field_and_changes_nothing(broker, request_bytes, status, error):
    b, sub = broker
    with Conn(b.socket) as c:
        before = c.ask(STATUS)["Body"]
        # When the bad request is followed on the same connection by a STATUS
        c.send(request_bytes + STATUS)
        # Then it gets its own reply first, with the status and an error naming the field
        reply = c.reply()
        assert (reply["Id"], reply["Status"]) == ("bad", status), reply
        assert re.search(error, reply["Error"]), reply["Error"]
        # And nothing was stored or published, only the rejection counted
        after = c.reply()["Body"]
        assert counts(after) == counts(before)
        assert after["Rejected"] == before["Rejected"] + 1
        # And the connection still serves a good request on every topic
        for topic in ("t", "d"):
            assert c.ask(publish(topic, "marker"))["Status"] == 200
    # A subscriber receives the markers and nothing of the rejected request (it would come first)
    sub.wait_messages(2)
    assert sub.payloads() == ["marker", "marker"]


def test_a_rejected_publish_leaves_the_stored_message_of_the_same_key_untouched(broker_factory):
    # Given a message stored under key k0 on the dedupe topic, its subscriber not yet there
    b = broker_factory(TOPICS, ["s"])
    with Conn(b.socket) as c:
        assert c.ask(frame({"Id": 1, "Topic": "d", "Messages": [{"Payload": "old", "Key": "k0"}]}))["Status"] == 200
        # When a publish that would replace it is rejected for its third message
        assert c.ask(third_is("d", {"Payload": "x", "Key": "k9", "Priority": 1}))["Status"] == 400
    # Then the old version is what gets delivered, and nothing counts as replaced
    sub = broker_factory.subscriber(b, "s")
    (m,) = sub.wait_messages(1)
    assert (m["Key"], m["Payload"]) == ("k0", "old")
    d = b.status()["Topics"]["d"]
    assert (d["Published"], d["Replaced"]) == (1, 0)


ONE_WAY = [
    pytest.param(b'{"Topic":"nope","Messages":[{"Payload":1}]}\n', id="unknown topic"),
    pytest.param(b'{"Topic":"t","Messages":[{"Payload":1},{"Payload":2,"Priority":9}]}\n', id="priority out of range"),
    pytest.param(b'{"Command":"FLUSH"}\n', id="unknown command"),
    pytest.param(b'{"Topic":"t","Acks":["1"]}\n', id="acks without a subscriber"),
    pytest.param(b'{"Topic":"t","Messages":[{"Payload":"caf\xe9"}]}\n', id="bytes that are not UTF-8"),
    pytest.param(b'{"Topic":"t","Messages":[{"Payload":1,"Priority":"high"}]}\n', id="wrong type"),
    pytest.param(b'{"Topic":"t","Messages":[{"Payload":{"Id":7}},]}\n', id="invalid JSON with an Id inside a payload"),
]


@pytest.mark.parametrize("request_bytes", ONE_WAY)
def test_a_bad_request_without_an_id_gets_no_reply_and_is_counted_as_rejected(broker, request_bytes):
    b, _ = broker
    with Conn(b.socket) as c:
        before = c.ask(STATUS)["Body"]
        # The first line after a one-way bad request is the reply to the STATUS behind it
        after = c.ask(request_bytes + STATUS)
        assert after["Id"] == "status", after
        assert after["Body"]["Rejected"] == before["Rejected"] + 1
        assert counts(after["Body"]) == counts(before)


# --- garbage and odd values: answered or accepted, and nobody else notices -------------


def publish_raw(payload: bytes, extra: bytes = b"", topic: bytes = b"t", rid: bytes = b'"odd"') -> bytes:
    return b'{"Id":%s,"Topic":"%s","Messages":[{"Payload":%s%s}]}\n' % (rid, topic, payload, extra)


NESTED = b"[" * 10000 + b"]" * 10000
HUGE = b"1" * 400
NOT_DELIVERED = object()
ODD = [
    # request bytes, reply Id (None: no Id, so no reply), statuses allowed, payload delivered if accepted
    pytest.param(b"hello, broker\n", None, None, NOT_DELIVERED, id="a line of garbage"),
    pytest.param(b"\x00\xff\xfe\x80 binary garbage\n", None, None, NOT_DELIVERED, id="binary garbage"),
    pytest.param(b"[1,2]\n", None, None, NOT_DELIVERED, id="a JSON array"),
    pytest.param(b"42\n", None, None, NOT_DELIVERED, id="a bare number"),
    pytest.param(b"{not json}\n", None, None, NOT_DELIVERED, id="garbage in braces"),
    pytest.param(NESTED + b"\n", None, None, NOT_DELIVERED, id="10000 nested arrays"),
    pytest.param(publish_raw(NESTED, topic=b"n"), "odd", {200, 400}, NOT_DELIVERED, id="10000 nested arrays as a payload"),
    pytest.param(publish_raw(HUGE, rid=HUGE), int(HUGE), {200}, int(HUGE), id="a huge integer as Id and payload"),
    pytest.param(publish_raw(b"1", b',"Priority":' + HUGE), "odd", {400}, NOT_DELIVERED, id="a huge integer priority"),
    pytest.param(publish_raw(b"1", b',"Expires":' + HUGE), "odd", {400}, NOT_DELIVERED, id="a huge integer Expires"),
    pytest.param(publish_raw(b"1", b',"TTL":1e400'), "odd", {400}, NOT_DELIVERED, id="a TTL beyond any float"),
    pytest.param(publish_raw(rb'"\ud800"', topic=b"n"), "odd", {200, 400}, NOT_DELIVERED, id="a lone surrogate escape"),
    pytest.param(publish_raw('"😀 \\ud83d\\ude00"'.encode()), "odd", {200}, "😀 😀", id="an emoji raw and escaped"),
    pytest.param(publish_raw(rb'"a\u0000b"', b',"Key":"\\u0000"'), "odd", {200}, "a\x00b", id="NUL escapes"),
]


@pytest.mark.parametrize(("request_bytes", "rid", "statuses", "delivered"), ODD)
def test_odd_input_is_answered_or_counted_and_the_broker_keeps_serving_other_connections(broker, request_bytes, rid, statuses, delivered):
    b, sub = broker
    with Conn(b.socket) as other, Conn(b.socket) as c:
        before = other.ask(STATUS)["Body"]
        c.send(request_bytes + STATUS)
        rejected = 1
        if rid is not None:
            reply = c.reply()
            assert reply["Id"] == rid and reply["Status"] in statuses, reply
            rejected = reply["Status"] != 200
        after = c.reply()
        assert after["Id"] == "status", after
        assert after["Body"]["Rejected"] == before["Rejected"] + rejected
        # Another connection, open all along, publishes fine; so does this one
        assert other.ask(publish("t", "other"))["Status"] == 200
        assert c.ask(publish("t", "same"))["Status"] == 200
    expected = ["other", "same"] if rejected or delivered is NOT_DELIVERED else [delivered, "other", "same"]
    sub.wait_messages(len(expected))
    assert sub.payloads() == expected
    assert b.alive()


@pytest.mark.parametrize("topic", ["t", "d", "n"], ids=["TTLs", "Dedupe", "no subscribers"])
def test_an_empty_messages_list_is_a_publish_of_nothing(broker, topic):
    """Accepted 0: there is nothing in it to refuse (docs/protocol.md, Replies),
    and nothing is stored, counted or delivered."""
    b, sub = broker
    with Conn(b.socket) as c:
        before = c.ask(STATUS)["Body"]
        assert c.ask(frame({"Id": "empty", "Topic": topic, "Messages": []})) == {"Id": "empty", "Status": 200, "Accepted": 0}
        after = c.ask(STATUS)["Body"]
        assert counts(after) == counts(before) and after["Rejected"] == before["Rejected"]
        assert c.ask(publish("t", "next"))["Status"] == 200
    sub.wait_messages(1)
    assert sub.payloads() == ["next"]


# --- PROTOCOL §1 MaxFrameBytes ---------------------------------------------------------


def pretty_just_over(limit: int) -> bytes:
    """A pretty-printed publish a few bytes over `limit`, about half of it once compacted."""

    def build(n: int) -> bytes:
        return json.dumps({"Id": 9, "Topic": "n", "Messages": [{"Payload": f"{i:06d}"} for i in range(n)]}, indent=2).encode() + b"\n"

    per_message = len(build(2)) - len(build(1))
    return build((limit - len(build(1))) // per_message + 2)


TOO_BIG = [
    pytest.param(publish("t", "x" * (MAX_FRAME_BYTES * 3), rid=9), id="one long line"),
    pytest.param(b'{"Id":9,"Topic":"t","Messages":[{"Payload":"' + b"x" * (MAX_FRAME_BYTES * 3), id="a string that never ends"),
    pytest.param(
        b'{\n  "Id": 9,\n  "Topic": "t",\n  "Messages": [\n' + b'    {"Payload": 1},\n' * 10000 + b'    {"Payload": 1}\n  ]\n}\n',
        id="a pretty-printed object over many lines",
    ),
    pytest.param(b"[" * (MAX_FRAME_BYTES * 2), id="arrays opened and never closed"),
    pytest.param(pretty_just_over(MAX_FRAME_BYTES), id="pretty-printed just over the limit"),
]


@pytest.mark.parametrize("big", TOO_BIG)
def test_a_frame_over_max_frame_bytes_gets_413_without_id_after_earlier_replies_then_the_connection_closes(broker, big):
    b, sub = broker
    earlier = publish("t", "before", rid=1) + frame({"Id": 2, "Command": "STATUS"})
    with Conn(b.socket) as c:
        sender = c.send_in_background(earlier + big + publish("t", "after", rid=3), shut_write=True)
        replies = c.replies_until_closed()
        sender.join(WAIT_S)
    assert [(r.get("Id"), r["Status"]) for r in replies] == [(1, 200), (2, 200), (None, 413)], replies
    assert "MaxFrameBytes" in replies[2]["Error"]
    assert b.alive()
    with b.client() as client:
        client.publish("t", [{"Payload": "marker"}])
    sub.wait_messages(2)
    assert sub.payloads() == ["before", "marker"]


def test_a_frame_just_under_max_frame_bytes_is_read_like_any_other(broker):
    b, sub = broker
    messages = [{"Payload": f"{i:04d}" + "x" * 990} for i in range(64)]
    data = frame({"Id": "big", "Topic": "t", "Messages": messages})
    assert MAX_FRAME_BYTES - 4096 < len(data) < MAX_FRAME_BYTES
    with Conn(b.socket) as c:
        assert c.ask(data) == {"Id": "big", "Status": 200, "Accepted": 64}
    assert sub.wait_messages(64) and sub.payloads() == [m["Payload"] for m in messages]


# --- half frames -------------------------------------------------------------------------

WHOLE = publish("t", "half")
PRETTY = json.dumps({"Id": "h", "Topic": "t", "Messages": [{"Payload": "half"}]}, indent=2).encode()


@pytest.mark.parametrize(
    "partial",
    [WHOLE[: len(WHOLE) // 2], WHOLE[:-2], PRETTY[: len(PRETTY) // 2], PRETTY[:-1]],
    ids=["half a line", "all but the last brace", "half a pretty-printed object", "a pretty-printed object without its brace"],
)
def test_a_client_that_closes_in_the_middle_of_a_frame_stores_nothing_and_gets_no_reply(broker, partial):
    b, sub = broker
    before = b.status()
    with Conn(b.socket) as c:
        c.send(partial)
        c.sock.shutdown(socket.SHUT_WR)
        assert c.replies_until_closed() == []
    after = b.status()
    assert counts(after) == counts(before) and after["Rejected"] == before["Rejected"]
    with b.client() as client:
        client.publish("t", [{"Payload": "marker"}])
    sub.wait_messages(1)
    assert sub.payloads() == ["marker"]


def test_a_client_stalled_in_the_middle_of_a_frame_does_not_delay_other_clients(broker):
    b, sub = broker
    whole = publish("t", "stalled", rid="stalled")
    with Conn(b.socket) as stalled, Conn(b.socket) as other:
        stalled.send(whole[: len(whole) // 2])
        started = time.monotonic()
        reply = other.ask(publish("t", "other", rid="other"))
        assert reply["Status"] == 200 and time.monotonic() - started < SLOW_S
        # When the stalled client goes on, its request completes normally
        assert stalled.ask(whole[len(whole) // 2 :]) == {"Id": "stalled", "Status": 200, "Accepted": 1}
    sub.wait_messages(2)
    assert sub.payloads() == ["other", "stalled"]


def test_a_client_stalled_in_a_large_frame_while_trickling_newlines_does_not_delay_other_clients(broker_factory):
    # Given a broker with the default MaxFrameBytes (16 MiB) and a client 6 MB into one frame
    b = broker_factory(TOPICS, ["s"])
    prefix = b'{"Id":"big","Topic":"n","Messages":[' + b'{"Payload":"x"},' * 400_000
    stop = threading.Event()
    with Conn(b.socket) as stalled, Conn(b.socket) as other:
        stalled.send(prefix)

        def trickle() -> None:  # whitespace inside an object: still the same, valid, unfinished frame
            while not stop.wait(0.01):
                stalled.send(b"\n")

        trickling = threading.Thread(target=trickle, daemon=True)
        trickling.start()
        try:
            # When another client publishes for a few seconds meanwhile
            worst, until = 0.0, time.monotonic() + 3.0
            while time.monotonic() < until and worst < SLOW_S:
                started = time.monotonic()
                assert other.ask(publish("t", "other"))["Status"] == 200
                worst = max(worst, time.monotonic() - started)
        finally:
            stop.set()
            trickling.join(WAIT_S)
    # Then no publish waited on the stalled frame
    assert worst < SLOW_S, f"a publish took {worst:.2f}s"


# --- many connections ----------------------------------------------------------------------

CHURN = [b"", b"", b"garbage\n", b'{"Topic":"t","Messages":[{"Pay', b'{"Id":1,"Command":"STATUS"}\n']


def test_thousands_of_connections_leave_the_broker_serving_and_its_descriptors_released(broker):
    b, sub = broker
    pid = b.proc.pid
    with Conn(b.socket) as c:  # once `s` has a message, its delivery connection is among the baseline
        assert c.ask(publish("t", "first"))["Status"] == 200
    sub.wait_messages(1)
    before = b.status()
    baseline = settled_fd_count(pid)
    garbage = 0
    # 2000 connections one after the other; some send garbage, half frames or a request
    for i in range(2000):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(b.socket)
        s.sendall(CHURN[i % len(CHURN)])
        garbage += CHURN[i % len(CHURN)] == b"garbage\n"
        s.close()
    # 200 held open at once, the same mix
    held = [Conn(b.socket) for _ in range(200)]
    for i, c in enumerate(held):
        c.send(CHURN[i % len(CHURN)])
        garbage += CHURN[i % len(CHURN)] == b"garbage\n"
    wait_for(lambda: fd_count(pid) >= baseline + 200, what="the broker to hold 200 more descriptors")
    with Conn(b.socket) as c:
        assert c.ask(publish("t", "while held"))["Status"] == 200
    for c in held:
        c.close()
    try:
        wait_for(lambda: fd_count(pid) <= baseline, what=f"descriptors back to {baseline}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: have {fd_count(pid)}; broker log:\n{b.log[-3000:]}") from None
    wait_for(lambda: b.status()["Rejected"] == before["Rejected"] + garbage, what=f"{garbage} rejected")
    with Conn(b.socket) as c:
        assert c.ask(publish("t", "after"))["Status"] == 200
    sub.wait_messages(3)
    assert sub.payloads() == ["first", "while held", "after"]
    assert b.alive()


# --- framing that Go's json.Decoder accepts (PROTOCOL §1) -----------------------------------

PAYLOADS = [{"a": [1, 2], "s": "x } { y"}, "}{", ["{", "[", '"}']]


def as_requests(keys: tuple[str, str, str, str] = ("Id", "Topic", "Messages", "Payload")) -> list[dict]:
    rid, topic, messages, payload = keys
    return [{rid: i, topic: "t", messages: [{payload: p}]} for i, p in enumerate(PAYLOADS)]


FRAMINGS = [
    pytest.param(b"\n".join(json.dumps(r, indent=2).encode() for r in as_requests()) + b"\n", 1 << 16, id="pretty-printed"),
    pytest.param(b"".join(json.dumps(r).encode() for r in as_requests()) + b"\n", 1 << 16, id="several objects on one line"),
    pytest.param(b" \t ".join(json.dumps(r).encode() for r in as_requests()) + b"\r\n", 1 << 16, id="objects separated by blanks"),
    pytest.param(
        b"\n".join(json.dumps(r, indent="\t").encode() for r in as_requests(("id", "topic", "messages", "payload"))),
        1 << 16,
        id="Go's lower-case keys, tab-indented, no final newline",
    ),
    pytest.param(b"".join(frame(r) for r in as_requests()), 1, id="lines sent one byte at a time"),
    pytest.param(b"\n".join(json.dumps(r, indent=1).encode() for r in as_requests()) + b"\n", 7, id="pretty-printed in 7-byte pieces"),
]


@pytest.mark.parametrize(("data", "piece"), FRAMINGS)
def test_pretty_printed_and_concatenated_objects_are_each_read_and_answered(broker, data, piece):
    b, sub = broker
    with Conn(b.socket) as c:
        for i in range(0, len(data), piece):
            c.send(data[i : i + piece])
        replies = [c.reply() for _ in PAYLOADS]
    assert replies == [{"Id": i, "Status": 200, "Accepted": 1} for i in range(len(PAYLOADS))]
    sub.wait_messages(len(PAYLOADS))
    assert sub.payloads() == PAYLOADS


def test_a_client_that_shuts_its_write_side_still_receives_every_reply_before_the_broker_closes(broker):
    b, _ = broker
    n = 2000
    data = b"".join(publish("n", i, rid=i) for i in range(n)).rstrip(b"\n")  # the last one unterminated
    with Conn(b.socket) as c:
        sender = c.send_in_background(data, shut_write=True)
        replies = c.replies_until_closed()
        sender.join(WAIT_S)
    assert sorted(r["Id"] for r in replies) == list(range(n))
    assert {r["Status"] for r in replies} == {200}
    assert b.status()["Topics"]["n"]["Published"] == n
