"""`ppmq bench`: choose workloads, systems and runs; print, save and chart the results."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

from ppmq.bench import profile as profiling
from ppmq.bench import report, runner
from ppmq.bench.payload import STAMP
from ppmq.bench.systems import NAMES, load
from ppmq.bench.workloads import scaled, workloads
from ppmq.errors import RunError


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="ppmq bench",
        description="Run named workloads against ppmq and peer brokers started on this host "
        "(Redis Streams, beanstalkd, RabbitMQ, NATS JetStream; tools/install-peers.sh installs them).",
    )
    ap.add_argument("--workloads", "-w", default=",".join(workloads()), help="comma-separated: %(default)s")
    ap.add_argument("--systems", "-s", default=",".join(NAMES), help="comma-separated: %(default)s")
    ap.add_argument("--runs", "-n", type=int, default=3, help="runs per system and workload; figures are medians (default %(default)s)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every message count, e.g. 0.1 for a quick look")
    ap.add_argument("--million", action="store_true", help="backlog of 1,000,000 messages instead of 200,000")
    ap.add_argument(
        "--size",
        type=_size,
        default=0,
        metavar="BYTES",
        help="payload bytes of every message, so that workloads compare at one size (default: each its own, 200; backlog 1024)",
    )
    ap.add_argument("--latency-seconds", type=float, default=30.0, help="length of the latency workload (default %(default)s)")
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=60.0,
        help="a publisher stops after this long with what it sent; 0: never (default %(default)s)",
    )
    ap.add_argument("--out", "-o", default="bench-results", help="directory for results.json and the charts (default %(default)s)")
    ap.add_argument("--window", type=int, default=1000, help="messages in flight per subscriber; 100 is one batch (default %(default)s)")
    ap.add_argument(
        "--acks",
        choices=("connection", "server"),
        default="connection",
        help="where ppmq's subscribers ack: on the delivery connection, or one-way to ServerSocket as ppMQ's do",
    )
    ap.add_argument("--dedupe", action="store_true", help="ppmq's topic has Dedupe and every message a unique Key (peers unchanged)")
    ap.add_argument(
        "--metrics",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="ppmq writes its Metrics textfile every SECONDS (the default Interval is 15), to see what that costs; default: no metrics",
    )
    ap.add_argument("--profile", action="store_true", help="sample ppmq's broker with py-spy; stacks in OUT/profile-<workload>.txt")
    ap.add_argument("--no-charts", action="store_true", help="skip the PNG charts (no matplotlib needed)")
    return ap


def _size(text: str) -> int:
    """A --size: a payload carries its publish time in its first STAMP bytes."""
    try:
        size = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not a whole number of bytes") from None
    if size < STAMP:
        raise argparse.ArgumentTypeError(f"{size}: a payload is at least {STAMP} bytes (its publish time)")
    return size


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    # SIGTERM (and SIGINT, even when started in the background) unwind through the
    # `finally` blocks that stop the brokers and clients this run started.
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)
    known = workloads(1_000_000 if args.million else 200_000, args.latency_seconds)
    chosen = [known[n] for n in _names(args.workloads, known)]
    systems = []
    for name in _names(args.systems, NAMES):
        module = load(name)
        why = module.missing()
        if why:
            print(f"skipping {name}: {why}", flush=True)
        else:
            systems.append(module)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.no_charts and importlib.util.find_spec("matplotlib") is None:
        print("no charts: matplotlib not installed (pip install -e .[bench])", flush=True)
        args.no_charts = True
    results: dict = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "ppmq bench " + shlex.join(sys.argv[1:] if argv is None else argv),
        "machine": _machine(),
        "workloads": {},
    }
    m = results["machine"]
    print(
        f"{m['cores']} cores ({m['cpu']}), load {m['load_avg'][0]:.1f}, disk {m['disk']}, "
        f"4 KiB write+fdatasync p50 {m['fsync_ms']['p50']:.1f} ms p99 {m['fsync_ms']['p99']:.1f} ms",
        flush=True,
    )
    for w in chosen:
        w = scaled(w, args.scale)._replace(
            window=args.window,
            server_acks=args.acks == "server",
            dedupe=args.dedupe,
            metrics_s=args.metrics,
            size=args.size or w.size,
        )
        runs: dict[str, list[dict[str, float]]] = {m.NAME: [] for m in systems}
        versions: dict[str, str] = {}
        for i in range(args.runs):  # systems interleaved, so each run's ratios share its moment
            for m in systems:
                if w.pull and not hasattr(m, "Taker"):
                    continue  # only ppmq has Pull subscribers
                print(f"{w.name}: {m.NAME} run {i + 1}/{args.runs} ({w.messages:,} messages of {w.size} bytes)", flush=True)
                try:
                    profile = out / f"profile-{w.name}.txt" if args.profile and m.NAME == "ppmq" else None
                    version, figures = runner.run(m, w, args.max_seconds, profile)
                except RunError as exc:
                    print(f"  failed: {exc}", flush=True)
                    continue
                versions[m.NAME] = version
                runs[m.NAME].append(figures)
        summary = report.summarize({k: v for k, v in runs.items() if v})
        results["workloads"][w.name] = {"workload": w._asdict(), "versions": versions, "systems": summary}
        print(report.table(w.name, summary, versions), flush=True)
        profile = out / f"profile-{w.name}.txt"
        if args.profile and profile.exists():
            print(f"ppmq broker profile (py-spy, {profile}):\n{profiling.summary(profile)}", flush=True)
        if not args.no_charts and summary:
            report.chart(out / f"{w.name}.png", w.name, summary)
        report.write_json(out / "results.json", results)
        (out / "results.md").write_text(report.markdown(results))
    print(f"results in {out / 'results.json'} and {out / 'results.md'}" + ("" if args.no_charts else f", charts {out}/<workload>.png"))
    return 0


def _exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _names(text: str, known) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"ppmq bench: unknown {', '.join(unknown)} (choose from {', '.join(known)})")
    return names


def _machine() -> dict:
    """What the figures depend on: cores, CPU model, the disk under the temp dir."""
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), ""
    )
    return {"cores": os.cpu_count(), "cpu": model, "load_avg": os.getloadavg(), "disk": _disk(), "fsync_ms": _fsync_ms()}


def _fsync_ms(n: int = 50) -> dict[str, float]:
    """How long a 4 KiB write plus fdatasync takes in the temp dir, where every
    broker keeps its data: durable publishing cannot be faster than this."""
    times = []
    with tempfile.NamedTemporaryFile(prefix="ppmq-bench-fsync-") as f:
        for _ in range(n):
            start = time.perf_counter()
            os.write(f.fileno(), b"x" * 4096)
            os.fdatasync(f.fileno())
            times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return {"p50": times[n // 2], "p99": times[int(n * 0.99)]}


def _disk() -> str:
    dev = os.stat(tempfile.gettempdir()).st_dev
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        major, minor = map(int, fields[2].split(":"))
        if os.makedev(major, minor) == dev:
            sep = fields.index("-")
            return f"{fields[sep + 2]} ({fields[sep + 1]}) at {fields[4]}"
    return "unknown"
