"""The PHPMQ listener (PROTOCOL §9) against a real `ppmq serve`, through a PHPMQ
client written from the protocol's layout (tests/wire/phpmq_client.py)."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest

from tests.conftest import BrokerProcess, wait_for
from tests.wire import phpmq_client as pm
from tests.wire.phpmq_client import PhpmqClient
from tests.wire.test_cli import ppmq
from tests.wire.test_metrics import metrics_now, value


def phpmq_broker(broker_factory, short_tmp: Path, start: bool = True, dispatch_ttl: bool = False, **extra) -> BrokerProcess:
    """Queue `q` (topic q, Expire, a DeadLetter `dead`) consumed through the Pull
    subscriber `w`, its dispatches with a TTL packet if `dispatch_ttl`."""
    q = {"Name": "q", "Subscribers": ["w"], "PhpmqSubscriber": "w", "Expire": True, "DeadLetter": "dead"}
    topics = [
        q | {"PhpmqDispatchTTL": True} if dispatch_ttl else q,
        {"Name": "dead", "Subscribers": ["d"], "PhpmqSubscriber": "d"},
        {"Name": "plain"},
    ]
    subs = [{"Name": "w", "Pull": True, "Socket": None}, {"Name": "d", "Pull": True, "Socket": None}]
    b = broker_factory(topics, subs, start=start, PhpmqSocket=str(short_tmp / "phpmq.sock"), **extra)
    if start:  # bound just after ServerSocket, which is what broker_factory waits for
        wait_for(lambda: _accepting(b.config["PhpmqSocket"]), what="PhpmqSocket")
    return b


def _accepting(path: str) -> bool:
    try:
        PhpmqClient(path).close()
        return True
    except OSError:
        return False


def phpmq(b: BrokerProcess) -> PhpmqClient:
    return PhpmqClient(b.config["PhpmqSocket"])


def peek(b: BrokerProcess, topic: str) -> list[dict]:
    with b.client() as c:
        return c.request({"Command": "PEEK", "Topic": topic, "Id": 1}).body["Messages"]


def rejected(b: BrokerProcess) -> int:
    return b.status()["Rejected"]


def sent(b: BrokerProcess, *frames: bytes) -> None:
    """Send frames on a connection of their own, and know they are committed: a
    bad frame after them is read only once they are, and closes the connection."""
    with phpmq(b) as c:
        c.write(b"".join(frames) + b"X0000000")
        assert c.closed_by_peer()


# --- 001: send ---------------------------------------------------------------------------------


def test_a_send_stores_the_content_as_a_json_string_with_its_ttl_as_expires(broker_factory, short_tmp):
    b = phpmq_broker(broker_factory, short_tmp)
    before = time.time()
    sent(b, pm.send("q", "Hello World", 3600), pm.send("q", "no expiry", 0), pm.send("q", "älter", None))
    messages = peek(b, "q")
    assert [m["Payload"] for m in messages] == ["Hello World", "no expiry", "älter"]
    expires = dt.datetime.fromisoformat(messages[0]["Expires"].replace("Z", "+00:00")).timestamp()
    assert before + 3600 <= expires <= time.time() + 3600
    assert messages[1].get("Expires") is None and messages[2].get("Expires") is None
    assert b.status()["Topics"]["q"]["Published"] == 3


def test_a_send_is_durable_before_the_broker_reads_the_next_frame_so_it_survives_kill_9(broker_factory, short_tmp):
    # Given a send followed on its connection by a frame that closes it
    b = phpmq_broker(broker_factory, short_tmp)
    sent(b, pm.send("q", "kept", 0))
    # When the broker is killed the moment the connection closes, and started again
    b.kill()
    b.start()
    # Then the message is there
    assert [m["Payload"] for m in peek(b, "q")] == ["kept"]


def test_content_that_is_not_utf8_closes_the_connection(broker_factory, short_tmp):
    b = phpmq_broker(broker_factory, short_tmp)
    with phpmq(b) as c:
        c.write(pm.send("q", b"\xff\xfe", 0))
        assert c.closed_by_peer()
    assert peek(b, "q") == []


# --- 004, 005, 006 of messages not in flight: accepted, changing nothing --------------------


def test_acks_requeues_and_dead_letters_of_ids_not_in_flight_keep_the_connection_open_and_count_as_ignored(broker_factory, short_tmp):
    b = phpmq_broker(broker_factory, short_tmp)
    with phpmq(b) as c:
        c.write(pm.ack("q", "1") + pm.requeue("q", "1", 60) + pm.dead_letter("q", "nope"))
        wait_for(lambda: b.status()["Topics"]["q"]["Subscribers"]["w"]["IgnoredAcks"] == 3, what="3 ignored acks")
        assert not c.closed_by_peer(0.2)
    assert rejected(b) == 0


# --- bad frames ----------------------------------------------------------------------------------

BAD_FRAMES = {
    "wrong header flag": b"X0100102" + pm.packet(pm.QUEUE, "q") + pm.packet(pm.CONTENT, "x"),
    "wrong version": pm.message("001", pm.packet(pm.QUEUE, "q"), pm.packet(pm.CONTENT, "x"), version="02"),
    "header not digits": b"H01a0102",
    "unknown message type": pm.message("007", pm.packet(pm.QUEUE, "q"), pm.packet(pm.CONTENT, "x")),
    "dispatch from a client": pm.message("003", pm.packet(pm.QUEUE, "q"), pm.packet(pm.CONTENT, "x")),
    "wrong packet count": pm.message("004", pm.packet(pm.QUEUE, "q"), pm.packet(pm.MESSAGE_ID, "1"), count=3),
    "packet count too small": pm.message("005", pm.packet(pm.QUEUE, "q"), pm.packet(pm.MESSAGE_ID, "1")),
    "a packet twice": pm.message("004", pm.packet(pm.QUEUE, "q"), pm.packet(pm.QUEUE, "q")),
    "a packet of the wrong type": pm.message("004", pm.packet(pm.QUEUE, "q"), pm.packet(pm.COUNT, "1")),
    "a length that lies": b"H0100102" + b"P01" + b"%029d" % 1 + b"q" + b"xx" + pm.packet(pm.CONTENT, "x"),
    "a length that is not digits": b"H0100102" + b"P01" + b"0" * 28 + b"x" + b"q",
    "non-numeric TTL": pm.message("001", pm.packet(pm.QUEUE, "q"), pm.packet(pm.CONTENT, "x"), pm.packet(pm.TTL, "36o0")),
    "negative TTL": pm.message("005", pm.packet(pm.QUEUE, "q"), pm.packet(pm.MESSAGE_ID, "1"), pm.packet(pm.TTL, "-1")),
    "a TTL of 4400 digits": pm.message("001", pm.packet(pm.QUEUE, "q"), pm.packet(pm.CONTENT, "x"), pm.packet(pm.TTL, "9" * 4400)),
    "a count of 4400 digits": pm.message("002", pm.packet(pm.QUEUE, "q"), pm.packet(pm.COUNT, "1" * 4400)),
    "a count of 21 digits": pm.message("002", pm.packet(pm.QUEUE, "q"), pm.packet(pm.COUNT, "0" * 20 + "1")),
    "a count in other digits": pm.message("002", pm.packet(pm.QUEUE, "q"), pm.packet(pm.COUNT, "\u0663")),
    "a queue that does not exist": pm.send("nosuch", "x"),
    "a queue without PhpmqSubscriber": pm.ack("plain", "1"),
    "over MaxFrameBytes": pm.send("q", "x" * 5000),
}


@pytest.mark.parametrize("frame", BAD_FRAMES.values(), ids=BAD_FRAMES.keys())
def test_a_bad_frame_closes_only_its_connection_and_is_counted_in_rejected_with_a_log_line(broker_factory, short_tmp, frame):
    # Given two connections, one of them idle
    b = phpmq_broker(broker_factory, short_tmp, MaxFrameBytes=4096)
    with phpmq(b) as good, phpmq(b) as bad:
        # When one sends a bad frame after a good one
        bad.write(pm.send("q", "before") + frame)
        # Then that one is closed, counted and logged, and the other still sends
        assert bad.closed_by_peer()
        wait_for(lambda: rejected(b) == 1, what="Rejected 1")
        assert "bad PHPMQ frame" in b.log and "Traceback" not in b.log
        good.write(pm.send("q", "after"))
        wait_for(lambda: [m["Payload"] for m in peek(b, "q")] == ["before", "after"], what="both sends stored")
        assert not good.closed_by_peer(0.2)


def test_a_send_to_an_unknown_queue_closes_the_connection_and_is_logged_by_name_and_counted_for_the_listener(broker_factory, short_tmp):
    # Given a producer that misspells its queue
    b = phpmq_broker(broker_factory, short_tmp)
    with phpmq(b) as c:
        # When it sends there
        c.write(pm.send("q-typo", "lost?"))
        # Then its connection is closed, as the protocol has no error reply
        assert c.closed_by_peer()
    # And the operator finds the queue's name in the log, and the count in STATUS and the metrics
    wait_for(lambda: b.status()["Listeners"]["PhpmqSocket"]["UnknownQueue"] == 1, what="UnknownQueue 1")
    assert b.log.count("queue 'q-typo' does not exist") == 1
    assert rejected(b) == 1
    fams = metrics_now(b)
    assert value(fams, "ppmq_unknown_queue", "ppmq_unknown_queue_total", listener="PhpmqSocket") == 1
    assert value(fams, "ppmq_connections", listener="PhpmqSocket") == 0
    assert "PhpmqSocket: 0 connections, 1 frames to unknown queues" in ppmq("status", "-c", b.config_path).stdout


def test_a_frame_that_stalls_midway_is_closed_after_read_timeout(broker_factory, short_tmp):
    b = phpmq_broker(broker_factory, short_tmp, ReadTimeout="300ms")
    with phpmq(b) as c:
        c.write(pm.send("q", "x")[:20])
        assert c.closed_by_peer(5.0)
    wait_for(lambda: rejected(b) == 1, what="Rejected 1")
