"""PROTOCOL §3 Connections: a subscriber whose socket is missing or refuses is
retried with capped exponential backoff, logged only when its state changes,
served promptly once it is up, and never slows the others."""

from __future__ import annotations

import os
import socket
import time

from ..conftest import wait_for

TOPICS = [{"Name": "t", "Subscribers": ["up", "down"]}]


def test_a_missing_socket_is_retried_quietly_and_served_within_retry_max_once_it_appears(broker_factory):
    b = broker_factory(TOPICS, ["up", "down"], RetryMax="300ms")
    up = broker_factory.subscriber(b, "up")
    with b.client() as c:
        c.publish("t", [{"Payload": i} for i in range(20)])
    up.wait_messages(20)
    time.sleep(1.5)  # several retries at the 300 ms cap
    assert b.log.count("subscriber down: cannot connect") == 1, b.log

    appeared = time.monotonic()
    down = broker_factory.subscriber(b, "down")
    down.wait_messages(20)
    assert time.monotonic() - appeared < 0.3 * 1.2 + 3.0  # one capped retry with jitter, plus slack for a busy host
    assert b.log.count("subscriber down: connected") == 1


def test_a_socket_that_refuses_changes_the_logged_state_once(broker_factory):
    b = broker_factory(TOPICS, ["up", "down"], RetryMax="200ms", start=False)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a socket file nobody accepts on
    path = b.sub_socket("down")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    dead.bind(path)
    b.start()
    with b.client() as c:
        c.publish("t", [{"Payload": 1}])
    wait_for(lambda: "down.sock (ConnectionRefusedError" in b.log, what="the refusal to be logged")
    time.sleep(1.0)
    assert b.log.count("subscriber down: cannot connect") == 1
    dead.close()
    os.unlink(path)
    wait_for(lambda: "down.sock (FileNotFoundError" in b.log, what="the new state (socket gone) to be logged")
    assert b.log.count("subscriber down: cannot connect") == 2, b.log


def test_a_subscriber_with_nothing_pending_is_not_connected_to(broker_factory):
    """So that systemd starts a socket-activated subscriber only when there is work."""
    b = broker_factory(TOPICS, ["up", "down"], RetryMax="100ms")
    up = broker_factory.subscriber(b, "up")
    # (steps since the start, after each of which every link looked whether to connect)
    status = b.settled_status()["Topics"]["t"]["Subscribers"]
    assert not status["up"]["Connected"] and not status["down"]["Connected"]
    assert up.connections == 0 and "cannot connect" not in b.log
    with b.client() as c:
        c.publish("t", [{"Payload": 1}])
    up.wait_messages(1)
    wait_for(lambda: b.sub_status("t", "up")["InFlight"] == 0, what="the ack")
    assert up.connections == 1


def test_a_failing_subscriber_does_not_slow_the_others(broker_factory):
    b = broker_factory(TOPICS, ["up", "down"], RetryMax="100ms")
    up = broker_factory.subscriber(b, "up")
    with b.client() as c:
        for i in range(20):
            c.publish("t", [{"Payload": i * 100 + j} for j in range(100)])
    up.wait_messages(2000)
    assert sorted(up.payloads()) == list(range(2000))
    assert b.sub_status("t", "down")["Ready"] == [2000]
