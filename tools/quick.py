"""Quick figures for ppmq alone: fan-out throughput and RSS with a backlog.

    .venv/bin/python tools/quick.py [--messages 50000] [--backlog 200000] [--runs 3]

fan-out: one publisher sends `--messages` messages of 200 bytes in batches of
100, each batch confirmed (status 200, so fsynced with Sync: true) before the
next; two subscriber processes ack every batch on their delivery connection.
Time runs from the first publish to the last ack of both subscribers.
backlog: `--backlog` messages of 1 KiB published with no subscriber listening;
the broker's RSS (and RssAnon: LMDB's file pages are reclaimable) is read from
/proc before and after. Each figure is the median of `--runs` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from ppmq.client.library import Client

SUBSCRIBER = r"""
import socket, sys, os, time, msgspec
path, total = sys.argv[1], int(sys.argv[2])
if os.path.exists(path): os.unlink(path)
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); srv.bind(path); srv.listen(1)
print("ready", flush=True)
conn, _ = srv.accept()
dec = msgspec.json.Decoder(); enc = msgspec.json.Encoder()
buf, seen = b"", 0
while seen < total:
    data = conn.recv(1 << 20)
    if not data: break
    buf += data
    *lines, buf = buf.split(b"\n")
    for line in lines:
        batch = dec.decode(line)
        keys = [m["Key"] for m in batch["Messages"]]
        seen += len(keys)
        conn.sendall(enc.encode({"Topic": batch["Topic"], "Subscriber": batch["Subscriber"], "Acks": keys}) + b"\n")
print(time.time(), flush=True)
time.sleep(0.5)
"""


def config(tmp: Path, subs: list[str], sync: bool, **extra: object) -> Path:
    cfg = {
        "ServerSocket": str(tmp / "ppmq.sock"),
        "DataPath": str(tmp / "data"),
        "Sync": sync,
        "Subscribers": [{"Name": s, "Socket": str(tmp / f"{s}.sock"), "BatchSize": 100, "Window": 1000} for s in subs],
        "Topics": [{"Name": "bench", "Priorities": 3, "Subscribers": subs}],
        **extra,
    }
    path = tmp / "ppmq.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def start_broker(cfg: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "ppmq.cli", "serve", "-c", str(cfg)], stderr=subprocess.DEVNULL)
    sock = yaml.safe_load(cfg.read_text())["ServerSocket"]
    for _ in range(500):
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock)
            s.close()
            return proc
        except OSError:
            time.sleep(0.01)
    raise RuntimeError("broker did not start")


def memory(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon and RssFile of a process, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def payload(i: int, size: int) -> str:
    return f"{i:08d}" + "x" * (size - 8)


def fanout(n: int, sync: bool, **extra: object) -> tuple[float, float]:
    """Messages per second, and broker CPU seconds per 10,000 messages; `extra` config keys."""
    with tempfile.TemporaryDirectory(prefix="ppmq-bench-") as d:
        tmp = Path(d)
        cfg = config(tmp, ["a", "b"], sync, **extra)
        subs = [
            subprocess.Popen([sys.executable, "-c", SUBSCRIBER, str(tmp / f"{s}.sock"), str(n)], stdout=subprocess.PIPE, text=True)
            for s in "ab"
        ]
        for s in subs:
            assert s.stdout.readline().strip() == "ready"
        broker = start_broker(cfg)
        try:
            batches = [[{"Payload": payload(i + j, 200), "Priority": (i + j) % 3} for j in range(100)] for i in range(0, n, 100)]
            with Client(str(tmp / "ppmq.sock")) as c:
                cpu0, start = cpu_s(broker.pid), time.time()
                for batch in batches:
                    c.publish("bench", batch)
            ends = [float(s.stdout.readline()) for s in subs]
            return n / (max(ends) - start), (cpu_s(broker.pid) - cpu0) / n * 10_000
        finally:
            broker.send_signal(signal.SIGTERM)
            broker.wait()
            for s in subs:
                s.kill()


def backlog(n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ppmq-bench-") as d:
        tmp = Path(d)
        cfg = config(tmp, ["a", "b"], sync=False)
        broker = start_broker(cfg)
        try:
            empty = memory(broker.pid)
            with Client(str(tmp / "ppmq.sock")) as c:
                start = time.time()
                for i in range(0, n, 100):
                    c.publish("bench", [{"Payload": payload(i + j, 1024)} for j in range(100)])
                elapsed = time.time() - start
                assert c.status()["Topics"]["bench"]["Stored"] == n
            full = memory(broker.pid)
            disk = sum(f.stat().st_size for f in (tmp / "data").iterdir())
        finally:
            broker.send_signal(signal.SIGTERM)
            broker.wait()
    mb = 1 << 20
    return {
        "publish_msgs_per_s": n / elapsed,
        "empty_rss_mb": empty["VmRSS"] / mb,
        "empty_anon_mb": empty["RssAnon"] / mb,
        "full_rss_mb": full["VmRSS"] / mb,
        "full_anon_mb": full["RssAnon"] / mb,
        "full_file_mb": full["RssFile"] / mb,
        "store_mb": disk / mb,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--backlog", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    results: dict[str, object] = {"machine": {"cores": os.cpu_count()}}
    for sync in (True, False):
        rates, cpus = zip(*(fanout(args.messages, sync) for _ in range(args.runs)))
        rate, cpu = statistics.median(rates), statistics.median(cpus)
        results[f"fanout_sync_{str(sync).lower()}"] = {"median_msgs_per_s": rate, "broker_cpu_s_per_10k": cpu, "runs": rates}
        print(
            f"fan-out to 2 subscribers, Sync {sync}: median {rate:,.0f} msg/s, broker CPU {cpu:.2f} s per 10k  runs {[round(r) for r in rates]}"
        )
    runs = [backlog(args.backlog) for _ in range(args.runs)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    results["backlog"] = med
    print(
        f"backlog of {args.backlog:,} x 1 KiB: RSS {med['empty_rss_mb']:.1f} MB empty -> {med['full_rss_mb']:.1f} MB full; "
        f"RssAnon {med['empty_anon_mb']:.1f} -> {med['full_anon_mb']:.1f} MB; RssFile {med['full_file_mb']:.1f} MB; "
        f"store {med['store_mb']:.0f} MB on disk; published at {med['publish_msgs_per_s']:,.0f} msg/s"
    )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
