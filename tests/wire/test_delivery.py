"""Publish and deliver through a real `ppmq serve`: PROTOCOL §3 end to end."""

from __future__ import annotations

import os
import socket
import threading

from ..conftest import wait_for


def test_every_subscriber_of_a_topic_receives_every_message_once_acked_it_is_gone(broker_factory):
    # Given a topic with two subscribers that ack on the delivery connection
    b = broker_factory([{"Name": "t", "Subscribers": ["a", "b"]}], ["a", "b"])
    a, bb = broker_factory.subscriber(b, "a"), broker_factory.subscriber(b, "b")
    # When 250 messages are published in three requests
    with b.client() as c:
        for start in (0, 100, 200):
            n = min(100, 250 - start)
            assert c.publish("t", [{"Payload": f"m{i}"} for i in range(start, start + n)]).accepted == n
    # Then both receive all of them, in publish order, and the store ends empty
    for sub in (a, bb):
        sub.wait_messages(250)
        assert sub.payloads() == [f"m{i}" for i in range(250)]
    wait_for(lambda: b.status()["Topics"]["t"]["Stored"] == 0, what="store to empty")
    st = b.status()["Topics"]["t"]
    assert st["Published"] == 250
    for name in ("a", "b"):
        s = st["Subscribers"][name]
        assert (s["Delivered"], s["Acked"], s["InFlight"], s["Ready"]) == (250, 250, 0, [0])


def test_a_backlog_published_before_the_subscriber_appears_arrives_by_priority_then_order(broker_factory):
    b = broker_factory([{"Name": "t", "Priorities": 3, "Subscribers": ["s"]}], [{"Name": "s", "BatchSize": 7}])
    with b.client() as c:
        c.publish("t", [{"Payload": i, "Priority": (i * 7) % 3} for i in range(60)])
    assert b.sub_status("t", "s")["Ready"] == [20, 20, 20]
    sub = broker_factory.subscriber(b, "s")
    msgs = sub.wait_messages(60)
    expected = sorted(range(60), key=lambda i: ((i * 7) % 3, i))
    assert [m["Payload"] for m in msgs] == expected
    assert all(len(batch["Messages"]) <= 7 for batch in sub.batches)
    # and the publish's generated keys go the same way: by priority, then order (docs/protocol.md Keys)
    keys = [int(m["Key"]) for m in msgs]
    assert keys == list(range(keys[0], keys[0] + 60))


def test_generated_keys_are_unique_and_never_reused_across_a_restart(broker_factory):
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"])
    sub = broker_factory.subscriber(b, "s")
    with b.client() as c:
        c.publish("t", [{"Payload": i, "Key": "ignored"} for i in range(5)])
    sub.wait_messages(5)
    assert b.stop() == 0
    b.start()
    with b.client() as c:
        c.publish("t", [{"Payload": i} for i in range(5, 10)])
    keys = [m["Key"] for m in sub.wait_messages(10)]
    assert len(set(keys)) == 10 and "ignored" not in keys


def test_dedupe_delivers_only_the_newest_version_and_keeps_the_better_place(broker_factory):
    # Given a dedupe topic with a backlog: a(prio 1), b(prio 1), c(prio 0)
    b = broker_factory([{"Name": "t", "Dedupe": True, "Priorities": 2, "Subscribers": ["s"]}], ["s"])
    with b.client() as c:
        c.publish("t", [{"Key": "a", "Payload": "a1", "Priority": 1}, {"Key": "b", "Payload": "b1", "Priority": 1}])
        c.publish("t", [{"Key": "c", "Payload": "c1", "Priority": 0}])
        # When a is replaced at the same priority, b gains priority, c loses it
        c.publish("t", [{"Key": "a", "Payload": "a2", "Priority": 1}])
        c.publish("t", [{"Key": "b", "Payload": "b2", "Priority": 0}])
        c.publish("t", [{"Key": "c", "Payload": "c2", "Priority": 1}])
    st = b.status()["Topics"]["t"]
    assert (st["Stored"], st["Published"], st["Replaced"]) == (3, 6, 3)
    sub = broker_factory.subscriber(b, "s")
    # Then c keeps its old place (ahead), b moves to the end of priority 0, a keeps its place
    got = [(m["Key"], m["Payload"], m["Priority"]) for m in sub.wait_messages(3)]
    assert got == [("c", "c2", 1), ("b", "b2", 0), ("a", "a2", 1)]


def test_a_message_replaced_while_in_flight_is_delivered_again_and_the_ack_applies_to_the_newest(broker_factory):
    b = broker_factory([{"Name": "t", "Dedupe": True, "Subscribers": ["s"]}], ["s"])
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Key": "k", "Payload": "v1"}])
        sub.wait_messages(1)
        c.publish("t", [{"Key": "k", "Payload": "v2"}])
        assert [m["Payload"] for m in sub.wait_messages(2)] == ["v1", "v2"]
        assert c.ack("t", "s", ["k"]).accepted == 1
        assert c.ack("t", "s", ["k"]).accepted == 0  # already acknowledged: ignored and counted
    st = b.status()["Topics"]["t"]
    assert st["Stored"] == 0
    assert st["Subscribers"]["s"]["IgnoredAcks"] == 1


def test_an_expired_message_is_never_delivered_and_is_removed_also_when_in_flight(broker_factory):
    b = broker_factory([{"Name": "t", "Expire": True, "Subscribers": ["s", "late"]}], ["s", "late"])
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish(
            "t",
            [
                {"Payload": "short", "TTL": 1},
                {"Payload": "past", "Expires": "2001-01-01T00:00:00Z"},
                {"Payload": "never", "Expires": "0001-01-01T00:00:00Z"},
            ],
        )
    got = sub.wait_messages(2)
    assert [m["Payload"] for m in got] == ["short", "never"]
    assert "Expires" in got[0] and "Expires" not in got[1]
    # The in-flight "short" and the never-delivered ones for "late" are all gone within a second of expiry
    wait_for(lambda: b.status()["Topics"]["t"]["Expired"] == 2, timeout_s=5, what="expiry")
    st = b.status()["Topics"]["t"]
    assert st["Stored"] == 1
    assert st["Subscribers"]["s"]["InFlight"] == 1 and st["Subscribers"]["s"]["Expired"] == 2
    assert st["Subscribers"]["late"]["Ready"] == [1] and st["Subscribers"]["late"]["Expired"] == 2
    late = broker_factory.subscriber(b, "late")
    late.wait_messages(1)
    assert late.payloads() == ["never"]


def test_expires_is_passed_on_but_ignored_on_a_topic_without_expire(broker_factory):
    b = broker_factory([{"Name": "t", "Expire": False, "Subscribers": ["s"]}], ["s"])
    with b.client() as c:
        c.publish("t", [{"Payload": "old", "Expires": "2001-01-01T00:00:00Z"}])
    sub = broker_factory.subscriber(b, "s")
    (m,) = sub.wait_messages(1)
    assert (m["Payload"], m["Expires"]) == ("old", "2001-01-01T00:00:00Z")


def test_a_message_not_acked_within_ack_retry_is_delivered_again_at_its_place(broker_factory):
    b = broker_factory([{"Name": "t", "AckRetry": "1s", "Subscribers": ["s"]}], [{"Name": "s", "BatchSize": 2, "Window": 2}])
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Payload": i} for i in range(3)])
        first = sub.wait_messages(2)
        c.ack("t", "s", [first[1]["Key"]])  # ack 1, leave 0 unacked
        third = sub.wait_messages(3)[2]  # 2 goes out once the window has room
        c.ack("t", "s", [third["Key"]])
        # 0 comes back after its deadline
        again = sub.wait_messages(4, timeout_s=5)
        assert [m["Payload"] for m in again] == [0, 1, 2, 0]
        assert again[3]["Key"] == first[0]["Key"]
        assert b.sub_status("t", "s")["Redelivered"] == 1
        c.ack("t", "s", [first[0]["Key"]])
    assert b.status()["Topics"]["t"]["Stored"] == 0


def test_reconnect_puts_everything_in_flight_back_in_order_for_one_topic_or_all(broker_factory):
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}, {"Name": "u", "Subscribers": ["s"]}], ["s"])
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Payload": f"t{i}"} for i in range(3)])
        c.publish("u", [{"Payload": "u0"}])
        sub.wait_messages(4)
        c.reconnect("s", "t")
        sub.wait_messages(7)
        assert sub.payloads("t") == ["t0", "t1", "t2"] * 2 and sub.payloads("u") == ["u0"]
        c.reconnect("s")
        sub.wait_messages(11)
    assert sub.payloads("t") == ["t0", "t1", "t2"] * 3 and sub.payloads("u") == ["u0"] * 2
    assert b.sub_status("t", "s")["InFlight"] == 3


def test_with_ack_required_false_delivery_alone_completes_the_message(broker_factory):
    b = broker_factory([{"Name": "t", "AckRequired": False, "Subscribers": ["s"]}], ["s"])
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Payload": i} for i in range(10)])
    sub.wait_messages(10)
    wait_for(lambda: b.status()["Topics"]["t"]["Stored"] == 0, what="auto-completed messages to go")
    assert b.sub_status("t", "s")["InFlight"] == 0


def test_a_subscriber_that_never_acks_does_not_delay_the_others(broker_factory):
    b = broker_factory([{"Name": "t", "Subscribers": ["slow", "fast"]}], [{"Name": "slow", "BatchSize": 5}, "fast"])
    slow = broker_factory.subscriber(b, "slow", ack=None)
    fast = broker_factory.subscriber(b, "fast")
    with b.client() as c:
        for i in range(10):
            c.publish("t", [{"Payload": i * 50 + j} for j in range(50)])
    fast.wait_messages(500)
    slow.wait_messages(5)
    assert len(slow.messages) == 5  # its window, and no more
    assert b.sub_status("t", "slow")["Ready"] == [495]


def test_a_subscriber_that_comes_late_gets_everything_and_one_that_leaves_keeps_its_messages_in_flight(broker_factory):
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"])
    with b.client() as c:
        c.publish("t", [{"Payload": 1}])
    first = broker_factory.subscriber(b, "s", ack=None)
    first.wait_messages(1)
    first.close()
    second = broker_factory.subscriber(b, "s")
    with b.client() as c:
        c.publish("t", [{"Payload": 2}])
        assert second.wait_messages(1) and second.payloads() == [2]
        # 1 stays in flight until RECONNECT, once second's ack of 2 is in
        wait_for(lambda: b.sub_status("t", "s")["InFlight"] == 1, what="2 acked and 1 in flight")
        c.reconnect("s")
    second.wait_messages(2)
    assert second.payloads() == [2, 1]


def test_requests_that_arrive_during_a_commit_share_the_next_one(broker_factory):
    # Given 16 producers publishing at once, each waiting for its confirmation
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"])
    before = b.status()["Commits"]

    def produce() -> None:
        with b.client() as c:
            for i in range(25):
                assert c.publish("t", [{"Payload": i}]).accepted == 1

    threads = [threading.Thread(target=produce) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then all 400 are stored, in far fewer transactions than requests
    status = b.status()
    assert status["Topics"]["t"]["Stored"] == 400
    commits = status["Commits"] - before
    assert commits < 400 / 2, f"{commits} commits for 400 requests"


def test_a_batch_cut_off_by_the_subscriber_goes_back_to_ready_and_is_not_counted_delivered(broker_factory):
    # Given a batch far larger than a socket buffer, and a subscriber that reads a little and hangs up
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], [{"Name": "s", "BatchSize": 40}])
    with b.client() as c:
        c.publish("t", [{"Payload": "x" * 200_000} for _ in range(40)])
    path = b.sub_socket("s")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with socket.socket(socket.AF_UNIX) as rude:
        rude.bind(path)
        rude.listen(1)
        conn, _ = rude.accept()
        conn.recv(1024)
        conn.close()
    os.unlink(path)
    # Then the batch is back in ready, not counted as delivered
    wait_for(lambda: b.sub_status("t", "s")["Ready"] == [40], what="the cut-off batch back in ready")
    assert b.sub_status("t", "s")["Delivered"] == 0
    # And a subscriber that reads gets all of it, as first deliveries
    sub = broker_factory.subscriber(b, "s")
    sub.wait_messages(40)
    wait_for(lambda: b.sub_status("t", "s")["Acked"] == 40, what="the acks")
    s = b.sub_status("t", "s")
    assert (s["Delivered"], s["Redelivered"]) == (40, 0)


def test_a_generated_key_is_acked_only_in_the_spelling_the_broker_gave_it(broker_factory):
    # Given messages 1 and 2 in flight to s, which leaves acking to the test
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"])
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Payload": 1}, {"Payload": 2}])
        sub.wait_messages(2)
        # When message 2 is acked as "0002" and "02"
        c.ack("t", "s", ["0002", "02"])
        # Then nothing is acked until it is acked as "2"
        assert b.sub_status("t", "s")["InFlight"] == 2
        c.ack("t", "s", ["2"])
    assert b.sub_status("t", "s")["InFlight"] == 1 and b.sub_status("t", "s")["IgnoredAcks"] == 2
