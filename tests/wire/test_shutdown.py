"""SIGTERM: stop accepting, finish what is committed, answer it, exit 0 promptly."""

from __future__ import annotations

import socket
import threading
import time

import msgspec

from ..conftest import Subscriber, wait_for


def test_sigterm_with_idle_clients_connected_exits_0_at_once(broker_factory):
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"])
    idle = [socket.socket(socket.AF_UNIX) for _ in range(5)]
    for s in idle:
        s.connect(b.socket)
    started = time.monotonic()
    assert b.stop() == 0
    assert time.monotonic() - started < 2.0
    for s in idle:
        assert s.recv(100) == b""  # closed by the broker
        s.close()


def test_every_request_answered_200_before_a_sigterm_is_kept_and_later_ones_get_503_or_nothing(broker_factory):
    # Given a producer pipelining requests with Ids as fast as it can
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"])
    conn = socket.socket(socket.AF_UNIX)
    conn.connect(b.socket)
    replies: list[dict] = []
    sent = threading.Event()

    def produce() -> None:
        for i in range(20_000):
            try:
                conn.sendall(msgspec.json.encode({"Id": i, "Topic": "t", "Messages": [{"Payload": i}]}) + b"\n")
            except OSError:
                break
            if i == 500:
                sent.set()

    def read() -> None:
        buf = b""
        try:
            while data := conn.recv(1 << 16):
                buf += data
                *lines, buf = buf.split(b"\n")
                replies.extend(msgspec.json.decode(line) for line in lines)
        except ConnectionResetError:
            pass  # the broker closed with requests of ours unread: they were never accepted

    threads = [threading.Thread(target=produce), threading.Thread(target=read)]
    for t in threads:
        t.start()
    sent.wait(10)
    wait_for(lambda: len(replies) > 100, what="the first replies")
    # When the broker is told to stop in the middle of it
    assert b.stop() == 0
    for t in threads:
        t.join(10)
    conn.close()
    # Then every reply is 200 or 503, each for a distinct request, and the 200s were all kept
    assert {r["Status"] for r in replies} <= {200, 503}
    ids = [r["Id"] for r in replies]
    assert len(ids) == len(set(ids))
    ok = {r["Id"] for r in replies if r["Status"] == 200}
    b.start()
    assert b.status()["Topics"]["t"]["Stored"] >= len(ok)
    sub = Subscriber(b.sub_socket("s"))
    try:
        wait_for(lambda: ok <= set(sub.payloads()), what=f"{len(ok)} confirmed messages after the restart")
    finally:
        sub.close()
