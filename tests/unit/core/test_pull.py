"""Pull subscribers at the Broker level (PROTOCOL §9): who took what, Abandoned,
and a restart, with a fake clock and a real store."""

from __future__ import annotations

import msgspec

from ppmq.config import Config, SubscriberConfig, TopicConfig
from ppmq.core.broker import Broker
from ppmq.core.ops import Abandoned, Take
from ppmq.protocol import messages as p
from ppmq.store.state import NS
from ppmq.store.store import Store

NOW = 1_800_000_000 * NS


def open_pull_broker(path, window: int = 100, **topic: object) -> tuple[Broker, Store]:
    """Topic `t` taken by the Pull subscriber `w`, on a real store at path."""
    config = Config(
        server_socket="/nonexistent",
        data_path=str(path),
        sync=False,
        subscribers=[SubscriberConfig(name="w", pull=True, window=window)],
        topics=[TopicConfig(name="t", subscribers=["w"], **topic)],
    )
    store = Store(str(path), sync=False, max_bytes=1 << 24)
    return Broker(config, store, NOW), store


def publish(broker: Broker, n: int) -> None:
    messages = [p.Message(payload=msgspec.Raw(b"%d" % i)) for i in range(n)]
    assert broker.step([p.Request(topic="t", messages=messages, id=msgspec.Raw(b"1"))], set(), NOW).replies[0].status == 200


def take(broker: Broker, taker: int, count: int, **wrapper: object) -> list[str]:
    """The keys a TAKE of `taker` gets."""
    req = p.Request(topic="t", subscriber="w", command="TAKE", count=count, id=msgspec.Raw(b"2"), **wrapper)
    (reply,) = broker.step([Take(taker, req)], set(), NOW).replies
    assert reply.status == 200, reply.error
    return [msgspec.json.decode(bytes(m))["Key"] for m in reply.body["Messages"]]


def test_an_abandoned_takers_messages_are_ready_again_at_their_place_and_the_others_stay_taken(tmp_path):
    # Given two takers holding two messages each, of four published
    broker, store = open_pull_broker(tmp_path)
    publish(broker, 4)
    first, second = take(broker, 1, 2), take(broker, 2, 2)
    assert (first, second) == (["1", "2"], ["3", "4"])
    assert broker.holders("t", "w") == {1, 2}
    # When taker 1 goes away
    broker.step([Abandoned(1)], set(), NOW)
    # Then its messages are ready again, first in line, as a second delivery; taker 2 keeps its own
    stats = broker.state.subs["t"]["w"]
    assert (stats.ready, stats.inflight, stats.redelivered) == ([2], 2, 0)
    assert broker.holders("t", "w") == {2}
    assert take(broker, 3, 10) == ["1", "2"]
    assert broker.state.subs["t"]["w"].redelivered == 2
    store.close()


def test_an_ack_from_any_connection_releases_what_a_taker_holds(tmp_path):
    # Given a taker holding two messages
    broker, store = open_pull_broker(tmp_path)
    publish(broker, 2)
    keys = take(broker, 1, 2)
    # When another connection acks one of them (a plain request: no taker)
    ack = p.Request(topic="t", subscriber="w", acks=keys[:1], id=msgspec.Raw(b"3"))
    assert broker.step([ack], set(), NOW).replies[0].accepted == 1
    # Then only the other goes back when the taker goes away
    broker.step([Abandoned(1)], set(), NOW)
    stats = broker.state.subs["t"]["w"]
    assert (stats.acked, stats.ready, stats.inflight) == (1, [1], 0)
    assert take(broker, 2, 10) == keys[1:]
    store.close()


def test_acks_in_a_take_apply_first_and_free_window_room_for_it(tmp_path):
    # Given a Window of 2, full
    broker, store = open_pull_broker(tmp_path, window=2)
    publish(broker, 4)
    keys = take(broker, 1, 5)
    assert keys == ["1", "2"] and take(broker, 2, 5) == []
    # When the taker acks them in its next TAKE
    # Then the acks free the room the TAKE fills
    assert take(broker, 1, 5, acks=keys) == ["3", "4"]
    assert broker.state.subs["t"]["w"].acked == 2
    store.close()


def test_a_taker_that_goes_away_after_max_attempts_gives_the_message_up(tmp_path):
    # Given a message whose every delivery is abandoned, on a topic with MaxAttempts 2
    broker, store = open_pull_broker(tmp_path, max_attempts=2)
    publish(broker, 1)
    # When two takers in turn take it and go away
    for taker in (1, 2):
        assert take(broker, taker, 1) == ["1"]
        broker.step([Abandoned(taker)], set(), NOW)
    # Then it is given up on (no DeadLetter: dropped)
    stats = broker.state.subs["t"]["w"]
    assert (stats.ready, stats.inflight, stats.dead_lettered) == ([0], 0, 1)
    assert broker.state.topics["t"].stored == 0
    store.close()


def test_every_taken_message_is_ready_again_after_a_restart(tmp_path):
    # Given messages taken and not acked, and the broker gone
    broker, store = open_pull_broker(tmp_path, ack_retry=3600.0)
    publish(broker, 3)
    assert take(broker, 1, 2) == ["1", "2"]
    store.close()
    # When it opens the store again
    broker, store = open_pull_broker(tmp_path, ack_retry=3600.0)
    # Then nobody holds anything and everything is ready, at its place
    stats = broker.state.subs["t"]["w"]
    assert (stats.ready, stats.inflight) == ([3], 0)
    assert take(broker, 1, 10) == ["1", "2", "3"]
    store.close()


def test_a_take_undone_by_a_failed_request_leaves_no_owner(tmp_path):
    # Given a taker that took a message
    broker, store = open_pull_broker(tmp_path)
    publish(broker, 2)
    assert take(broker, 1, 1) == ["1"]
    # When a TAKE of another taker fails after its acks applied (Count out of range)
    bad = p.Request(topic="t", subscriber="w", command="TAKE", count=0, acks=["1"], id=msgspec.Raw(b"4"))
    (reply,) = broker.step([Take(2, bad)], set(), NOW).replies
    # Then its acks are undone with it: taker 1 still holds the message
    assert reply.status == 400 and "Count" in reply.error
    assert broker.holders("t", "w") == {1}
    broker.step([Abandoned(1)], set(), NOW)
    assert broker.state.subs["t"]["w"].ready == [2]
    store.close()


def test_take_is_refused_for_a_request_without_a_taker_or_without_an_id(tmp_path):
    broker, store = open_pull_broker(tmp_path)
    no_taker = p.Request(topic="t", subscriber="w", command="TAKE", id=msgspec.Raw(b"5"))
    no_id = p.Request(topic="t", subscriber="w", command="TAKE")
    replies = broker.step([no_taker, Take(1, no_id)], set(), NOW).replies
    assert [r.status for r in replies] == [400, 400]
    assert "ServerSocket" in replies[0].error and "Id" in replies[1].error
    store.close()


def test_a_message_given_up_at_start_into_a_pull_subscribers_dead_letter_topic_is_ready_there(tmp_path):
    # Given a message taken for the last time it may be (MaxAttempts 1), whose
    # DeadLetter topic `dl` is taken from by the Pull subscriber `d`, and the broker gone
    def open_broker() -> Broker:
        config = Config(
            server_socket="/nonexistent",
            data_path=str(tmp_path),
            sync=False,
            subscribers=[SubscriberConfig(name="w", pull=True), SubscriberConfig(name="d", pull=True)],
            topics=[
                TopicConfig(name="t", subscribers=["w"], max_attempts=1, dead_letter="dl", ack_retry=3600.0),
                TopicConfig(name="dl", subscribers=["d"]),
            ],
        )
        return Broker(config, Store(str(tmp_path), sync=False, max_bytes=1 << 24), NOW)

    broker = open_broker()
    publish(broker, 1)
    assert take(broker, 1, 1) == ["1"]
    broker.store.close()
    # When it opens the store again: the taker is gone, and the message is given up on
    broker = open_broker()
    # Then its copy waits in dl's queue for d, as counted, and a TAKE gets it
    assert broker.state.subs["t"]["w"].dead_lettered == 1
    assert broker.state.subs["dl"]["d"].ready == [1]
    req = p.Request(topic="dl", subscriber="d", command="TAKE", count=10, id=msgspec.Raw(b"2"))
    (reply,) = broker.step([Take(1, req)], set(), NOW).replies
    assert reply.status == 200 and len(reply.body["Messages"]) == 1
    broker.store.close()
