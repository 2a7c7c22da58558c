"""`ppmq report` on a journal shaped like a busy broker's: records of 1, 10 and 100
messages, redeliveries after AckRetry; and what it prints, quiet or --verbose."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from ppmq.cli.main import main

NS = 1_000_000_000
T0 = 1_795_300_000 * NS
SIZES = (1, 100, 10)  # messages per publish request, ids 1, 2-101, 102-111
ACK_AFTER_S = (0.01, 0.5, 2.0)  # per request; the last request's ids 107-111 time out instead
RETRY_ACK_S = 30.0


def _record(event: str, ts: int, ids: list[int], **fields: object) -> dict:
    where = {"Topic": "t"} | ({"Subscriber": "a"} if event != "publish" else {})
    return {"V": 1, "Host": "mix", "Event": event, "Ts": ts, **where, "Ids": ids, **fields}


def _journal() -> list[dict]:
    """Three publishes delivered as they came, acked after known delays, five redelivered."""
    out, first = [], 1
    for n, (size, ack_s) in enumerate(zip(SIZES, ACK_AFTER_S)):
        pub = T0 + n * NS
        ids = list(range(first, first + size))
        first += size
        acked = ids[:5] if size == 10 else ids
        out += [
            _record("publish", pub, ids, Bytes=[100] * size, Prio=[0] * size, ExpiresNs=[0] * size, Replaced=[False] * size),
            _record("deliver", pub + 1000, ids, PubNs=[pub] * size, Attempts=[1] * size, Bytes=[100] * size),
            _record("ack", pub + int(ack_s * NS), acked, PubNs=[pub] * len(acked), Attempts=[1] * len(acked)),
        ]
    late, pub = list(range(107, 112)), T0 + 2 * NS
    out += [
        _record("requeue", pub + 5 * NS, late, Reason="AckRetry"),
        _record("deliver", pub + 5 * NS, late, PubNs=[pub] * 5, Attempts=[2] * 5, Bytes=[100] * 5),
        _record("ack", pub + int(RETRY_ACK_S * NS), late, PubNs=[pub] * 5, Attempts=[2] * 5),
    ]
    return out


def _format_2(record: dict) -> dict:
    """The record as format 2 writes it: an ack has its ids only, a column whose
    entries are all equal is written once."""
    if record["Event"] == "ack":
        record = {k: v for k, v in record.items() if k not in ("PubNs", "Attempts")}
    once = lambda k, v: k != "Ids" and isinstance(v, list) and v.count(v[0]) == len(v)  # noqa: E731
    return {k: v[:1] if once(k, v) else v for k, v in record.items()} | {"V": 2}


def _written(tmp_path_factory: pytest.TempPathFactory, records: list[dict]) -> Path:
    path = tmp_path_factory.mktemp("mixed") / "journal" / "journal-1.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path.parent


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _written(tmp_path_factory, _journal())


@pytest.fixture(scope="module", params=[1, 2], ids=["format1", "format2"])
def either(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The journal in either format: the same tables come of it."""
    return _written(tmp_path_factory, _journal() if request.param == 1 else list(map(_format_2, _journal())))


def test_mixed_record_sizes_and_redeliveries_give_the_known_tables(spark: SparkSession, either: Path, tmp_path: Path) -> None:
    assert main(["report", str(either), "--out", str(tmp_path)]) == 0
    (sub,) = [r.asDict() for r in spark.read.parquet(str(tmp_path / "subscribers")).collect()]
    assert (sub["messages"], sub["delivered"], sub["redelivered"], sub["acked"], sub["ack_timeouts"]) == (111, 116, 5, 111, 5)
    # sorted ack latencies: 0.01 once, 0.5 100 times, 2.0 5 times, 30 5 times; ranks 56, 106, 110
    assert (sub["ack_p50_s"], sub["ack_p95_s"], sub["ack_p99_s"]) == pytest.approx((0.5, 2.0, RETRY_ACK_S), rel=0.01)
    (host,) = [r.asDict() for r in spark.read.parquet(str(tmp_path / "hosts")).collect()]
    assert (host["records"], host["events"]) == (12, 111 + 116 + 111 + 5)
    assert [p.name for p in (tmp_path / "records").iterdir() if p.is_dir()] == ["host=mix"]


@pytest.mark.parametrize("verbose", [False, True])
def test_spark_speaks_on_stderr_only_with_verbose(journal: Path, tmp_path: Path, verbose: bool) -> None:
    """A report in a JVM of its own: without --verbose nothing but its summary line."""
    command = [sys.executable, "-m", "ppmq.cli", "report", str(journal), "--out", str(tmp_path / "out"), "--master", "local[1]"]
    done = subprocess.run(
        command + ["--verbose"] * verbose, capture_output=True, text=True, timeout=300, env={**os.environ, "PYSPARK_PYTHON": sys.executable}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("343 events from 1 hosts")
    if verbose:
        assert "log4j" in done.stderr
    else:
        assert done.stderr == ""
