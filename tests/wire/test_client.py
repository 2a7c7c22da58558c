"""The client library, both flavours, against a real broker: every request with
its typed result, and the broker's errors as ClientError."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest

from ppmq.client import (
    AsyncClient,
    Client,
    Message,
    PeekResult,
    PingResult,
    PublishResult,
    PurgeResult,
    RedriveResult,
    SettleResult,
    Status,
)
from ppmq.errors import ClientError
from ppmq.version import ppmq_version

from ..conftest import WAIT_S


class AsyncDriven:
    """An AsyncClient called as Client is: each method runs to its end on a loop of
    its own, so that one scenario drives both flavours, method by method."""

    def __init__(self, path: str, timeout_s: float) -> None:
        self.loop = asyncio.new_event_loop()
        self.client = self.loop.run_until_complete(AsyncClient.connect(path, timeout_s))

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.client, name)
        return lambda *args, **kw: self.loop.run_until_complete(method(*args, **kw))

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


@pytest.fixture(params=["Client", "AsyncClient"])
def connect(request) -> Iterator[Callable[..., Any]]:
    """Connects a client of either flavour to a broker's socket; closed after the test."""
    opened: list[Any] = []

    def connect(b, timeout_s: float = WAIT_S) -> Any:
        c = Client(b.socket, timeout_s) if request.param == "Client" else AsyncDriven(b.socket, timeout_s)
        opened.append(c)
        return c

    yield connect
    for c in opened:
        c.close()


# A Pull subscriber on a topic that dead-letters into another one (PROTOCOL §8, §9)
PULLED = [
    {"Name": "jobs", "Priorities": 2, "Subscribers": ["w"], "AckRetry": "1h", "DeadLetter": "jobs-dead"},
    {"Name": "jobs-dead", "Subscribers": ["dl"]},
]
PULLERS = [{"Name": "w", "Pull": True, "Socket": None, "Metadata": True}, {"Name": "dl", "Pull": True, "Socket": None}]


def test_a_pull_worker_publishes_takes_and_settles_with_typed_results(broker_factory, connect):
    # Given three messages for a Pull subscriber with Metadata
    b = broker_factory(PULLED, PULLERS)
    c = connect(b)
    assert c.publish("jobs", [{"Payload": "a"}, {"Payload": {"n": 2}, "Priority": 1}, {"Payload": "c"}]) == PublishResult(3)
    # When a worker takes two, they come typed, in delivery order, with their metadata
    first, second = c.take("jobs", "w", count=2)
    assert isinstance(first, Message) and (first.payload, first.priority, first.attempt) == ("a", 0, 1)
    assert (second.payload, second.priority) == ("c", 0) and first.published is not None and first.published.endswith("Z")
    # And touch, nack and reject each say how many keys they applied and how many the broker ignored
    assert c.touch("jobs", "w", [first.key]) == SettleResult(accepted=1, ignored=0)
    assert c.nack("jobs", "w", [first.key, "999"], delay_s=0) == SettleResult(accepted=1, ignored=1)
    assert c.reject("jobs", "w", [second.key]) == SettleResult(accepted=1, ignored=0)
    # Then the nacked message is taken again, on its second attempt, with the one behind it; acked with the TAKE
    again = c.take("jobs", "w", count=10)
    assert [(m.payload, m.attempt) for m in again] == [("a", 2), ({"n": 2}, 1)]
    assert c.take("jobs", "w", count=10, acks=[m.key for m in again]) == []
    # And the rejected one waits as a dead letter, whose Origin is typed
    (dead,) = c.take("jobs-dead", "dl")
    assert dead.origin is not None and (dead.origin.topic, dead.origin.subscriber, dead.origin.reason) == ("jobs", "w", "rejected")
    assert c.ack("jobs-dead", "dl", [dead.key, "nope"]) == SettleResult(accepted=1, ignored=1)


def test_an_operator_peeks_purges_redrives_and_pings_with_typed_results(broker_factory, connect):
    # Given a message taken and rejected to the dead-letter topic, and two more waiting
    b = broker_factory(PULLED, PULLERS)
    c = connect(b)
    c.publish("jobs", [{"Payload": "bad"}])
    (bad,) = c.take("jobs", "w")
    c.reject("jobs", "w", [bad.key])
    c.publish("jobs", [{"Payload": "x", "Priority": 1}, {"Payload": "y"}])
    (taken,) = c.take("jobs", "w")
    # When an operator peeks, page by page
    page = c.peek("jobs", limit=1)
    assert isinstance(page, PeekResult) and page.next is not None
    rest = c.peek("jobs", after=page.next)
    # Then every copy is there once, in delivery order, ready ones first, typed
    shown = [(m.payload, m.state, m.subscriber) for m in page.messages + rest.messages]
    assert shown == [("x", "ready", "w"), ("y", "inflight", "w")] and rest.next is None
    assert rest.messages[0].key == taken.key and rest.messages[0].deadline is not None and rest.messages[0].attempt == 1
    (dead,) = c.peek("jobs-dead", state="ready").messages
    assert dead.origin is not None and dead.origin.reason == "rejected"
    # And a redrive puts the dead letter back on its origin, a purge removes what it names
    assert c.redrive("jobs-dead") == RedriveResult(redriven=1, skipped=0)
    assert c.purge("jobs", subscriber="w", keys=[taken.key]) == PurgeResult(purged=1)
    assert [m.payload for m in c.peek("jobs").messages] == ["bad", "x"]
    assert c.purge("jobs") == PurgeResult(purged=2)
    assert c.peek("jobs") == PeekResult(messages=[], next=None)
    # And PING says which broker answers
    pong = c.ping()
    assert isinstance(pong, PingResult) and pong.version == ppmq_version() and pong.uptime_seconds >= 0


def test_reconnect_pause_and_resume_steer_a_push_subscriber(broker_factory, connect):
    # Given two messages in flight to a push subscriber that does not ack
    b = broker_factory([{"Name": "t", "Subscribers": ["s"], "AckRetry": "1h"}], ["s"])
    sub = broker_factory.subscriber(b, "s", ack=None)
    c = connect(b)
    c.publish("t", [{"Payload": 1}, {"Payload": 2}])
    sub.wait_messages(2)
    # When it reconnects, everything in flight comes again
    assert c.reconnect("s", topic="t") is None
    assert [m["Payload"] for m in sub.wait_messages(4)] == [1, 2, 1, 2]
    # When it is paused, a publish waits in its queue, as STATUS shows typed
    assert c.pause("s") is None
    c.publish("t", [{"Payload": 3}])
    b.settled_status()
    status = c.status("t")
    s = status.topics["t"].subscribers["s"]
    assert (s.paused, s.ready, s.in_flight, s.redelivered, s.takers) == (True, [1], 2, 2, None)
    # When it is resumed, the message goes out
    assert c.resume("s", topic="t") is None
    assert sub.wait_messages(5)[4]["Payload"] == 3
    assert c.status().topics["t"].subscribers["s"].paused is False


def test_the_typed_status_holds_every_key_the_broker_sends(broker_factory, connect):
    # Given a broker with two Pull subscribers, one of them holding a message
    b = broker_factory(PULLED, PULLERS)
    c = connect(b)
    c.publish("jobs", [{"Payload": 1}])
    c.take("jobs", "w")
    # When STATUS is read typed and as the broker sent it
    status = c.status()
    body = c.request({"Command": "STATUS"}).body
    # Then the typed one, encoded again, has the same keys at every level
    assert isinstance(status, Status)
    assert _shape(msgspec.to_builtins(status)) == _shape(body)
    assert status.topics["jobs"].subscribers["w"].takers == 1 and status.listeners["ServerSocket"].connections >= 1


def _shape(value: Any) -> Any:
    """The keys of nested objects, names of topics and subscribers included, without the values."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    return None


def test_a_take_may_wait_longer_than_the_clients_timeout(broker_factory, connect):
    # Given a client whose timeout is shorter than the Wait of its TAKE
    b = broker_factory(PULLED, PULLERS)
    c = connect(b, timeout_s=0.5)
    # When nothing comes within the Wait, the TAKE answers empty, not with a timeout
    assert c.take("jobs", "w", count=5, wait_s=1.0) == []


def test_an_unknown_topic_or_subscriber_raises_client_error_with_the_brokers_404(broker_factory, connect):
    b = broker_factory(PULLED, PULLERS)
    c = connect(b)
    calls: list[Callable[[], Any]] = [
        lambda: c.publish("nowhere", [{"Payload": 1}]),
        lambda: c.status("nowhere"),
        lambda: c.take("nowhere", "w"),
        lambda: c.take("jobs", "nobody"),
        lambda: c.ack("jobs", "nobody", ["1"]),
        lambda: c.peek("nowhere"),
        lambda: c.pause("nobody"),
    ]
    for call in calls:
        with pytest.raises(ClientError) as err:
            call()
        assert err.value.status == 404 and err.value.error, err.value
    # And a bad argument is the broker's 400, naming the field; the connection stays good
    with pytest.raises(ClientError) as err:
        c.nack("jobs", "w", ["1"], delay_s=-1)
    assert err.value.status == 400 and "Delay" in err.value.error
    assert c.ping().version == ppmq_version()


def test_the_asyncio_client_answers_concurrent_requests_on_one_connection(broker_factory):
    b = broker_factory([{"Name": "t", "Priorities": 2, "Subscribers": ["s"]}], ["s"])
    sub = broker_factory.subscriber(b, "s", ack=None)

    async def scenario() -> Status:
        async with await AsyncClient.connect(b.socket) as c:
            # concurrent requests on one connection each get their own reply
            results = await asyncio.gather(*(c.publish("t", [{"Payload": i, "Priority": 1}]) for i in range(5)))
            assert results == [PublishResult(1)] * 5
            keys = [m["Key"] for m in await asyncio.to_thread(sub.wait_messages, 5)]
            assert (await c.ack("t", "s", keys[:2])).accepted == 2
            await c.reconnect("s", "t")
            await asyncio.to_thread(sub.wait_messages, 8)
            with pytest.raises(ClientError) as err:
                await c.publish("t", [{"Payload": 1, "Priority": 2}])
            assert err.value.status == 400 and "Messages[0].Priority" in err.value.error
            return await c.status()

    s = asyncio.run(scenario()).topics["t"].subscribers["s"]
    assert (s.acked, s.in_flight, s.redelivered) == (2, 3, 3)
    assert sorted(sub.payloads()[5:]) == [2, 3, 4]


def test_the_blocking_client_raises_client_error_with_the_brokers_status(broker_factory):
    b = broker_factory([{"Name": "t", "Dedupe": True, "Subscribers": ["s"]}], ["s"])
    with b.client() as c:
        with pytest.raises(ClientError) as err:
            c.publish("t", [{"Payload": 1}])
        assert err.value.status == 400 and err.value.error == "Messages[0].Key: required on topic 't', which has Dedupe"
        with pytest.raises(ClientError) as err:
            c.ack("t", "nobody", ["k"])
        assert err.value.status == 404
        assert c.publish("t", [{"Payload": 1, "Key": "k"}]).accepted == 1  # the connection is still good


def test_a_publish_over_max_frame_bytes_raises_the_brokers_413_not_the_broken_pipe(broker_factory):
    # Given a broker that takes frames of 64 KiB at most
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"], MaxFrameBytes="64KiB")
    # When a publish sends a frame far larger, which the broker refuses before it is all sent
    with b.client() as c, pytest.raises(ClientError) as err:
        c.publish("t", [{"Payload": "x" * (8 << 20)}])
    # Then the error is the broker's, and nothing was stored
    assert (err.value.status, err.value.error) == (413, "frame exceeds MaxFrameBytes (65536 bytes)")
    assert b.status()["Topics"]["t"]["Published"] == 0


@pytest.mark.parametrize("connect", [lambda p: Client(p), lambda p: asyncio.run(AsyncClient.connect(p))])
def test_a_client_that_cannot_reach_the_broker_says_so(short_tmp, connect):
    with pytest.raises(ClientError, match="cannot connect to .*No such file"):
        connect(str(short_tmp / "missing.sock"))
