"""PHPMQ access by peer credentials (PROTOCOL §9): a topic's `Publishers` for a
send, the PhpmqSubscriber's `Users` for consume, ack, re-queue and dead letter, with
throwaway users as tests/wire/test_access.py makes them. The protocol has no
error reply: a refusal closes the connection, is logged, and counts in Forbidden."""

from __future__ import annotations

import pytest

from tests.conftest import wait_for
from tests.wire import phpmq_client as pm
from tests.wire.phpmq_client import PhpmqClient
from tests.wire.test_access import as_user, open_tmp, pytestmark, users  # noqa: F401 - fixtures and marks

WAIT_OPEN_S = 1.0  # how long an allowed frame's connection must stay open


def _closed_after(path: str, frame: bytes) -> bool:
    """In the child: send frame; whether the broker closes the connection."""
    with PhpmqClient(path) as c:
        c.write(frame)
        return c.closed_by_peer(WAIT_OPEN_S)


def closed_after(user, b, frame: bytes) -> bool:
    return as_user(user, _closed_after, b.config["PhpmqSocket"], frame)()


@pytest.fixture
def broker(broker_factory, open_tmp, users):  # noqa: F811 - fixtures
    topics = [{"Name": "q", "Subscribers": ["w"], "PhpmqSubscriber": "w", "Publishers": [users.alice.name]}]
    subs = [{"Name": "w", "Pull": True, "Socket": None, "Users": [users.alice.name]}]
    return broker_factory(topics, subs, PhpmqSocket=str(open_tmp / "phpmq.sock"), SocketMode="0666")


def test_publishers_decide_who_may_send_and_a_refused_send_closes_the_connection(broker, users):  # noqa: F811
    assert not closed_after(users.alice, broker, pm.send("q", "from alice"))
    assert closed_after(users.bob, broker, pm.send("q", "from bob"))
    with broker.client() as c:
        stored = c.request({"Command": "PEEK", "Topic": "q", "Id": 1}).body["Messages"]
    assert [m["Payload"] for m in stored] == ["from alice"]
    assert "refused (403)" in broker.log and "(Publishers)" in broker.log
    assert broker.status()["Forbidden"] == 1


@pytest.mark.parametrize(
    "frame",
    [pm.consume("q", 1), pm.ack("q", "1"), pm.requeue("q", "1", 60), pm.dead_letter("q", "1")],
    ids=["consume", "ack", "requeue", "dead letter"],
)
def test_the_subscribers_users_decide_who_may_consume_ack_requeue_and_dead_letter(broker, users, frame):  # noqa: F811
    assert not closed_after(users.alice, broker, frame)
    assert closed_after(users.bob, broker, frame)
    wait_for(lambda: broker.status()["Forbidden"] == 1, what="Forbidden 1")
    assert "(Users)" in broker.log
