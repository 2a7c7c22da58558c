"""What one 16 MiB publish of tiny messages costs the others.

    .venv/bin/python tools/large_publish.py

Builds the frame the most `{"Payload":1}` messages that MaxFrameBytes (16 MiB)
holds, then prints:

- how long decoding it blocks the event loop (protocol.decode_request);
- in-process, with fsync: the writer time until its reply, in how many steps,
  and the longest single step (what every other client waits at most);
- against a real `ppmq serve`: the worst reply latency of a client publishing one
  message at a time while the big frame is sent and stored, and when the big
  reply came.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import msgspec
import yaml

from ppmq.client.library import Client
from ppmq.config import Config, SubscriberConfig, TopicConfig
from ppmq.core.broker import Broker
from ppmq.protocol import messages as p
from ppmq.store.store import Store

MESSAGE = b'{"Payload":1}'
COUNT = ((16 << 20) - 64) // (len(MESSAGE) + 1)
FRAME = b'{"Id":"big","Topic":"bulk","Messages":[' + b",".join([MESSAGE] * COUNT) + b"]}\n"


def decode_s() -> float:
    start = time.perf_counter()
    p.decode_request(FRAME)
    return time.perf_counter() - start


def in_process() -> tuple[float, int, float]:
    """GroupCommit seconds until the big publish is answered, steps, longest step."""
    req = p.decode_request(FRAME)
    with tempfile.TemporaryDirectory(prefix="ppmq-bench-") as d:
        config = Config(
            server_socket=f"{d}/s.sock",
            data_path=d,
            sync=True,
            subscribers=[SubscriberConfig(name="s", socket=f"{d}/s.sock")],
            topics=[TopicConfig(name="bulk", subscribers=["s"])],
        )
        store = Store(d, sync=True, max_bytes=4 << 30)
        broker = Broker(config, store, time.time_ns())
        total, longest, steps, ops = 0.0, 0.0, 0, [req]
        while True:
            start = time.perf_counter()
            step = broker.step(ops, set(), time.time_ns())
            took = time.perf_counter() - start
            total, longest, steps, ops = total + took, max(longest, took), steps + 1, []
            if (step.replies[0] is not None) if steps == 1 else step.finished:
                break
        store.close()
    return total, steps, longest


def over_the_wire() -> tuple[float, float, int]:
    """Worst small reply latency while the big one is in progress, when the big reply
    came (seconds after it was sent), and how many small replies came meanwhile."""
    with tempfile.TemporaryDirectory(prefix="ppmq-bench-") as d:
        path = Path(d)
        config = {
            "ServerSocket": str(path / "s.sock"),
            "DataPath": str(path / "data"),
            "Subscribers": [{"Name": "s", "Socket": str(path / "sub.sock")}],
            "Topics": [{"Name": "bulk", "Subscribers": ["s"]}, {"Name": "small", "Subscribers": ["s"]}],
        }
        (path / "ppmq.yaml").write_text(yaml.safe_dump(config))
        proc = subprocess.Popen(
            [sys.executable, "-m", "ppmq.cli", "serve", "-c", str(path / "ppmq.yaml")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            while not (path / "s.sock").exists():
                time.sleep(0.05)
            time.sleep(0.2)
            return _race(str(path / "s.sock"))
        finally:
            proc.terminate()
            proc.wait(120)


def _race(server: str) -> tuple[float, float, int]:
    done = threading.Event()
    answered = {}

    def big() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(server)
            start = time.perf_counter()
            sock.sendall(FRAME)
            answered["reply"] = msgspec.json.decode(sock.makefile("rb").readline())
            answered["after_s"] = time.perf_counter() - start
            done.set()

    thread = threading.Thread(target=big)
    worst, count = 0.0, 0
    with Client(server, timeout_s=120) as small:
        thread.start()
        while not done.is_set():
            start = time.perf_counter()
            small.publish("small", [{"Payload": count}])
            worst, count = max(worst, time.perf_counter() - start), count + 1
    thread.join()
    assert answered["reply"]["Status"] == 200, answered["reply"]
    return worst, answered["after_s"], count


def main() -> None:
    print(f"{COUNT} messages, {len(FRAME)} bytes")
    print(f"decode on the event loop: {decode_s():.3f} s")
    total, steps, longest = in_process()
    print(f"in-process writer time: {total:.2f} s in {steps} steps, longest step {longest:.3f} s")
    worst, after_s, count = over_the_wire()
    print(f"over the wire: big reply after {after_s:.2f} s; {count} small replies meanwhile, worst latency {worst:.3f} s")


if __name__ == "__main__":
    main()
