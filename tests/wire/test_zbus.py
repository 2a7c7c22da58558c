"""The zbus listener (PROTOCOL §11) against a real `ppmq serve`: curl over the
Unix socket for HTTP, websocket-client (what the published zbus Python client
uses) for WebSocket, and raw bytes for what no client would send."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlencode

import pytest
import websocket

from tests.conftest import WAIT_S, BrokerProcess, wait_for
from tests.wire.test_systemd_broker import _can_connect


def zbus_broker(broker_factory, short_tmp: Path, **extra) -> BrokerProcess:
    """Topic `q` with the Pull subscribers (zbus channels) `w` (ZbusAck window),
    `e` (explicit) and `d` (delivery), and `plain`, which has no channel."""
    topics = [{"Name": "q", "Subscribers": ["w", "e", "d"]}, {"Name": "plain"}]
    subs = [
        {"Name": "w", "Pull": True, "Socket": None},
        {"Name": "e", "Pull": True, "Socket": None, "ZbusAck": "explicit"},
        {"Name": "d", "Pull": True, "Socket": None, "ZbusAck": "delivery"},
    ]
    b = broker_factory(topics, subs, ZbusSocket=str(short_tmp / "zbus.sock"), **extra)
    wait_for(lambda: _can_connect(b.config["ZbusSocket"]), what="ZbusSocket")
    return b


def curl(b: BrokerProcess, url: str, *args: str, tcp: bool = False) -> tuple[int, object]:
    """One request with curl over ZbusSocket (ZbusListen if `tcp`): the
    response's status and its body as JSON."""
    where = [f"http://127.0.0.1:{b.port}{url}"] if tcp else ["--unix-socket", b.config["ZbusSocket"], f"http://localhost{url}"]
    out = subprocess.run(
        ["curl", "-sS", "-w", "\n%{http_code}", *args, *where],
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=True,
    ).stdout
    body, _, code = out.rpartition("\n")
    return int(code), json.loads(body) if body else None


def ws(b: BrokerProcess) -> websocket.WebSocket:
    """A WebSocket to ZbusSocket, as zbuspy opens one (websocket-client), over a Unix socket."""
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(b.config["ZbusSocket"])
    return websocket.create_connection("ws://localhost/", socket=sock, timeout=WAIT_S)


def ask(conn: websocket.WebSocket, headers: dict, body=None) -> dict:
    message = {"headers": headers} | ({"body": body} if body is not None else {})
    conn.send(json.dumps(message))
    return json.loads(conn.recv())


def raw(b: BrokerProcess, data: bytes, end: bool = False) -> bytes:
    """Send bytes on a connection of their own (`end`: then close the write
    side, as a client that has said all it will); all the broker answers until it closes."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(WAIT_S)
        s.connect(b.config["ZbusSocket"])
        try:
            s.sendall(data)
            if end:
                s.shutdown(socket.SHUT_WR)
        except OSError:  # the broker answered and closed before it read everything: its answer is still there
            pass
        got = b""
        try:
            while chunk := s.recv(65536):
                got += chunk
        except ConnectionResetError:  # it closed with bytes of ours unread
            pass
        return got


def payloads(b: BrokerProcess, topic: str, channel: str = "w") -> list:
    """What channel `channel` of `topic` has ready or in flight, oldest first."""
    with b.client() as c:
        request = {"Command": "PEEK", "Topic": topic, "Subscriber": channel, "Id": 1}
        return [m["Payload"] for m in c.request(request).body["Messages"]]


# --- HTTP with curl -----------------------------------------------------------------------------


def test_curl_publishes_with_headers_and_with_the_query_string(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp)
    assert curl(b, "/", "-H", "cmd: pub", "-H", "MQ: q", "-d", "hello") == (200, None)
    assert curl(b, "/", "-H", "cmd: pub", "-H", "mq: q", "-H", "content-type: application/json", "-d", '{"n": 1}') == (200, None)
    assert curl(b, "/?cmd=pub&mq=q&body=from%20the%20query") == (200, None)
    assert payloads(b, "q") == ["hello", {"n": 1}, "from the query"]


def test_a_body_curl_sends_after_expect_100_continue_is_not_kept_waiting(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp)
    started = time.monotonic()
    assert curl(b, "/", "-H", "cmd: pub", "-H", "mq: q", "-H", "Expect: 100-continue", "-d", "x" * 5000) == (200, None)
    assert time.monotonic() - started < 0.9  # curl waits 1s for a 100 Continue that does not come
    assert payloads(b, "q") == ["x" * 5000]


def test_curl_takes_with_604_when_empty_and_queries_the_counts(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp)
    assert curl(b, "/?cmd=take&mq=q&channel=d") == (604, [])
    curl(b, "/?cmd=pub&mq=q&body=one")
    curl(b, "/?cmd=pub&mq=q&body=two")
    status, taken = curl(b, "/", "-H", "cmd: take", "-H", "mq: q", "-H", "channel: d", "-H", "window: 5")
    assert status == 200
    assert [m["body"] for m in taken] == ["one", "two"]
    assert [(m["headers"]["mq"], m["headers"]["channel"]) for m in taken] == [("q", "d")] * 2
    # ZbusAck: delivery acked them as they were sent
    assert curl(b, "/?cmd=query&mq=q&channel=d") == (200, {"name": "d", "offset": 2, "mask": 0, "filter": None})
    status, info = curl(b, "/?cmd=query&mq=q")
    assert status == 200 and info["name"] == "q" and info["type"] == "disk" and info["size"] == 2
    assert [c["name"] for c in info["channels"]] == ["w", "e", "d"]
    assert curl(b, "/?cmd=query&mq=nope")[0] == 404


def test_create_and_remove_answer_from_the_config_and_change_nothing(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp)
    assert curl(b, "/?cmd=create&mq=q&channel=w")[0] == 200
    assert curl(b, "/?cmd=remove&mq=q")[0] == 200
    assert curl(b, "/?cmd=create&mq=new")[0] == 404
    assert curl(b, "/?cmd=create&mq=q&channel=new")[0] == 404
    assert set(b.status()["Topics"]) == {"q", "plain"}


def test_an_unknown_command_is_404_and_a_missing_mq_or_channel_400(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp)
    assert curl(b, "/?cmd=frobnicate&mq=q") == (404, "Command(frobnicate) Not Found")
    assert curl(b, "/?cmd=pub")[0] == 400
    assert curl(b, "/?cmd=take&mq=q")[0] == 400
    assert curl(b, "/?cmd=take&mq=plain&channel=plain")[0] == 404


def test_one_http_connection_serves_several_requests(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp)
    request = b"GET /?cmd=pub&mq=q&body=%d HTTP/1.1\r\nHost: x\r\n\r\n"
    got = raw(b, request % 1 + request % 2 + b"GET /?cmd=query&mq=q HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert got.count(b"HTTP/1.1 200") == 3
    assert payloads(b, "q") == ["1", "2"]


# --- WebSocket ----------------------------------------------------------------------------------


def test_websocket_publishes_takes_and_acks_with_replies_matched_by_id(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp)
    conn = ws(b)
    try:
        assert ask(conn, {"cmd": "pub", "mq": "q", "id": "p1"}, {"a": [1, 2]}) == {"headers": {"id": "p1"}, "status": 200, "body": None}
        assert ask(conn, {"CMD": "pub", "Mq": "q", "id": 7}, "second")["headers"] == {"id": 7}
        reply = ask(conn, {"cmd": "take", "mq": "q", "channel": "e", "window": 2, "id": "t1"})
        assert reply["status"] == 200 and reply["headers"]["id"] == "t1"
        assert [m["body"] for m in reply["body"]] == [{"a": [1, 2]}, "second"]
        ids = [m["headers"]["id"] for m in reply["body"]]
        assert b.sub_status("q", "e")["InFlight"] == 2
        assert ask(conn, {"cmd": "ack", "mq": "q", "channel": "e", "ids": ",".join(ids), "id": "a1"})["status"] == 200
        assert b.sub_status("q", "e")["Acked"] == 2
        assert ask(conn, {"cmd": "take", "mq": "q", "channel": "e", "id": "t2"}) == {"headers": {"id": "t2"}, "status": 604, "body": []}
    finally:
        conn.close()


def test_window_mode_acks_what_a_connection_took_at_its_next_take(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp)
    for n in range(3):
        curl(b, f"/?cmd=pub&mq=q&body={n}")
    conn = ws(b)
    try:
        assert [m["body"] for m in ask(conn, {"cmd": "take", "mq": "q", "channel": "w"})["body"]] == ["0"]
        assert b.sub_status("q", "w")["Acked"] == 0
        assert [m["body"] for m in ask(conn, {"cmd": "take", "mq": "q", "channel": "w", "window": "2"})["body"]] == ["1", "2"]
        assert b.sub_status("q", "w")["Acked"] == 1
    finally:
        conn.close()
    # the two it had not acked are ready again once it is gone
    wait_for(lambda: b.sub_status("q", "w")["InFlight"] == 0, what="messages given back")
    assert sum(b.sub_status("q", "w")["Ready"]) == 2


def test_ping_is_not_answered_and_the_connection_stays_open(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp)
    conn = ws(b)
    try:
        conn.send(json.dumps({"headers": {"cmd": "ping", "id": "x"}}))
        assert ask(conn, {"cmd": "query", "mq": "q", "id": "after"})["headers"] == {"id": "after"}
        conn.send(json.dumps({"headers": {"cmd": "pub", "mq": "q", "ack": False}, "body": 1}))
        assert ask(conn, {"cmd": "query", "mq": "q", "id": "n"})["body"]["size"] == 1
    finally:
        conn.close()


# --- bad input ----------------------------------------------------------------------------------


def _still_serving(b: BrokerProcess) -> None:
    assert b.alive()
    assert curl(b, "/?cmd=query&mq=plain")[0] == 200


def test_malformed_http_is_answered_400_closes_that_connection_and_counts_in_rejected(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp)
    other = ws(b)
    try:
        before = b.status()["Rejected"]
        assert raw(b, b"NOT HTTP AT ALL\r\n\r\n").startswith(b"HTTP/1.1 400")
        assert raw(b, b"GET / HTTP/1.1\r\nbad header line\r\n\r\n").startswith(b"HTTP/1.1 400")
        assert raw(b, b"\x00\xff" * 100 + b"\r\n\r\n").startswith(b"HTTP/1.1 400")
        assert raw(
            b, b"POST /?cmd=pub&mq=q HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 3\r\n\r\n{x}"
        ).startswith(b"HTTP/1.1 400")
        wait_for(lambda: b.status()["Rejected"] == before + 4, what="4 rejected")
        assert ask(other, {"cmd": "query", "mq": "q", "id": 1})["status"] == 200  # the other connection is still served
        _still_serving(b)
    finally:
        other.close()


def test_an_http_body_or_header_over_the_limits_is_refused(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp, MaxFrameBytes="1KiB")
    huge = b"POST /?cmd=pub&mq=q HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
    assert raw(b, huge + b"x" * 2000).startswith(b"HTTP/1.1 413")
    assert raw(b, b"GET / HTTP/1.1\r\nX: " + b"y" * 100_000 + b"\r\n\r\n").startswith(b"HTTP/1.1 4")
    assert payloads(b, "q") == []
    _still_serving(b)


def test_garbage_or_oversized_websocket_frames_close_that_connection_only(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp, MaxFrameBytes="1KiB")
    before = b.status()["Rejected"]
    cases = [
        lambda c: c.send("not json"),
        lambda c: c.send(json.dumps({"headers": {"cmd": {"nested": 1}}})),
        lambda c: c.send_binary(b"\x00\x01"),
        lambda c: c.send(json.dumps({"headers": {"cmd": "pub", "mq": "q"}, "body": "x" * 5000})),
        lambda c: c.sock.sendall(b"\x8f\x80\x00\x00\x00\x00"),  # unmasked reserved opcode
    ]
    for case in cases:
        conn = ws(b)
        case(conn)
        with pytest.raises((websocket.WebSocketConnectionClosedException, ConnectionError)):
            for _ in range(3):
                if conn.recv_data()[0] == websocket.ABNF.OPCODE_CLOSE:
                    raise websocket.WebSocketConnectionClosedException("closed")
        conn.close()
    wait_for(lambda: b.status()["Rejected"] == before + len(cases), what="each bad frame rejected")
    assert payloads(b, "q") == []
    _still_serving(b)


def test_a_request_that_does_not_arrive_whole_within_read_timeout_closes_its_connection(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp, ReadTimeout="300ms")
    started = time.monotonic()
    assert raw(b, b"GET /?cmd=query&mq=q HTTP/1.1\r\nHost: x\r\n").startswith(b"HTTP/1.1 400")
    assert time.monotonic() - started < WAIT_S
    _still_serving(b)


def test_connections_count_toward_max_connections(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp, MaxConnections=2)
    first, second = ws(b), ws(b)
    try:
        assert raw(b, b"GET /?cmd=query&mq=q HTTP/1.1\r\nHost: x\r\n\r\n") == b""
    finally:
        first.close()
        second.close()
    wait_for(lambda: _served(b), what="a connection admitted again")


def _served(b: BrokerProcess) -> bool:
    try:
        return curl(b, "/?cmd=query&mq=plain")[0] == 200
    except subprocess.CalledProcessError:
        return False


def test_a_websocket_frame_that_does_not_arrive_whole_within_read_timeout_closes_its_connection(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp, ReadTimeout="300ms")
    conn = ws(b)
    before = b.status()["Rejected"]
    conn.sock.sendall(b"\x81\x85\x00\x00\x00\x00ab")  # a masked text frame of 5 bytes, 2 of them sent
    with pytest.raises((websocket.WebSocketConnectionClosedException, ConnectionError)):
        for _ in range(3):
            if conn.recv_data()[0] == websocket.ABNF.OPCODE_CLOSE:
                raise websocket.WebSocketConnectionClosedException("closed")
    conn.close()
    wait_for(lambda: b.status()["Rejected"] == before + 1, what="the partial frame rejected")


def test_a_websocket_ping_is_answered_and_a_peer_that_just_goes_away_is_not_rejected(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp)
    before = b.status()["Rejected"]
    conn = ws(b)
    conn.ping(b"hi")
    opcode, frame = conn.recv_data_frame(True)
    assert (opcode, frame.data) == (websocket.ABNF.OPCODE_PONG, b"hi")
    conn.sock.close()
    wait_for(
        lambda: "ZbusSocket" not in b.status()["Listeners"] or b.status()["Listeners"]["ZbusSocket"]["Connections"] == 0, what="closed"
    )
    assert b.status()["Rejected"] == before


# --- sub ----------------------------------------------------------------------------------------


def test_sub_pushes_while_it_has_credit_and_a_later_sub_refreshes_it_unanswered(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp)
    for n in range(3):
        curl(b, f"/?cmd=pub&mq=q&body={n}")
    conn = ws(b)
    try:
        assert ask(conn, {"cmd": "sub", "mq": "q", "channel": "w", "window": 2, "id": "s1"}) == {
            "headers": {"id": "s1"},
            "status": 200,
            "body": None,
        }
        pushed = [json.loads(conn.recv()) for _ in range(2)]
        assert [(m["body"], m["headers"]["window"], m["headers"]["mq"], m["headers"]["channel"]) for m in pushed] == [
            ("0", 1, "q", "w"),
            ("1", 0, "q", "w"),
        ]
        # no credit left: the third waits, in the channel's ready messages
        assert b.settled_status()["Topics"]["q"]["Subscribers"]["w"]["InFlight"] == 2
        conn.send(json.dumps({"headers": {"cmd": "sub", "mq": "q", "channel": "w", "window": "2", "ack": False}}))
        third = json.loads(conn.recv())
        assert (third["body"], third["headers"]["window"]) == ("2", 1)
        # ZbusAck: window acked the first two at the refresh
        assert b.sub_status("q", "w")["Acked"] == 2
        curl(b, "/?cmd=pub&mq=q&body=later")
        assert json.loads(conn.recv())["body"] == "later"  # pushed as it comes, while credit lasts
    finally:
        conn.close()
    wait_for(lambda: b.sub_status("q", "w")["InFlight"] == 0, what="what it held given back")
    assert sum(b.sub_status("q", "w")["Ready"]) == 2


def test_a_push_never_carries_the_id_of_a_request_still_waiting_for_its_reply(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp)
    conn = ws(b)
    try:
        ask(conn, {"cmd": "sub", "mq": "q", "channel": "w", "window": 5, "id": "s"})
        for n in range(1, 6):
            # the broker numbers the messages of a topic without Dedupe 1, 2...: the
            # message's id is the request's, so its push waits for the reply
            conn.send(json.dumps({"headers": {"cmd": "pub", "mq": "q", "id": str(n)}, "body": n}))
            first, second = json.loads(conn.recv()), json.loads(conn.recv())
            assert (first["headers"]["id"], first.get("status")) == (str(n), 200)
            assert (second["headers"]["id"], second["body"], "status" in second) == (str(n), n, False)
    finally:
        conn.close()


def test_sub_over_plain_http_is_400(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp)
    assert curl(b, "/?cmd=sub&mq=q&channel=w")[0] == 400


# --- the published zbus Python client -------------------------------------------------------------


@pytest.fixture
def zbuspy(monkeypatch):
    """zbuspy 1.2.0's MqClient, its WebSocket opened over a Unix socket: the
    client knows only ws://HOST:PORT, so its WebSocketApp gets a socket that
    is already connected to ZbusSocket."""
    zbus = pytest.importorskip("zbus.zbus")
    clients = []

    def client(b: BrokerProcess):
        def app(url, **kw):
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(b.config["ZbusSocket"])
            return websocket.WebSocketApp(url, socket=sock, **kw)

        monkeypatch.setattr(zbus, "WebSocketApp", app)
        c = zbus.MqClient("localhost")
        c.heartbeat_interval = 0.1
        clients.append(c)
        return c

    yield client
    for c in clients:
        c.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # zbuspy's threading calls
def test_zbuspy_publishes_subscribes_takes_and_queries(broker_factory, short_tmp, zbuspy):
    b = zbus_broker(broker_factory, short_tmp)
    client = zbuspy(b)
    client.connect()
    for n in range(4):
        res = client.invoke({"headers": {"cmd": "pub", "mq": "q"}, "body": {"n": n}})
        assert res.status == 200
    res = client.invoke({"headers": {"cmd": "query", "mq": "q"}})
    assert (res.status, res.body["size"]) == (200, 4)
    res = client.invoke({"headers": {"cmd": "take", "mq": "q", "channel": "e", "window": 3}})
    assert res.status == 200 and [m["body"] for m in res.body] == [{"n": 0}, {"n": 1}, {"n": 2}]
    got = []
    client.add_mq_handler(mq="q", channel="w", handler=lambda msg: got.append(msg.body), window=2)
    res = client.invoke({"headers": {"cmd": "sub", "mq": "q", "channel": "w", "window": 2}})
    assert res.status == 200
    wait_for(lambda: len(got) == 4, what="4 messages through the handler")
    assert got == [{"n": n} for n in range(4)]
    wait_for(lambda: b.sub_status("q", "w")["Acked"] >= 2, what="acked at the window refreshes")
    time.sleep(0.3)  # heartbeats (ping) go unanswered and keep the connection
    res = client.invoke({"headers": {"cmd": "query", "mq": "q", "channel": "w"}})
    assert res.status == 200 and res.body["name"] == "w"


# --- ZbusListen and signatures ------------------------------------------------------------------

SECRET = "s3cret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tcp_broker(broker_factory, short_tmp: Path, **extra) -> BrokerProcess:
    """zbus_broker with ZbusListen too, and the key `k` of root."""
    port = free_port()
    keys = [{"ApiKey": "k", "Secret": SECRET, "User": "root"}]
    b = zbus_broker(broker_factory, short_tmp, ZbusListen=f"127.0.0.1:{port}", ZbusKeys=keys, **extra)
    b.port = port
    wait_for(lambda: _tcp_accepting(port), what="ZbusListen")
    return b


def _tcp_accepting(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def signed(message: dict, api_key: str = "k", secret: str = SECRET, fields: str = "h.*,body") -> dict:
    """The message signed as zbuspy 1.2.0 signs it (its sign_message, written out)."""
    headers = {**message["headers"], "apiKey": api_key, "signFields": fields}
    covered = {"headers": {"apiKey": api_key, "signFields": fields}}
    for field in fields.split(","):
        if field == "h.*":
            covered["headers"].update(headers)
        elif field.startswith("h."):
            covered["headers"][field[2:]] = headers.get(field[2:])
        elif field in message:
            covered[field] = message[field]
    text = json.dumps(covered, separators=(",", ":"), sort_keys=True)
    headers["signature"] = hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest().upper()
    return {**message, "headers": headers}


def tcp_ws(b: BrokerProcess) -> websocket.WebSocket:
    return websocket.create_connection(f"ws://127.0.0.1:{b.port}/", timeout=WAIT_S)


def test_zbus_listen_serves_signed_requests_and_refuses_the_others_403(broker_factory, short_tmp):
    b = tcp_broker(broker_factory, short_tmp)
    conn = tcp_ws(b)
    try:
        pub = {"headers": {"cmd": "pub", "mq": "q", "id": "1"}, "body": {"text": "grüße"}}
        conn.send(json.dumps(signed(pub)))
        assert json.loads(conn.recv())["status"] == 200
        assert ask(conn, {"cmd": "pub", "mq": "q", "id": "2"}, "unsigned")["status"] == 403
        conn.send(json.dumps(signed(pub, secret="wrong")))
        assert json.loads(conn.recv())["status"] == 403
        conn.send(json.dumps(signed(pub, api_key="nobody")))
        assert json.loads(conn.recv())["status"] == 403
        tampered = signed(pub)
        tampered["body"] = "changed"
        conn.send(json.dumps(tampered))
        assert json.loads(conn.recv())["status"] == 403
        conn.send(json.dumps({"headers": {"cmd": "ping"}}))  # unsigned ping: no reply, the connection stays
        take = signed({"headers": {"cmd": "take", "mq": "q", "channel": "d", "id": "t"}}, fields="h.cmd,h.mq,h.channel,h.id")
        conn.send(json.dumps(take))
        reply = json.loads(conn.recv())
        assert (reply["headers"]["id"], reply["status"], [m["body"] for m in reply["body"]]) == ("t", 200, [{"text": "grüße"}])
    finally:
        conn.close()
    assert payloads(b, "q") == [{"text": "grüße"}]


def test_curl_over_tcp_with_a_signed_query_string(broker_factory, short_tmp):
    b = tcp_broker(broker_factory, short_tmp)
    message = signed({"headers": {"cmd": "pub", "mq": "q"}, "body": "via tcp"}, fields="h.cmd,h.mq,body")
    query = urlencode({**message["headers"], "body": message["body"]})
    assert curl(b, f"/?{query}", tcp=True) == (200, None)
    assert curl(b, "/?cmd=query&mq=q", tcp=True)[0] == 403
    assert payloads(b, "q") == ["via tcp"]


def test_a_signed_request_on_zbus_socket_is_judged_as_its_keys_user(broker_factory, short_tmp):
    port = free_port()
    keys = [{"ApiKey": "k", "Secret": SECRET, "User": "nobody"}]
    topics = [{"Name": "q", "Subscribers": ["w"], "Publishers": ["root"]}]
    subs = [{"Name": "w", "Pull": True, "Socket": None}]
    b = broker_factory(topics, subs, ZbusSocket=str(short_tmp / "zbus.sock"), ZbusListen=f"127.0.0.1:{port}", ZbusKeys=keys)
    wait_for(lambda: _can_connect(b.config["ZbusSocket"]), what="ZbusSocket")
    conn = ws(b)
    try:
        pub = {"headers": {"cmd": "pub", "mq": "q", "id": "1"}, "body": 1}
        assert ask(conn, pub["headers"], 1)["status"] == 200  # root, by its credentials
        conn.send(json.dumps(signed(pub)))
        assert json.loads(conn.recv())["status"] == 403  # nobody, by its key: not among Publishers
    finally:
        conn.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # zbuspy's threading calls
def test_zbuspy_signs_its_requests_over_tcp(broker_factory, short_tmp):
    zbus = pytest.importorskip("zbus.zbus")
    b = tcp_broker(broker_factory, short_tmp)
    client = zbus.MqClient(f"127.0.0.1:{b.port}")
    client.enable_auth("k", SECRET)
    client.sign_fields = "h.*,body"
    # its sign_message deletes a signature header that must exist
    client.before_send = lambda msg: msg.headers.__setitem__("signature", None)
    try:
        client.connect()
        res = client.invoke({"headers": {"cmd": "pub", "mq": "q"}, "body": "signed by zbuspy"})
        assert res.status == 200
        res = client.invoke({"headers": {"cmd": "take", "mq": "q", "channel": "d"}})
        assert res.status == 200 and [m["body"] for m in res.body] == ["signed by zbuspy"]
        for n in range(3):
            client.invoke({"headers": {"cmd": "pub", "mq": "q"}, "body": n})
        got = []
        client.add_mq_handler(mq="q", channel="w", handler=lambda msg: got.append(msg.body), window=2)
        res = client.invoke({"headers": {"cmd": "sub", "mq": "q", "channel": "w", "window": 2}})
        assert res.status == 200
        wait_for(lambda: len(got) == 4, what="4 messages through the handler, the window refreshed signed")
    finally:
        client.close()


# --- crashes ------------------------------------------------------------------------------------


def test_kill_9_with_messages_in_flight_to_a_zbus_consumer_loses_none(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp)
    for n in range(5):
        assert curl(b, f"/?cmd=pub&mq=q&body={n}")[0] == 200  # answered once committed
    conn = ws(b)
    ask(conn, {"cmd": "sub", "mq": "q", "channel": "w", "window": 3})
    assert [json.loads(conn.recv())["body"] for _ in range(3)] == ["0", "1", "2"]
    b.kill()
    conn.close()
    b.start()
    wait_for(lambda: _can_connect(b.config["ZbusSocket"]), what="ZbusSocket")
    status, taken = curl(b, "/?cmd=take&mq=q&channel=w&window=10")
    assert status == 200 and sorted(m["body"] for m in taken) == ["0", "1", "2", "3", "4"]


def test_a_consumer_that_dies_mid_stream_gives_its_messages_back(broker_factory, short_tmp):
    b = zbus_broker(broker_factory, short_tmp)
    for n in range(4):
        curl(b, f"/?cmd=pub&mq=q&body={n}")
    conn = ws(b)
    ask(conn, {"cmd": "sub", "mq": "q", "channel": "e", "window": 4})
    assert len([conn.recv() for _ in range(4)]) == 4
    assert b.sub_status("q", "e")["InFlight"] == 4
    conn.sock.close()  # no close frame: the process is gone
    wait_for(lambda: b.sub_status("q", "e")["InFlight"] == 0, what="its messages given back")
    assert sum(b.sub_status("q", "e")["Ready"]) == 4


def test_a_reload_changes_zbus_keys_without_dropping_a_connection(broker_factory, short_tmp):
    b = tcp_broker(broker_factory, short_tmp)
    conn = tcp_ws(b)
    try:
        pub = {"headers": {"cmd": "pub", "mq": "q", "id": "1"}, "body": "x"}
        conn.send(json.dumps(signed(pub, api_key="new", secret="fresh")))
        assert json.loads(conn.recv())["status"] == 403
        b.reload({**b.config, "ZbusKeys": [{"ApiKey": "new", "Secret": "fresh", "User": "root"}]})
        wait_for(lambda: "config reloaded" in b.log, what="the reload")
        conn.send(json.dumps(signed(pub, api_key="new", secret="fresh")))
        assert json.loads(conn.recv())["status"] == 200
        conn.send(json.dumps(signed(pub)))  # the old key is gone
        assert json.loads(conn.recv())["status"] == 403
    finally:
        conn.close()
