"""A client process of the bench: `python -m ppmq.bench.worker ROLE SPEC`.

ROLE is `publish` or `subscribe`; SPEC is JSON with the system, its address, the
workload, the publisher's time limit and the subscriber's index. The process
sets up, prints `ready`, waits for `go` on stdin, does its part, and prints one
JSON line of results. A publisher that reaches its time limit stops early and
says how many it sent; the bench then tells the subscribers `stop N`. The same
loop drives every system, so client overhead is the same shape for all.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from ppmq.bench import payload
from ppmq.bench.systems import load
from ppmq.bench.workloads import Workload


def publish(system, address: dict, w: Workload, max_s: float) -> dict:
    pub = system.Publisher(address, w)
    cpu0 = _handshake()
    start_ns = payload.now_ns()
    deadline_ns = start_ns + int(max_s * 1e9) if max_s > 0 else None
    sent = 0
    while sent < w.messages and (deadline_ns is None or payload.now_ns() < deadline_ns):
        if w.paced:
            due = min(w.messages, (payload.now_ns() - start_ns) * w.rate_per_s // 1_000_000_000 + 1) - sent
            if due <= 0:
                time.sleep(max(0.0, start_ns / 1e9 + sent / w.rate_per_s - payload.now_ns() / 1e9))
                continue
            size = min(due, w.batch)
        else:
            size = min(w.batch, w.messages - sent)
        stamp_ns = payload.now_ns()
        body = payload.make(w.size, stamp_ns)
        pub.publish([((sent + j) % w.priorities, body) for j in range(size)])
        sent += size
    end_ns = payload.now_ns()
    pub.close()
    return {"start_ns": start_ns, "end_ns": end_ns, "sent": sent, "cpu_s": time.process_time() - cpu0}


def subscribe(system, address: dict, w: Workload, index: int) -> dict:
    """Every message (a pull worker: its share, until it finds none once the
    publisher is done); `end_ns` is when the last one arrived."""
    sub = (system.Taker if w.pull else system.Subscriber)(address, w, index)
    sub.prepare()
    cpu0 = _handshake()
    total = [w.messages, 0]  # lowered by `stop N` when the publisher stopped early; then 1: told
    threading.Thread(target=_read_stop, args=(total,), daemon=True).start()
    sub.start()
    seen, latencies, last_ns = 0, [], payload.now_ns()
    for payloads in sub.batches():
        now_ns = payload.now_ns()
        if w.paced:
            latencies += [payload.latency_us(p, now_ns) for p in payloads]
        if payloads:
            last_ns = now_ns
        seen += len(payloads)
        if seen >= total[0] or (w.pull and not payloads and total[1]):
            break
    sub.close()
    return {
        "end_ns": last_ns if w.pull else payload.now_ns(),
        "count": seen,
        "latencies_us": latencies,
        "cpu_s": time.process_time() - cpu0,
    }


def _read_stop(total: list[int]) -> None:
    line = sys.stdin.readline().split()
    if line[:1] == ["stop"]:
        total[0], total[1] = int(line[1]), 1


def _handshake() -> float:
    """Ready, then wait for `go`; the process's CPU seconds at `go`, from which
    its share of the run is counted, as the broker's is: what the messages
    cost it, without its interpreter's start-up and imports, which would be
    most of what a short run's clients use in all."""
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(1)
    return time.process_time()


def main() -> None:
    role, spec = sys.argv[1], json.loads(sys.argv[2])
    system = load(spec["system"])
    w = Workload(**spec["workload"])
    if role == "publish":
        result = publish(system, spec["address"], w, spec["max_s"])
    else:
        result = subscribe(system, spec["address"], w, spec["index"])
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
