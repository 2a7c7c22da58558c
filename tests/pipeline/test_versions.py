"""`ppmq report` on journals of both formats: a segment that the last format-1 broker
wrote, followed by format-2 records of the same host after an upgrade; and the rule
by which a format-2 ack finds the version it acked (docs/journal.md, "Versions")."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from ppmq.cli.main import main
from ppmq.core import events as ev
from ppmq.core.events import Event
from ppmq.server.journal import Journal
from tests.data.make_old_journal import ACKED_AFTER_NS, HOST, NOW, NS

DATA = Path(__file__).parent.parent / "data"
ACKED_LATE_NS = 2 * NS  # after the upgrade, the other five acks


def _publish(ts: int, topic: str, ids: list[int], replaced: bool = False) -> Event:
    n = len(ids)
    return Event(event=ev.PUBLISH, ts=ts, topic=topic, ids=ids, prio=[0] * n, bytes=[10] * n, expires_ns=[0] * n, replaced=[replaced] * n)


def _ack(ts: int, topic: str, ids: list[int]) -> Event:
    return Event(event=ev.ACK, ts=ts, topic=topic, subscriber="a", ids=ids)


def _versions() -> list[list[Event]]:
    """Host `versions`, topic `latest` (Dedupe: a key keeps its id, 1 here): published at
    0 s and acked at 1 s; replaced at 5 s and acked at 5.5 s; acked at 8 s in the step
    that replaces it again (the ack came first, so it acked the 5 s version: 3 s).
    Id 1 of topic `other` published at 7.9 s is another message; id 99 was published
    before the journal begins: acked, with no latency."""
    return [
        [_publish(NOW, "latest", [1])],
        [_ack(NOW + NS, "latest", [1])],
        [_publish(NOW + 5 * NS, "latest", [1], replaced=True)],
        [_ack(NOW + 11 * NS // 2, "latest", [1])],
        [_publish(NOW + 79 * NS // 10, "other", [1])],
        [_ack(NOW + 8 * NS, "latest", [1]), _publish(NOW + 8 * NS, "latest", [1], replaced=True)],
        [_ack(NOW + 9 * NS, "latest", [99])],
    ]


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of two hosts: `upgraded`, whose journal holds the format-1 segment
    and then the format-2 acks of the five messages still in flight; `versions`."""
    base = tmp_path_factory.mktemp("versions")
    upgraded = base / "journals" / HOST
    upgraded.mkdir(parents=True)
    shutil.copy(DATA / "journal-v1.jsonl.gz", upgraded / "journal-20261124T000000000000000Z.jsonl.gz")
    journal = Journal(upgraded, 1 << 20, 1 << 30, host=HOST).start()
    journal.put([_ack(NOW + ACKED_LATE_NS, "orders", [6, 7, 8, 9, 10])])
    journal.close()
    journal = Journal(base / "journals" / "versions", 1 << 20, 1 << 30, host="versions").start()
    for step in _versions():
        journal.put(step)
    journal.close()
    assert main(["report", str(base / "journals"), "--out", str(base / "out")]) == 0
    return base / "out"


def _rows(spark: SparkSession, out: Path, table: str) -> dict[str, dict]:
    return {r["host"]: r.asDict() for r in spark.read.parquet(str(out / table)).collect()}


def test_a_format_2_ack_finds_its_publish_in_a_format_1_segment(spark: SparkSession, out: Path) -> None:
    """Five acks half a second after the publish, in format 1, and five two seconds
    after it, in format 2: ranks 5 and 10 of the ten latencies."""
    sub = _rows(spark, out, "subscribers")[HOST]
    assert (sub["topic"], sub["subscriber"], sub["messages"], sub["delivered"], sub["acked"]) == ("orders", "a", 10, 10, 10)
    assert sub["ack_p50_s"] == pytest.approx(ACKED_AFTER_NS / NS, rel=0.01)
    assert sub["ack_p99_s"] == pytest.approx(ACKED_LATE_NS / NS, rel=0.01)
    host = _rows(spark, out, "hosts")[HOST]
    assert (host["records"], host["events"], host["unknown_version_records"]) == (4, 10 + 10 + 5 + 5, 0)


def test_a_format_2_ack_takes_the_last_publish_of_its_id_before_it(spark: SparkSession, out: Path) -> None:
    """The latencies are 1 s, 0.5 s and 3 s: p50 is 1 s, p95 and p99 are 3 s; the ack of an
    id whose publish is not in the journal counts, without a latency."""
    sub = _rows(spark, out, "subscribers")["versions"]
    assert (sub["topic"], sub["acked"], sub["replaced"]) == ("latest", 4, 2)
    assert [sub[c] for c in ("ack_p50_s", "ack_p95_s", "ack_p99_s")] == pytest.approx([1.0, 3.0, 3.0], rel=0.01)
