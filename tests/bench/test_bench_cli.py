"""`ppmq bench` end to end on tiny workloads against ppmq alone: it starts a real
broker and real client processes and writes its results. No figure is asserted:
speed is the benchmark's business, not the tests'."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_bench_runs_every_workload_on_ppmq_and_writes_results(short_tmp: Path) -> None:
    # Given a tiny run of every workload, ppmq only, one run each
    out = short_tmp / "results"
    cmd = [
        sys.executable,
        "-m",
        "ppmq.cli",
        "bench",
        "--systems",
        "ppmq",
        "--runs",
        "1",
        "--scale",
        "0.01",
        "--latency-seconds",
        "2",
        "--no-charts",
        "--out",
        str(out),
    ]
    # When it runs
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    # Then it succeeds, prints a table per workload and saves every figure
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("fanout-durable", "fanout-fast", "pull", "backlog", "latency", "latency-fast"):
        assert f"== {name}" in done.stdout
    results = json.loads((out / "results.json").read_text())
    assert set(results["workloads"]) == {"fanout-durable", "fanout-fast", "pull", "backlog", "latency", "latency-fast"}
    for name, workload in results["workloads"].items():
        figures = workload["systems"]["ppmq"]["median"]
        assert figures["msgs_per_s"] > 0 and figures["cpu_s_per_10k"] >= 0, name
        assert 0 <= figures["sys_cpu_s_per_10k"] <= figures["cpu_s_per_10k"], name
        assert figures["peak_rss_mb"] > 0, name
    assert "p99_ms" in results["workloads"]["latency"]["systems"]["ppmq"]["median"]
    assert results["machine"]["cores"] >= 1


def test_bench_size_gives_every_workload_its_payload_size(short_tmp: Path) -> None:
    # Given fan-out and the backlog, whose messages are 200 and 1024 bytes, run at one size
    out = short_tmp / "results"
    cmd = [
        sys.executable,
        "-m",
        "ppmq.cli",
        "bench",
        "-w",
        "fanout-fast,backlog",
        "-s",
        "ppmq",
        "-n",
        "1",
        "--scale",
        "0.01",
        "--size",
        "64",
        "--no-charts",
        "--out",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    # Then both ran with 64-byte payloads, and say so
    assert done.returncode == 0, done.stdout + done.stderr
    workloads = json.loads((out / "results.json").read_text())["workloads"]
    assert {name: w["workload"]["size"] for name, w in workloads.items()} == {"fanout-fast": 64, "backlog": 64}
    assert "messages of 64 bytes" in done.stdout


def test_bench_refuses_a_size_too_small_for_the_publish_time(short_tmp: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ppmq.cli", "bench", "--size", "19", "--out", str(short_tmp)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "--size: 19: a payload is at least 20 bytes" in done.stderr


def test_bench_names_an_unknown_system(short_tmp: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ppmq.bench", "--systems", "ppmq,kafka", "--out", str(short_tmp)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "unknown kafka" in done.stderr
