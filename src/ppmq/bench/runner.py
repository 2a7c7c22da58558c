"""One run of one workload on one system: start it, drive the clients, measure."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from ppmq.bench import payload
from ppmq.bench.procs import Sampler, cpu_times, disk_bytes, memory, tree
from ppmq.bench.service import Running
from ppmq.bench.workloads import Workload
from ppmq.errors import RunError

MB = 1 << 20
RUN_TIMEOUT_S = 1800.0  # a run that takes longer has lost messages or hung


class _Client:
    """A worker process and its line protocol (ready, go, one JSON result)."""

    def __init__(self, role: str, spec: dict) -> None:
        self.role = role
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ppmq.bench.worker", role, json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None, "both are PIPEs"
        self._stdin, self._stdout = self.proc.stdin, self.proc.stdout

    def ready(self) -> None:
        line = self._stdout.readline().strip()
        if line != "ready":
            self.proc.kill()
            raise RunError(f"{self.role} client failed to start (exit {self.proc.wait()})")

    def go(self) -> None:
        self.tell("go")

    def tell(self, line: str) -> None:
        try:
            self._stdin.write(line + "\n")
            self._stdin.flush()
        except BrokenPipeError:
            pass  # done already: it had everything before being told

    def result(self, timeout_s: float) -> dict:
        try:
            out, _ = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RunError(f"{self.role} client did not finish within {timeout_s:.0f}s") from None
        if self.proc.returncode != 0 or not out.strip():
            raise RunError(f"{self.role} client failed (exit {self.proc.returncode})")
        return json.loads(out.strip().splitlines()[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run(system: ModuleType, w: Workload, max_s: float, profile: Path | None = None) -> tuple[str, dict[str, float]]:
    """Start the system on a fresh temp dir, run the workload once; (version, figures).

    The publisher stops after `max_s` seconds (0: never) with what it has sent
    by then: a slow peer costs minutes, not an hour, and its rates stay valid.
    With `profile`, py-spy samples the broker for the whole run and writes its
    stacks there (collapsed: one line per stack with its sample count).
    """
    with tempfile.TemporaryDirectory(prefix="ppmq-bench-") as d:
        running = system.start(Path(d), w)
        spy = None
        if profile is not None:
            beside = Path(sys.executable).parent / "py-spy"  # from the bench extra
            argv = [
                str(beside) if beside.exists() else "py-spy",
                "record",
                "--threads",
                "--format",
                "raw",
                "--rate",
                "250",
                "-o",
                str(profile),
                "-p",
                str(running.service.pid),
            ]
            spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            return running.version, _measure(system.NAME, running, w, max_s)
        finally:
            running.service.stop()
            if spy is not None:
                spy.wait(30)  # it writes its output when the broker exits


def _measure(name: str, running: Running, w: Workload, max_s: float) -> dict[str, float]:
    spec = {"system": name, "address": running.address, "workload": w._asdict(), "max_s": max_s}
    pids = lambda: tree(running.service.pid)  # noqa: E731 - re-read: brokers may fork
    empty = memory(pids())
    clients: list[_Client] = []
    try:
        with Sampler(running.service.pid, running.data_dir) as sampler:
            subs = [_Client("subscribe", {**spec, "index": i}) for i in range(w.subscribers)]
            clients += subs
            for s in subs:
                s.ready()
            pub = _Client("publish", spec)
            clients.append(pub)
            pub.ready()
            cpu0 = cpu_times(pids())
            if not w.backlog:
                for s in subs:
                    s.go()
            pub.go()
            published = pub.result(RUN_TIMEOUT_S)
            full = memory(pids())
            disk_full = disk_bytes(running.data_dir)
            drain_ns = payload.now_ns()
            for s in subs:
                if w.backlog:
                    s.go()
                s.tell(f"stop {published['sent']}")
            received = [s.result(RUN_TIMEOUT_S) for s in subs]
            cpu1 = cpu_times(pids())
    finally:
        for c in clients:
            c.kill()
    cpu = (cpu1[0] - cpu0[0], cpu1[1] - cpu0[1])
    return _figures(w, empty, full, sampler.peak, disk_full, published, received, drain_ns, cpu)


def _figures(w, empty, full, peak, disk_full, published, received, drain_ns, cpu) -> dict[str, float]:
    n = published["sent"]
    counts = [sum(r["count"] for r in received)] if w.pull else [r["count"] for r in received]  # pull: shared
    short = [c for c in counts if c < n]
    if short:
        raise RunError(f"subscribers received {short} of {n} messages")
    last_ns = max(r["end_ns"] for r in received)
    start_ns = drain_ns if w.backlog else published["start_ns"]
    figures = {
        "messages": n,
        "msgs_per_s": n / ((last_ns - start_ns) / 1e9),
        "publish_msgs_per_s": n / ((published["end_ns"] - published["start_ns"]) / 1e9),
        "cpu_s_per_10k": sum(cpu) / n * 10_000,
        # of it, the kernel's (system CPU): the system calls and wake-ups the broker's way of working asks for
        "sys_cpu_s_per_10k": cpu[1] / n * 10_000,
        # the clients' share from `go` on, as the broker's: a peer's client library may be the limit
        "client_cpu_s_per_10k": sum(r["cpu_s"] for r in (published, *received)) / n * 10_000,
        # near 100, a client process used a whole core while it worked: it, not the broker, set the pace
        "busiest_client_pct": 100
        * max(
            published["cpu_s"] / ((published["end_ns"] - published["start_ns"]) / 1e9),
            *(r["cpu_s"] / ((r["end_ns"] - start_ns) / 1e9) for r in received),
        ),
        "peak_rss_mb": peak["VmRSS"] / MB,
        "peak_anon_mb": peak["RssAnon"] / MB,
        "empty_anon_mb": empty["RssAnon"] / MB,
        "full_rss_mb": full["VmRSS"] / MB,
        "full_anon_mb": full["RssAnon"] / MB,
        "full_file_mb": full["RssFile"] / MB,
        "disk_mb": max(peak["disk"], disk_full) / MB,
    }
    latencies = sorted(x for r in received for x in r["latencies_us"])
    if latencies:
        figures["p50_ms"] = statistics.median(latencies) / 1000
        figures["p99_ms"] = latencies[int(len(latencies) * 0.99)] / 1000
    return figures
