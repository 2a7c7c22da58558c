"""A batch counts as written only once all its bytes are in the kernel (PROTOCOL §3
Acks and redelivery, Connections to subscribers): what still sat in the broker's
own buffer when it stopped, died or lost the connection is delivered again."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable

import msgspec

from ..conftest import BrokerProcess, wait_for

MESSAGES = 2000
PAYLOAD_BYTES = 1000
STOP_AFTER_BYTES = 300_000  # about 300 of the 2,000 messages: stop well before the end


class SlowReader:
    """A subscriber that reads a little at a time, as a busy consumer does, until
    told to hurry; it keeps every complete frame it received."""

    def __init__(self, path: str, chunk_bytes: int = 1024, pause_s: float = 0.002) -> None:
        self.chunk_bytes = chunk_bytes
        self.pause_s = pause_s
        self.received_bytes = 0
        self.hurry = threading.Event()
        self._data = bytearray()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(1)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # Unix sockets mostly queue on the sender's side
        with conn:
            while data := conn.recv(self.chunk_bytes if not self.hurry.is_set() else 1 << 16):
                self._data += data
                self.received_bytes += len(data)
                if not self.hurry.is_set():
                    time.sleep(self.pause_s)

    def payloads(self) -> list[str]:
        """Every payload of a complete frame (a cut-off last frame is not a delivery)."""
        lines = bytes(self._data).split(b"\n")[:-1]
        return [m["Payload"] for line in lines for m in msgspec.json.decode(line)["Messages"]]

    def finish(self) -> list[str]:
        """Read the rest at full speed up to the broker's end of the connection."""
        self.hurry.set()
        self.thread.join(10)
        assert not self.thread.is_alive(), "the connection did not end with the broker"
        self.sock.close()
        os.unlink(self.path)
        return self.payloads()


def _published(b: BrokerProcess) -> list[str]:
    payloads = [f"{i:05d}:" + "x" * PAYLOAD_BYTES for i in range(MESSAGES)]
    with b.client() as c:
        for start in range(0, MESSAGES, 100):
            assert c.publish("t", [{"Payload": p} for p in payloads[start : start + 100]]).accepted == 100
    return payloads


def _eventually(predicate: Callable[[], bool], timeout_s: float) -> None:
    """Give `predicate` up to `timeout_s` to hold; the caller asserts, with details."""
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)


def _stopped_mid_way_then_drained(broker_factory, stop: Callable[[BrokerProcess], object]) -> tuple[BrokerProcess, set[str]]:
    """2,000 messages to a slow subscriber of an AckRequired: false topic, the broker
    stopped with `stop` mid-way and started again, a normal subscriber draining the
    rest: the broker, and the payloads missing from both runs."""
    b = broker_factory([{"Name": "t", "AckRequired": False, "Subscribers": ["s"]}], ["s"])
    slow = SlowReader(b.sub_socket("s"))
    published = _published(b)
    wait_for(lambda: slow.received_bytes >= STOP_AFTER_BYTES, what="the slow subscriber's first reads")
    stop(b)
    first_run = slow.finish()
    assert len(first_run) < MESSAGES, "the broker stopped too late to test anything"
    b.start()
    sub = broker_factory.subscriber(b, "s", ack=None)
    wait_for(lambda: b.status()["Topics"]["t"]["Stored"] == 0, what="the store to empty")

    def missing() -> set[str]:
        return set(published) - set(first_run) - set(sub.payloads())

    _eventually(lambda: not missing(), timeout_s=2.0)
    return b, missing()


def test_a_sigterm_while_a_slow_subscriber_reads_loses_no_message_of_an_ack_free_topic(broker_factory):
    b, missing = _stopped_mid_way_then_drained(broker_factory, lambda b: b.stop())
    assert not missing, f"{len(missing)} of {MESSAGES} messages never delivered"
    # A clean stop gave back what it had not written: nothing was counted twice
    s = b.sub_status("t", "s")
    assert (s["Delivered"], s["Redelivered"]) == (MESSAGES, 0)


def test_a_kill_9_while_a_slow_subscriber_reads_loses_no_message_of_an_ack_free_topic(broker_factory):
    _, missing = _stopped_mid_way_then_drained(broker_factory, lambda b: b.kill())
    assert not missing, f"{len(missing)} of {MESSAGES} messages never delivered"


def _wait_until_pushing_stops(b: BrokerProcess, topic: str, sub: str) -> None:
    """Until the count of delivered messages holds still: every buffer between
    the broker and a subscriber that does not read is full."""
    seen: list[int] = []

    def still() -> bool:
        seen.append(b.sub_status(topic, sub)["Delivered"])
        time.sleep(0.2)
        return len(seen) >= 3 and seen[-1] == seen[-3] > 0

    wait_for(still, what="the broker to stop pushing")


def test_batches_still_in_the_brokers_buffer_when_the_connection_breaks_go_back_to_ready(broker_factory):
    # Given a subscriber that does not read, with many small batches allowed in flight
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], [{"Name": "s", "BatchSize": 10, "Window": 600}])
    path = b.sub_socket("s")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(1)
    with b.client() as c:
        for start in range(0, 600, 100):
            c.publish("t", [{"Payload": f"{i:05d}:" + "x" * PAYLOAD_BYTES} for i in range(start, start + 100)])
    conn, _ = listener.accept()
    _wait_until_pushing_stops(b, "t", "s")
    # When, with the broker frozen, it takes what reached its socket and hangs up
    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        conn.setblocking(False)
        data = bytearray()
        while True:
            try:
                data += conn.recv(1 << 16)
            except BlockingIOError:
                break
        conn.close()
        listener.close()
        os.unlink(path)
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    received = sum(len(msgspec.json.decode(line)["Messages"]) for line in bytes(data).split(b"\n")[:-1])
    assert 0 < received < 600, "the kernel's buffers should hold some batches, not all"

    # Then exactly the batches it could read whole stay in flight; the rest is ready again, not delivered
    def counts() -> tuple[int, int, int]:
        s = b.sub_status("t", "s")
        return s["InFlight"], s["Ready"][0], s["Delivered"]

    _eventually(lambda: counts() == (received, 600 - received, received), timeout_s=5.0)
    assert counts() == (received, 600 - received, received), f"the subscriber received {received}"
