"""PHPMQ consumers (PROTOCOL §9): 002 keeps N messages in flight to the
connection as 003 dispatches, refilled as they are acked (004), re-queued (005)
or dead-lettered (006); what a closed connection held is ready again."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import BrokerProcess, wait_for
from tests.wire import phpmq_client as pm
from tests.wire.test_phpmq import _accepting, peek, phpmq, phpmq_broker, sent


def test_every_message_type_consume_dispatch_ack_requeue_and_dead_letter(broker_factory, short_tmp):
    # Given three messages sent to queue q, whose dispatches carry the TTL
    b = phpmq_broker(broker_factory, short_tmp, dispatch_ttl=True)
    sent(b, pm.send("q", "one", 3600), pm.send("q", "two", 0), pm.send("q", "three", 0))
    with phpmq(b) as c:
        # When a consumer asks for 2
        c.write(pm.consume("q", 2))
        first, second = c.receive(), c.receive()
        # Then it gets the first two, with their ppmq keys as IDs, and the TTL left
        assert (first.queue, first.content, second.content) == ("q", b"one", b"two")
        assert first.message_id == "1" and 3598 <= first.ttl_s <= 3600 and second.ttl_s == 0
        # and the third once it acks one
        c.write(pm.ack("q", first.message_id))
        third = c.receive()
        assert third.content == b"three"
        # A dead letter goes to the DeadLetter topic; a re-queue comes back after the rest
        c.write(pm.dead_letter("q", second.message_id) + pm.requeue("q", third.message_id, 60))
        again = c.receive()
        assert (again.message_id, again.content) == (third.message_id, b"three") and 58 <= again.ttl_s <= 60
    wait_for(lambda: [m["Payload"] for m in peek(b, "dead")] == ["two"], what="the dead letter")
    assert peek(b, "dead")[0]["Origin"]["Reason"] == "rejected"


def test_the_dispatched_ttl_counts_down(broker_factory, short_tmp):
    b = phpmq_broker(broker_factory, short_tmp, dispatch_ttl=True)
    sent(b, pm.send("q", "x", 5))
    time.sleep(2.1)
    with phpmq(b) as c:
        c.write(pm.consume("q", 1))
        assert c.receive().ttl_s in (1, 2)


def test_a_requeue_puts_the_message_at_the_end_of_the_queue_with_its_new_ttl(broker_factory, short_tmp):
    b = phpmq_broker(broker_factory, short_tmp, dispatch_ttl=True)
    sent(b, pm.send("q", "a", 10), pm.send("q", "b", 0), pm.send("q", "c", 0))
    with phpmq(b) as c:
        c.write(pm.consume("q", 1))
        a = c.receive()
        c.write(pm.requeue("q", a.message_id, 3600))
        order = []
        for _ in range(3):
            m = c.receive()
            order.append((m.content, m.ttl_s > 3000))
            c.write(pm.ack("q", m.message_id))
    assert order == [(b"b", False), (b"c", False), (b"a", True)]


def test_a_new_consume_request_replaces_the_count(broker_factory, short_tmp):
    b = phpmq_broker(broker_factory, short_tmp)
    sent(b, *(pm.send("q", str(i), 0) for i in range(5)))
    with phpmq(b) as c:
        c.write(pm.consume("q", 1))
        c.receive()
        c.write(pm.consume("q", 3))
        assert [c.receive().content for _ in range(2)] == [b"1", b"2"]


def test_what_a_closed_connection_held_is_dispatched_to_another(broker_factory, short_tmp):
    b = phpmq_broker(broker_factory, short_tmp)
    sent(b, pm.send("q", "x", 0))
    with phpmq(b) as c:
        c.write(pm.consume("q", 1))
        assert c.receive().content == b"x"
    with phpmq(b) as other:
        other.write(pm.consume("q", 1))
        assert other.receive().content == b"x"


CONSUMER = """
import sys, time
from tests.wire import phpmq_client as pm
c = pm.PhpmqClient(sys.argv[1])
c.write(pm.consume("q", 3))
for _ in range(3):
    print(getattr(c, sys.argv[2])().message_id, flush=True)
time.sleep(60)  # holds them, unacked, until killed
"""


@pytest.mark.parametrize("reader", ["receive", "receive_as_published"])
def test_a_consumer_killed_with_kill_9_loses_nothing_another_gets_its_messages_at_once(broker_factory, short_tmp, reader):
    # Given five messages, three of them dispatched to a consumer process that does not ack
    b = phpmq_broker(broker_factory, short_tmp)
    sent(b, *(pm.send("q", str(i), 0) for i in range(5)))
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", CONSUMER, b.config["PhpmqSocket"], reader], stdout=subprocess.PIPE, text=True, cwd=root)
    held = [proc.stdout.readline().strip() for _ in range(3)]
    # When it is killed with kill -9
    proc.kill()
    proc.wait(10)
    proc.stdout.close()
    # Then what it held is ready again at once (q has no AckRetry: without the
    # killed connection's give-back it would never come back)
    wait_for(lambda: b.sub_status("q", "w")["InFlight"] == 0, what="the killed consumer's messages given back")
    # And another consumer gets all five, in their order
    with phpmq(b) as other:
        other.sock.settimeout(5)
        other.write(pm.consume("q", 5))
        got = [getattr(other, reader)() for _ in range(5)]
    assert [m.content for m in got] == [b"0", b"1", b"2", b"3", b"4"]
    assert held == [m.message_id for m in got[:3]]


# --- the dispatch format (PROTOCOL §9 PHPMQ dispatch format) --------------------------------


def test_the_published_client_consumes_and_acks_message_after_message_on_a_default_topic(broker_factory, short_tmp):
    # Given a queue whose topic leaves PhpmqDispatchTTL at its default, and three messages with TTLs
    b = phpmq_broker(broker_factory, short_tmp)
    sent(b, *(pm.send("q", f"m{i}", 3600) for i in range(3)))
    with phpmq(b) as c:
        # When a client that reads dispatches as php-mq/client does consumes one at a time, acking each
        c.write(pm.consume("q", 1))
        got = []
        for _ in range(3):
            m = c.receive_as_published()
            got.append(m)
            c.write(pm.ack("q", m.message_id))
        # Then it reads every message whole (a fourth packet would be read as the next header)
        assert [(m.queue, m.content, m.ttl_s) for m in got] == [("q", b"m0", None), ("q", b"m1", None), ("q", b"m2", None)]
    wait_for(lambda: b.status()["Topics"]["q"]["Subscribers"]["w"]["Acked"] == 3, what="3 acks")
    assert b.status()["Topics"]["q"]["Stored"] == 0


@pytest.mark.parametrize(("dispatch_ttl", "head"), [(False, b"H0100303"), (True, b"H0100304")])
def test_phpmq_dispatch_ttl_chooses_three_packets_or_four_with_the_ttl(broker_factory, short_tmp, dispatch_ttl, head):
    b = phpmq_broker(broker_factory, short_tmp, dispatch_ttl=dispatch_ttl)
    sent(b, pm.send("q", "x", 3600))
    with phpmq(b) as c:
        c.write(pm.consume("q", 1))
        assert c.read_exactly(8) == head
        packets = []
        for _ in range(int(head[6:])):
            ph = c.read_exactly(32)
            packets.append((ph[:3], c.read_exactly(int(ph[3:]))))
    # queue, content and ID as php-mq/server writes them; then the TTL, the whole seconds left
    assert packets[:3] == [(b"P01", b"q"), (b"P02", b"x"), (b"P03", b"1")]
    assert [p for p, _ in packets[3:]] == ([b"P05"] if dispatch_ttl else [])
    assert not dispatch_ttl or 3598 <= int(packets[3][1]) <= 3600


# --- a re-queue and the topic's other subscribers (PROTOCOL §9) -----------------------------


def shared_queue(broker_factory, short_tmp, content: str, ttl_s: int) -> BrokerProcess:
    """Queue `q` (Expire) consumed through the Pull subscriber `w`, and pushed to
    `other` as well, not connected yet; one message sent to it with ttl_s."""
    topics = [{"Name": "q", "Subscribers": ["w", "other"], "PhpmqSubscriber": "w", "Expire": True}]
    subs = [{"Name": "w", "Pull": True, "Socket": None}, "other"]
    b = broker_factory(topics, subs, PhpmqSocket=str(short_tmp / "phpmq.sock"))
    wait_for(lambda: _accepting(b.config["PhpmqSocket"]), what="PhpmqSocket")
    sent(b, pm.send("q", content, ttl_s))
    return b


def requeued(c: pm.PhpmqClient, ttl_s: int) -> pm.Dispatched:
    """The consumer takes the queue's message, and re-queues it with ttl_s."""
    c.write(pm.consume("q", 1))
    m = c.receive()
    c.write(pm.requeue("q", m.message_id, ttl_s))
    return m


def expired(b: BrokerProcess, sub: str) -> int:
    return b.sub_status("q", sub)["Expired"]


def test_a_requeue_with_a_short_ttl_expires_the_consumers_copy_only(broker_factory, short_tmp):
    # Given a message with an hour to live, for the PHPMQ consumer and for `other`
    b = shared_queue(broker_factory, short_tmp, "for both", 3600)
    with phpmq(b) as c:
        # When the consumer re-queues it with a TTL of 1 second
        m = requeued(c, 1)
        # Then its copy expires
        wait_for(lambda: expired(b, "w") == 1, what="the consumer's copy to expire")
    # And `other` still gets the message, with the producer's expiry
    other = broker_factory.subscriber(b, "other")
    other.wait_messages(1)
    [got] = other.messages
    assert got["Payload"] == "for both" and got["Key"] == m.message_id
    assert time.time() + 3500 < dt.datetime.fromisoformat(got["Expires"].replace("Z", "+00:00")).timestamp()
    assert expired(b, "other") == 0


def test_a_requeue_with_ttl_0_keeps_the_consumers_copy_and_the_others_expire_as_the_producer_said(broker_factory, short_tmp):
    # Given a message with 2 seconds to live, for the PHPMQ consumer and for `other`
    b = shared_queue(broker_factory, short_tmp, "short", 2)
    with phpmq(b) as c:
        # When the consumer re-queues it with a TTL of 0 (no expiry)
        m = requeued(c, 0)
        assert c.receive().message_id == m.message_id
        # Then `other`'s copy expires at the producer's time, and the consumer's does not
        wait_for(lambda: expired(b, "other") == 1, what="other's copy to expire")
        assert expired(b, "w") == 0
        assert [(x["Subscriber"], x["Expires"]) for x in peek(b, "q")] == [("w", None)]
        c.write(pm.ack("q", m.message_id))
    wait_for(lambda: b.status()["Topics"]["q"]["Stored"] == 0, what="the ack to finish the message")
