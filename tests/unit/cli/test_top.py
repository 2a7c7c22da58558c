"""`ppmq top`'s table from two STATUS replies: rates over the interval, and lines
that fit the terminal's width."""

from __future__ import annotations

import msgspec

from ppmq.cli.top import Sample, age, rate, table
from ppmq.client.results import Status


def status(published: int, delivered: int, acked: int, name: str = "worker") -> Status:
    sub = {
        "Ready": [1000, 20000, 3, 0, 5],
        "InFlight": 12,
        "OldestReadyAge": 75.2,
        "Delivered": delivered,
        "Acked": acked,
        "Redelivered": 0,
        "Expired": 0,
        "IgnoredAcks": 0,
        "DeadLettered": 0,
        "Paused": True,
        "Delayed": 0,
        "Connected": False,
    }
    topic = {"Stored": 1, "Published": published, "Replaced": 0, "Expired": 0, "StoredBytes": 0, "Dropped": 0, "Subscribers": {name: sub}}
    body = {"Topics": {"jobs": topic}, "Rejected": 0, "Forbidden": 0, "Commits": 0, "StoreUsedBytes": 0, "StoreMaxBytes": 1 << 30}
    return msgspec.convert(body, Status)


def test_rates_are_the_counters_change_per_second_over_the_interval() -> None:
    before, now = Sample(10.0, status(100, 50, 40)), Sample(12.0, status(180, 130, 120))
    header, topic, worker = table(before, now, None)
    assert topic.split()[:4] == ["jobs", "40.0", "40.0", "40.0"]
    assert worker.split() == ["worker", "40.0", "40.0", "1000/20000/3/0/5", "12", "1m15s", "no", "yes"]


def test_the_first_table_has_no_rates_yet() -> None:
    _, topic, worker = table(None, Sample(1.0, status(5, 5, 5)), None)
    assert topic.split()[1:4] == ["-", "-", "-"]
    assert worker.split()[1:3] == ["-", "-"]


def test_a_long_name_is_cut_to_fit_80_columns() -> None:
    long = "a-subscriber-with-a-name-much-longer-than-an-80-column-terminal-has-room-for"
    lines = table(Sample(0.0, status(0, 0, 0, long)), Sample(1.0, status(1, 1, 1, long)), 79)
    assert max(map(len, lines)) <= 79
    # the name keeps its first characters, READY its first priorities, the counts stay whole
    assert lines[2].split() == ["a-subscri…", "1.0", "1.0", "1000/2000…", "12", "1m15s", "no", "yes"]
    assert lines[0].split() == ["TOPIC/SUB", "PUB/s", "DELIV/s", "ACK/s", "READY", "INFLIGHT", "OLDEST", "CONN", "PAUSED"]


def test_rate_and_age_are_short() -> None:
    assert [rate(n, 0, 1.0) for n in (0, 5, 150, 25_000)] == ["0.0", "5.0", "150", "25k"]
    assert rate(3, 10, 1.0) == "3.0"  # a counter that started again
    assert [age(a) for a in (None, 0.42, 42.9, 303, 7800)] == ["-", "0.4s", "42s", "5m03s", "2h10m"]


def test_ready_is_cut_only_by_what_the_names_do_not_leave() -> None:
    # Given short names and a READY of 16 characters, which make a line 3 longer than 79 columns
    before, now = Sample(0.0, status(0, 0, 0, "w")), Sample(1.0, status(1, 1, 1, "w"))
    lines = table(before, now, 79)
    assert max(map(len, lines)) <= 79
    # Then READY loses those 3 characters, and no name is cut
    assert lines[2].split()[0] == "w" and lines[2].split()[3] == "1000/20000/3…"
    assert lines[1].split()[0] == "jobs"
