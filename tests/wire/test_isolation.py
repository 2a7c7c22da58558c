"""Isolation: subscribers that misbehave in every way at once cost a good
subscriber nothing it can notice, and the broker's memory stays bounded.

tools/isolation.py measures the good subscriber's delivery rate with and without
the same misbehaving subscribers (`Misbehaving` below).
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

from tests.conftest import WAIT_S, rss_anon, wait_for

MISBEHAVIOURS = ("silent", "mute", "reset", "missing")


class Misbehaving:
    """A subscriber socket that misbehaves one way: `silent` accepts and never
    reads, `mute` reads everything and never acks, `reset` accepts and resets
    every connection at once, `missing` has no socket at all."""

    def __init__(self, path: str, kind: str) -> None:
        assert kind in MISBEHAVIOURS, kind
        self.kind = kind
        self.path = path
        self.accepted = 0
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._sock = None
        self._threads: list[threading.Thread] = []
        if kind != "missing":
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.bind(path)
            self._sock.listen(8)
            self._sock.settimeout(0.1)
            self._spawn(self._accept)

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            if self.kind == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()
            else:
                self._conns.append(conn)
                if self.kind == "mute":
                    self._spawn(self._drain, conn)

    def _drain(self, conn: socket.socket) -> None:
        conn.settimeout(0.1)
        while not self._stop.is_set():
            try:
                if not conn.recv(1 << 16):
                    return
            except TimeoutError:
                continue
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        for conn in self._conns:
            conn.close()
        if self._sock is not None:
            self._sock.close()
            os.unlink(self.path)


def test_a_good_subscriber_gets_everything_promptly_beside_subscribers_misbehaving_in_every_way(broker_factory):
    # Given one topic fanned out to a good subscriber and four misbehaving ones
    subs = ["good", *MISBEHAVIOURS]
    b = broker_factory([{"Name": "t", "Subscribers": subs, "AckRetry": "1s", "Priorities": 2}], subs, RetryMax="500ms")
    bad = [Misbehaving(b.sub_socket(kind), kind) for kind in MISBEHAVIOURS]
    good = broker_factory.subscriber(b, "good")
    opened = time.monotonic()
    try:
        # When 5,000 messages are published, 100 to a confirmed batch
        n, warm = 5000, 1000
        with b.client() as c:
            started = time.monotonic()
            for i in range(0, n, 100):
                c.publish("t", [{"Payload": i + j, "Priority": (i + j) % 2} for j in range(100)])
                if i + 100 == warm:
                    good.wait_messages(warm)
                    warm_rss = rss_anon(b.proc.pid)
        # Then the broker has reached every listening socket
        wait_for(lambda: all(m.accepted for m in bad if m.kind != "missing"), what="the broker to reach every listening socket")
        # And the good subscriber gets them all, promptly and each once
        good.wait_messages(n, timeout_s=WAIT_S * 4)
        elapsed = time.monotonic() - started
        assert sorted(good.payloads()) == list(range(n)), "the good subscriber got each message exactly once"
        assert elapsed < 60, f"{n} messages took {elapsed:.1f}s"
        # And the misbehaving ones hold no more than their windows, the broker no more memory
        status = b.status()["Topics"]["t"]["Subscribers"]
        assert status["good"]["InFlight"] == 0 and status["good"]["Acked"] == n
        for kind in ("silent", "mute"):
            assert status[kind]["InFlight"] <= 50
            assert sum(status[kind]["Ready"]) + status[kind]["InFlight"] == n
        assert status["missing"]["Delivered"] == 0 and sum(status["missing"]["Ready"]) == n
        growth = rss_anon(b.proc.pid) - warm_rss
        assert growth < 32 << 20, f"the broker's anonymous memory grew by {growth >> 20} MiB"
        # The one that resets every connection is backed off, not hammered
        resets = next(m for m in bad if m.kind == "reset").accepted
        assert resets <= 2 + 10 * (time.monotonic() - opened), f"{resets} connections to the resetting subscriber"
        assert b.alive()
    finally:
        for m in bad:
            m.close()
