"""Delivery control and operator commands through a real `ppmq serve` (PROTOCOL §8)."""

from __future__ import annotations

import tarfile
import time
from pathlib import Path

import msgspec
import pytest

from ppmq.errors import ClientError

from ..conftest import wait_for

RETRY = {"Name": "t", "Subscribers": ["s"], "AckRetry": "2s"}
DATA = Path(__file__).parents[1] / "data"  # stores older ppmqs wrote (tests/data/make_*.py)


def request(b, **wrapper) -> dict:
    """A request's reply, as a dict; ClientError for an error status."""
    with b.client() as c:
        reply = c.request(wrapper)
    return {"Accepted": reply.accepted, "Body": reply.body}


def error_of(b, **wrapper) -> tuple[int, str]:
    with pytest.raises(ClientError) as exc:
        request(b, **wrapper)
    return exc.value.status, exc.value.error


def counts(b, topic: str = "t") -> dict:
    """A topic's STATUS without the ages, which move with the clock."""
    st = b.status()["Topics"][topic]
    return st | {"Subscribers": {n: {k: v for k, v in s.items() if k != "OldestReadyAge"} for n, s in st["Subscribers"].items()}}


def keys_of(sub, n: int) -> list[str]:
    return [m["Key"] for m in sub.wait_messages(n)]


def test_a_nacked_message_comes_back_at_its_place_and_counts_as_an_attempt(broker_factory):
    # Given two messages in flight to a subscriber that does not ack, with Metadata on
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], [{"Name": "s", "Metadata": True}])
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Payload": "first"}, {"Payload": "second"}])
    first, _ = keys_of(sub, 2)
    # When the first is nacked
    assert request(b, Topic="t", Subscriber="s", Nacks=[first, "999"])["Accepted"] == 1
    # Then it is delivered again, as its second attempt, and the unknown key is counted as ignored
    again = sub.wait_messages(3)[2]
    assert (again["Key"], again["Payload"], again["Attempt"]) == (first, "first", 2)
    assert sub.messages[0]["Attempt"] == 1 and sub.messages[0]["Published"].endswith("Z")
    s = b.sub_status("t", "s")
    assert (s["Redelivered"], s["IgnoredAcks"], s["InFlight"]) == (1, 1, 2)


def test_a_nack_with_a_delay_waits_and_keeps_its_place_across_a_restart(broker_factory):
    # Given a message in flight
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"])
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Payload": "slow"}])
    [key] = keys_of(sub, 1)
    # When it is nacked with a delay of 2 s, and the broker is killed and started again
    nacked_at = time.monotonic()  # before the request: the broker's nack is no earlier
    request(b, Topic="t", Subscriber="s", Nacks=[key], Delay=2)
    assert b.sub_status("t", "s")["Delayed"] == 1
    b.kill()
    b.start()
    # Then it is delivered again once due, not before
    assert b.sub_status("t", "s")["Delayed"] == 1
    sub.wait_messages(2, timeout_s=10)
    assert time.monotonic() - nacked_at >= 1.9
    assert b.sub_status("t", "s")["Delayed"] == 0


def test_a_delayed_publish_is_not_delivered_before_its_time_and_due_ones_pass_it(broker_factory):
    # Given a subscriber, and a publish whose first message waits 1.5 s (and a
    # marker that waits 0.5 s, to show that the broker's clock got that far)
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"])
    sub = broker_factory.subscriber(b, "s")
    with b.client() as c:
        c.publish("t", [{"Payload": "later", "Delay": 1.5}, {"Payload": "now"}, {"Payload": "marker", "Delay": 0.5}])
    # Then the due one arrives first, and the delayed one after its delay
    assert sub.wait_messages(1)[0]["Payload"] == "now"
    assert [m["Payload"] for m in sub.wait_messages(2, timeout_s=10)] == ["now", "marker"]
    assert [m["Payload"] for m in sub.wait_messages(3, timeout_s=10)] == ["now", "marker", "later"]


def test_not_before_in_the_past_is_due_at_once(broker_factory):
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"])
    sub = broker_factory.subscriber(b, "s")
    with b.client() as c:
        c.publish("t", [{"Payload": 1, "NotBefore": "2001-01-01T00:00:00Z"}])
    assert sub.wait_messages(1)[0]["Payload"] == 1


def test_a_rejected_message_is_dead_lettered_with_its_origin_and_redrive_brings_it_back(broker_factory):
    # Given a topic whose dead letters go to `dead`, a subscriber that does not ack
    topics = [{"Name": "t", "Subscribers": ["s"], "DeadLetter": "dead"}, {"Name": "dead", "Subscribers": ["archive"]}]
    b = broker_factory(topics, ["s", {"Name": "archive"}])
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Payload": {"n": 1}}])
    [key] = keys_of(sub, 1)
    # When the subscriber rejects it
    assert request(b, Topic="t", Subscriber="s", Rejects=[key])["Accepted"] == 1
    # Then a copy waits in the dead-letter topic, with where it came from and why
    peeked = request(b, Command="PEEK", Topic="dead")["Body"]["Messages"]
    assert [(m["Payload"], m["Subscriber"], m["State"], m["Origin"]["Reason"]) for m in peeked] == [
        ({"n": 1}, "archive", "ready", "rejected")
    ]
    assert b.sub_status("t", "s")["DeadLettered"] == 1 and b.status()["Topics"]["t"]["Stored"] == 0
    archive = broker_factory.subscriber(b, "archive", ack=None)
    origin = archive.wait_messages(1)[0]["Origin"]
    assert (origin["Topic"], origin["Subscriber"], origin["Reason"], origin["Attempts"]) == ("t", "s", "rejected", 1)
    # When the operator redrives the dead-letter topic
    assert request(b, Command="REDRIVE", Topic="dead")["Body"] == {"Redriven": 1, "Skipped": 0}
    # Then the message is delivered to its origin subscriber again, as a first delivery, and the copy is gone
    redriven = sub.wait_messages(2)[1]
    assert redriven["Payload"] == {"n": 1} and redriven["Key"] != key
    assert b.status()["Topics"]["dead"]["Stored"] == 0


def test_redrive_restores_the_priority_that_a_dead_letter_topic_of_fewer_priorities_held_lower(broker_factory):
    # Given a topic of two priorities whose dead letters go to a topic of one
    topics = [{"Name": "t", "Priorities": 2, "Subscribers": ["s"], "DeadLetter": "dead"}, {"Name": "dead", "Subscribers": ["archive"]}]
    b = broker_factory(topics, ["s", "archive"])
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Payload": "low", "Priority": 1}])
    [key] = keys_of(sub, 1)
    # When its subscriber rejects a message of priority 1
    request(b, Topic="t", Subscriber="s", Rejects=[key])
    # Then the copy waits at priority 0, and its Origin records priority 1
    [copy] = request(b, Command="PEEK", Topic="dead")["Body"]["Messages"]
    assert (copy["Priority"], copy["Origin"]["Priority"]) == (0, 1)
    # When it is redriven while the subscriber is paused, and a message of priority 0 follows
    request(b, Command="PAUSE", Subscriber="s")
    assert request(b, Command="REDRIVE", Topic="dead")["Body"] == {"Redriven": 1, "Skipped": 0}
    with b.client() as c:
        c.publish("t", [{"Payload": "high", "Priority": 0}])
    request(b, Command="RESUME", Subscriber="s")
    # Then the redriven message is back at priority 1, behind the later message of priority 0
    delivered = sub.wait_messages(3)[1:]
    assert [(m["Payload"], m["Priority"]) for m in delivered] == [("high", 0), ("low", 1)]


def test_redrive_of_a_dead_letter_whose_origin_an_older_ppmq_wrote_without_priority_keeps_the_copys(broker_factory):
    # Given the store of an older ppmq holding a dead letter of priority 1 whose Origin has no Priority
    topics = [
        {"Name": "jobs", "Priorities": 2, "Subscribers": ["w"], "DeadLetter": "dead"},
        {"Name": "dead", "Priorities": 2, "Subscribers": ["archive"]},
    ]
    b = broker_factory(topics, ["w", "archive"], start=False)
    with tarfile.open(DATA / "dead-letter-store.tar.gz") as tar:
        tar.extractall(b.config["DataPath"], filter="data")
    b.start()
    [copy] = request(b, Command="PEEK", Topic="dead")["Body"]["Messages"]
    assert copy["Priority"] == 1 and "Priority" not in copy["Origin"]
    # When it is redriven
    assert request(b, Command="REDRIVE", Topic="dead")["Body"] == {"Redriven": 1, "Skipped": 0}
    # Then its origin subscriber gets it at the copy's priority
    sub = broker_factory.subscriber(b, "w")
    [m] = sub.wait_messages(1)
    assert (m["Payload"], m["Priority"]) == ({"n": 1}, 1)


def test_redrive_of_a_topic_that_is_no_dead_letter_topic_is_refused(broker_factory):
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"])
    assert error_of(b, Command="REDRIVE", Topic="t") == (400, "Topic: 't' is no topic's DeadLetter")


def test_expired_messages_are_dead_lettered_when_the_topic_says_so(broker_factory):
    topics = [
        {"Name": "t", "Subscribers": ["s"], "Expire": True, "DeadLetter": "dead", "DeadLetterReasons": ["expired"]},
        {"Name": "dead", "Subscribers": ["archive"]},
    ]
    b = broker_factory(topics, ["s", "archive"])
    with b.client() as c:
        c.publish("t", [{"Payload": 1, "TTL": 0.2}])
    archive = broker_factory.subscriber(b, "archive")
    origin = archive.wait_messages(1, timeout_s=10)[0]["Origin"]
    assert (origin["Reason"], origin["Attempts"]) == ("expired", 0)


def test_max_age_expires_a_message_published_without_expires(broker_factory):
    b = broker_factory([{"Name": "t", "Subscribers": ["s"], "Expire": True, "MaxAge": "300ms"}], ["s"])
    with b.client() as c:
        c.publish("t", [{"Payload": 1}])
    wait_for(lambda: b.status()["Topics"]["t"]["Expired"] == 1, timeout_s=10, what="MaxAge expiry")


def test_touch_restarts_the_ack_deadline(broker_factory):
    # Given a message in flight with AckRetry 2 s
    b = broker_factory([RETRY], ["s"])
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Payload": 1}])
    [key] = keys_of(sub, 1)
    # When the subscriber touches it every second for 3 s
    for _ in range(3):
        time.sleep(1)
        assert request(b, Topic="t", Subscriber="s", Touch=[key])["Accepted"] == 1
    # Then it was never redelivered (by the broker's count, not only the subscriber's); left alone, it is
    s = b.sub_status("t", "s")
    assert (s["Delivered"], s["Redelivered"]) == (1, 0)
    assert len(sub.messages) == 1
    sub.wait_messages(2, timeout_s=10)


def test_a_paused_subscriber_gets_nothing_until_resumed_also_after_a_restart(broker_factory):
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"])
    request(b, Command="PAUSE", Subscriber="s")
    sub = broker_factory.subscriber(b, "s")
    with b.client() as c:
        c.publish("t", [{"Payload": i} for i in range(3)])
    b.kill()
    b.start()
    # (connected, and then a step with it open for a batch: the broker had its chance to push)
    wait_for(lambda: b.sub_status("t", "s")["Connected"], what="the subscriber connected")
    assert b.settled_status()["Topics"]["t"]["Subscribers"]["s"]["Delivered"] == 0
    assert sub.messages == [] and b.sub_status("t", "s")["Paused"] is True
    request(b, Command="RESUME", Subscriber="s", Topic="t")
    assert [m["Payload"] for m in sub.wait_messages(3)] == [0, 1, 2]
    assert b.sub_status("t", "s")["Paused"] is False


def test_peek_pages_through_ready_then_in_flight_messages_without_changing_them(broker_factory):
    # Given 2 messages in flight (Window 2) and 3 ready
    b = broker_factory([{"Name": "t", "Subscribers": ["s"], "AckRetry": "1h"}], [{"Name": "s", "BatchSize": 2}])
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Payload": i} for i in range(5)])
    sub.wait_messages(2)
    before = counts(b)
    # When the operator peeks two at a time
    seen, after = [], None
    while True:
        wrapper = {"Command": "PEEK", "Topic": "t", "Limit": 2} | ({"After": after} if after else {})
        body = request(b, **wrapper)["Body"]
        seen += body["Messages"]
        after = body["Next"]
        if after is None:
            break
    # Then every message is listed once, ready first in queue order, then in flight with a deadline
    assert [(m["Payload"], m["State"], m["Attempt"]) for m in seen] == [
        (2, "ready", 0),
        (3, "ready", 0),
        (4, "ready", 0),
        (0, "inflight", 1),
        (1, "inflight", 1),
    ]
    assert all(m["Deadline"] for m in seen[3:]) and not any(m["Deadline"] for m in seen[:3])
    assert counts(b) == before


@pytest.mark.parametrize(
    "wrapper, expected",
    [
        ({"Command": "PEEK", "Topic": "t", "Limit": 1001}, (400, "Limit: 1001 is out of range 1..1000")),
        ({"Command": "PEEK", "Topic": "t", "State": "gone"}, (400, "State: 'gone' is not one of ready, inflight")),
        ({"Command": "PEEK", "Topic": "t", "After": "!!"}, (400, "After: not a Next cursor of a PEEK reply")),
        ({"Command": "PURGE", "Topic": "nope"}, (404, "Topic: unknown topic 'nope'")),
        ({"Topic": "t", "Subscriber": "s", "Nacks": ["1"], "Delay": -1}, (400, "Delay: -1 must be a number of seconds from 0 to 1e9")),
        (
            {"Topic": "t", "Subscriber": "s", "Acks": ["1"], "Delay": 1},
            (400, "Delay: only with Nacks (a message waits with its own Delay or NotBefore)"),
        ),
        (
            {"Topic": "t", "Messages": [{"Payload": 1, "Delay": 1, "NotBefore": 5}]},
            (400, "Messages[0].NotBefore: give either Delay or NotBefore, not both"),
        ),
        (
            {"Topic": "t", "Messages": [{"Payload": 1, "Delay": -2}]},
            (400, "Messages[0].Delay: -2 must be a number of seconds from 0 to 1e9"),
        ),
        ({"Command": "PAUSE"}, (400, "Subscriber: required with PAUSE")),
    ],
)
def test_bad_delivery_control_input_is_refused_naming_the_field_and_changes_nothing(broker_factory, wrapper, expected):
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"])
    with b.client() as c:
        c.publish("t", [{"Payload": "kept"}])
    before = counts(b)
    assert error_of(b, **wrapper) == expected
    assert counts(b) == before


def test_a_nack_that_fails_in_its_wrapper_is_not_applied(broker_factory):
    # Given a message in flight
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"])
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Payload": 1}])
    [key] = keys_of(sub, 1)
    # When a wrapper nacks it and then names an unknown command
    assert error_of(b, Topic="t", Subscriber="s", Nacks=[key], Command="NOPE")[0] == 400
    # Then the nack did not happen (had it, the step that answered would have pushed the message again)
    assert b.sub_status("t", "s")["Delivered"] == 1
    assert len(sub.messages) == 1 and b.sub_status("t", "s")["InFlight"] == 1


def test_purge_of_one_subscriber_removes_its_copies_and_keeps_the_others(broker_factory):
    b = broker_factory([{"Name": "t", "Subscribers": ["a", "b"], "Dedupe": True}], ["a", "b"])
    with b.client() as c:
        c.publish("t", [{"Key": k, "Payload": k} for k in "xyz"])
    assert request(b, Command="PURGE", Topic="t", Subscriber="a", Keys=["x", "y", "nope"])["Body"] == {"Purged": 2}
    st = b.status()["Topics"]["t"]
    assert (st["Stored"], st["Subscribers"]["a"]["Ready"], st["Subscribers"]["b"]["Ready"]) == (3, [1], [3])
    assert request(b, Command="PURGE", Topic="t")["Body"] == {"Purged": 4}
    assert b.status()["Topics"]["t"]["Stored"] == 0


def test_ping_answers_version_and_uptime_and_status_of_one_topic(broker_factory):
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}, {"Name": "u", "Subscribers": ["s"]}], ["s"])
    body = request(b, Command="PING")["Body"]
    assert set(body) == {"Version", "UptimeSeconds"} and body["UptimeSeconds"] >= 0
    status = request(b, Command="STATUS", Topic="u")["Body"]
    assert list(status["Topics"]) == ["u"]
    assert {"Connected", "Paused", "Delayed", "DeadLettered"} <= set(status["Topics"]["u"]["Subscribers"]["s"])
    assert error_of(b, Command="STATUS", Topic="nope") == (404, "Topic: unknown topic 'nope'")


def test_a_subscriber_without_metadata_gets_the_frames_of_ppmq(broker_factory):
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"])
    sub = broker_factory.subscriber(b, "s")
    with b.client() as c:
        c.publish("t", [{"Payload": {"a": 1}}])
    assert set(sub.wait_messages(1)[0]) == {"Key", "Payload", "Priority", "Topic"}


def test_nacks_on_the_delivery_connection_are_applied_like_acks(broker_factory):
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"])
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Payload": 1}])
    [key] = keys_of(sub, 1)
    conn = sub._conns[0]
    conn.sendall(msgspec.json.encode({"Topic": "t", "Subscriber": "s", "Nacks": [key]}) + b"\n")
    sub.wait_messages(2)
