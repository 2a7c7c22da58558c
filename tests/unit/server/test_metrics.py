"""The metrics' rendering and their textfile, on a real filesystem (PROTOCOL §10)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ppmq.server.metrics import exposition, write_textfile

# A STATUS body as a broker without a daemon around it answers: no Connected, no CommitSeconds.
BODY = {
    "Topics": {
        "t": {
            "Stored": 1,
            "Published": 4,
            "Replaced": 0,
            "Expired": 1,
            "StoredBytes": 30,
            "Dropped": 0,
            "Subscribers": {
                "s": {
                    "Ready": [0, 1],
                    "InFlight": 0,
                    "OldestReadyAge": None,
                    "Delivered": 3,
                    "Acked": 2,
                    "Redelivered": 0,
                    "Expired": 1,
                    "IgnoredAcks": 0,
                    "DeadLettered": 0,
                    "Paused": False,
                    "Delayed": 0,
                }
            },
        }
    },
    "Rejected": 0,
    "Forbidden": 0,
    "Commits": 9,
    "StoreUsedBytes": 8192,
    "StoreMaxBytes": 1 << 30,
}


def test_a_body_without_the_process_facts_renders_the_rest_with_subscribers_disconnected() -> None:
    fams = {f.name: f for f in text_string_to_metric_families(exposition(BODY).decode())}
    assert "ppmq_commit_duration_seconds" not in fams
    assert [(s.labels, s.value) for s in fams["ppmq_subscriber_connected"].samples] == [({"subscriber": "s"}, 0)]
    assert [s.value for s in fams["ppmq_oldest_ready_age_seconds"].samples] == [0]
    assert [s.labels["priority"] for s in fams["ppmq_ready_messages"].samples] == ["0", "1"]


def test_the_textfile_is_readable_by_others_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)  # the service's UMask
    try:
        write_textfile(str(tmp_path / "ppmq.prom"), b"x 1\n")
    finally:
        os.umask(old)
    assert (tmp_path / "ppmq.prom").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["ppmq.prom"]


def test_the_temp_file_is_not_named_like_a_textfile(tmp_path: Path) -> None:
    # Given a target the rename cannot replace (a directory that is not empty)
    target = tmp_path / "ppmq.prom"
    (target / "inside").mkdir(parents=True)
    # When the textfile is written there
    with pytest.raises(OSError):
        write_textfile(str(target), b"x 1\n")
    # Then what was left behind is a temp file that node_exporter's collector skips
    left = [p.name for p in tmp_path.iterdir() if p != target]
    assert len(left) == 1 and not left[0].endswith(".prom")


def test_commit_times_count_as_prometheus_clients_own_histogram_does() -> None:
    # Given the same durations observed by CommitTimes and by prometheus_client's Histogram,
    # bounds themselves among them (a bucket holds what is at most its bound)
    from prometheus_client import Histogram

    from ppmq.server.metrics import COMMIT_BUCKETS_S, CommitTimes

    ours, theirs = CommitTimes(), Histogram("h", "h", buckets=COMMIT_BUCKETS_S, registry=None)
    for seconds in (0.0001, 0.0005, 0.0007, 0.001, 0.003, 0.003, 0.5, 9.9, 10.0, 11.0, 60.0):
        ours.observe(seconds)
        theirs.observe(seconds)
    # Then the bodies have the same cumulative buckets, labelled alike, and the same sum
    samples = theirs.collect()[0].samples
    expected = {s.labels["le"]: int(s.value) for s in samples if s.name.endswith("_bucket")}
    body = ours.body()
    assert body["Buckets"] == expected and list(body["Buckets"]) == list(expected)
    assert body["Sum"] == pytest.approx(next(s.value for s in samples if s.name.endswith("_sum")))
