"""Which queued ops may wait for company (server/gathering.py), asked of a real broker."""

from __future__ import annotations

from ppmq.server.gathering import Gathering
from tests.unit.core.test_broker import publish
from tests.unit.server.test_group_commit import _a_full_window_in_flight


def test_a_late_subscriber_is_waited_for_again_once_its_next_acks_come(tmp_path, monkeypatch):
    # Given s with a whole Window in flight and nothing ready
    broker, store, acks = _a_full_window_in_flight(tmp_path, monkeypatch, gather_s=0.2)
    company = Gathering(broker)
    # A publish waits for s's acks
    assert company.add(publish(b"1"))
    # When they do not come in time
    company.ran_out()
    # Then the next publish does not wait for s
    company.clear()
    assert not company.add(publish(b"2"))
    # Until s's next acks come (a publish queued behind them has no need to wait)
    company.clear()
    assert company.add(acks)
    assert not company.add(publish(b"3"))
    # After which a publish waits for s again, its Window still being full
    company.clear()
    assert company.add(publish(b"4"))
    store.close()


def test_a_publish_waits_until_the_acks_of_every_subscriber_it_waits_for_are_queued(tmp_path, monkeypatch):
    # Given s with a whole Window in flight, and a publish waiting for its acks
    broker, store, acks = _a_full_window_in_flight(tmp_path, monkeypatch, gather_s=0.2)
    company = Gathering(broker)
    assert company.add(publish(b"1"))
    # When s's acks are queued, then the wait is over
    assert not company.add(acks)
    # And an op that comes next does not start it again
    assert not company.add(publish(b"2"))
    # Nor does a recount of the same ops (as after a step)
    company.recount([publish(b"1"), acks])
    assert not company.may_wait
    store.close()
