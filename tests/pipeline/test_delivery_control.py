"""`ppmq report` on a journal of delivery control (PROTOCOL §8): nacks, rejects,
touches, purges, redrives and pauses, written by the journal itself from the
events the broker's state machine reports, counted per topic and subscriber."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from ppmq.cli.main import main
from ppmq.core import events as ev
from ppmq.core.events import Event
from ppmq.server.journal import Journal

NS = 1_000_000_000
T0 = 1_795_300_000 * NS
PUB = [T0] * 10  # PubNs of ids 1-10, published together


def _event(kind: str, s: float, sub: str, ids: tuple[int, ...] = (), **columns: object) -> Event:
    """An event of topic t, s seconds after T0."""
    return Event(event=kind, ts=T0 + int(s * NS), topic="t", subscriber=sub, ids=list(ids), **columns)


def _sent(kind: str, s: float, sub: str, ids: tuple[int, ...], attempt: int, **columns: object) -> Event:
    """An event with the columns of messages in flight: PubNs and Attempts."""
    return _event(kind, s, sub, ids, pub_ns=PUB[: len(ids)], attempts=[attempt] * len(ids), **columns)


def _deliver(s: float, sub: str, ids: tuple[int, ...], attempt: int = 1) -> Event:
    return _sent(ev.DELIVER, s, sub, ids, attempt, bytes=[50] * len(ids))


def _subscriber_a() -> list[Event]:
    """a is delivered 1-10, acks 1-4, nacks 5 and 6 with a Delay and 7 without,
    rejects 8, touches 9 and 10 and 9 again and acks them; 5-7 come again and are acked; 8 is
    redriven to it as id 11, delivered and acked: 14 deliveries, 3 nacks, 1 reject."""
    return [
        _deliver(1, "a", tuple(range(1, 11))),
        _sent(ev.ACK, 2, "a", (1, 2, 3, 4), 1),
        _sent(ev.NACK, 2, "a", (5, 6), 1, delay_ns=30 * NS),
        _sent(ev.NACK, 3, "a", (7,), 1),
        _sent(ev.REJECTED, 3, "a", (8,), 1),
        _event(ev.TOUCH, 4, "a", (9, 10)),
        _event(ev.TOUCH, 5, "a", (9,)),
        _sent(ev.ACK, 6, "a", (9, 10), 1),
        _deliver(33, "a", (5, 6, 7), attempt=2),
        _sent(ev.ACK, 34, "a", (5, 6, 7), 2),
        _event(ev.REDRIVE, 40, "a", (11,)),
        _deliver(41, "a", (11,)),
        _sent(ev.ACK, 42, "a", (11,), 1),
    ]


def _subscriber_b() -> list[Event]:
    """b is delivered 1-5, paused, resumed and paused again, then all ten of its
    copies are purged, the five in flight and the five ready."""
    return [
        _deliver(1, "b", (1, 2, 3, 4, 5)),
        _event(ev.PAUSE, 2, "b"),
        _event(ev.RESUME, 3, "b"),
        _event(ev.PAUSE, 4, "b"),
        _event(ev.PURGE, 5, "b", tuple(range(1, 11)), pub_ns=PUB, delivered=[True] * 5 + [False] * 5),
    ]


def _steps() -> list[list[Event]]:
    """One step per event, after the publish of ids 1-10; `idle` is paused before it is delivered anything."""
    publish = Event(
        event=ev.PUBLISH,
        ts=T0,
        topic="t",
        ids=list(range(1, 11)),
        prio=[0] * 10,
        bytes=[50] * 10,
        expires_ns=[0] * 10,
        replaced=[False] * 10,
    )
    return [[e] for e in [publish, *_subscriber_a(), *_subscriber_b(), _event(ev.PAUSE, 6, "idle")]]


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of a journal written by `Journal`, as a broker writes it."""
    base = tmp_path_factory.mktemp("control")
    journal = Journal(base / "journal", 1 << 20, 1 << 30, host="dc").start()
    for step in _steps():
        journal.put(step)
    journal.close()
    assert main(["report", str(base / "journal"), "--out", str(base / "out")]) == 0
    return base / "out"


def _subscribers(spark: SparkSession, out: Path) -> dict[str, dict]:
    """The report's subscribers table, by subscriber (one host, one topic)."""
    return {r["subscriber"]: r.asDict() for r in spark.read.parquet(str(out / "subscribers")).collect()}


def test_nacks_rejects_touches_purges_redrives_and_pauses_are_counted_per_subscriber(spark: SparkSession, out: Path) -> None:
    subs = _subscribers(spark, out)
    columns = ["delivered", "acked", "nacks", "delayed_nacks", "rejected", "touches", "purged", "redriven", "pauses", "resumes"]
    assert {name: [r[c] for c in columns] for name, r in subs.items()} == {
        "a": [14, 10, 3, 2, 1, 3, 0, 1, 0, 0],
        "b": [5, 0, 0, 0, 0, 0, 10, 0, 2, 1],
        "idle": [0, 0, 0, 0, 0, 0, 0, 0, 1, 0],
    }


def test_nack_and_reject_rates_are_per_delivered_message(spark: SparkSession, out: Path) -> None:
    """a: 3 nacks and 1 reject in 14 deliveries, the 3 nacked ones redelivered;
    idle was delivered nothing, so its rates are unknown, not 0."""
    subs = _subscribers(spark, out)
    rates = ["redelivery_rate", "nack_rate", "reject_rate"]
    assert [subs["a"][c] for c in rates] == pytest.approx([3 / 14, 3 / 14, 1 / 14])
    assert [subs["b"][c] for c in rates] == [0.0, 0.0, 0.0]
    assert [subs["idle"][c] for c in rates] == [None, None, None]


def test_records_without_messages_count_as_one_event_each(spark: SparkSession, out: Path) -> None:
    """Every message entry of every record, and one for each pause and resume."""
    (host,) = [r.asDict() for r in spark.read.parquet(str(out / "hosts")).collect()]
    entries = sum(len(e.ids) for step in _steps() for e in step)
    assert (host["records"], host["events"], host["unknown_version_records"]) == (len(_steps()), entries + 4, 0)


def test_the_subscribers_table_of_the_page_shows_the_rates_and_redrives(out: Path) -> None:
    """Rates as percentages; idle's, which are unknown, say why."""
    page = (out / "report.html").read_text().split("<h2>Subscribers</h2>")[1].split("<h2>")[0]
    for column in ("nack_rate", "reject_rate", "redriven", "pauses"):
        assert f"<th>{column}</th>" in page
    row = {
        sub: re.findall(r"<td>([^<]*)</td>", found.group())
        for sub in ("a", "idle")
        if (found := re.search(rf'<tr data-host="dc">(<td class="text">[^<]*</td>){{2}}<td class="text">{sub}</td>.*?</tr>', page))
    }
    assert row["a"].count("21.4%") == 2 and row["a"].count("7.14%") == 1  # redeliveries and nacks, rejects: of 14
    assert row["idle"].count("nothing delivered") == 3
