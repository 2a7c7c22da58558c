"""A publish of over a million tiny messages in one 16 MiB frame (PROTOCOL §3
Validation, docs/protocol.md "Large publishes"): stored a chunk per step, so other
clients and subscribers are served meanwhile; applied whole or not at all, with
one reply; nothing of it left after a kill -9 or a bad message near its end."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import msgspec

from ppmq.client.library import Client
from ppmq.store.reader import StoreReader

from ..conftest import WAIT_S, BrokerProcess, Subscriber, wait_for

FRAME_LIMIT = 16 << 20  # MaxFrameBytes' default


def big_frame(payloads: list[bytes], bad_at: int | None = None) -> bytes:
    """`{"Id":"big","Topic":"bulk","Messages":[{"Payload":...},...]}`, with a Priority
    out of range at `bad_at`."""
    parts = [b'{"Payload":%s}' % payload for payload in payloads]
    if bad_at is not None:
        parts[bad_at] = b'{"Payload":%s,"Priority":5}' % payloads[bad_at]
    frame = b'{"Id":"big","Topic":"bulk","Messages":[' + b",".join(parts) + b"]}\n"
    assert len(frame) <= FRAME_LIMIT
    return frame


def numbered(limit: int = FRAME_LIMIT) -> list[bytes]:
    """As many distinct payloads `"000...042"` as one frame of `limit` bytes holds:
    tiny messages, each of which the subscriber can tell apart and put in order."""
    per_message = len(b'{"Payload":"%030d"},' % 0)
    return [b'"%030d"' % i for i in range((limit - len(big_frame([]))) // per_message)]


def start(broker_factory, **bulk: object) -> tuple[BrokerProcess, Subscriber]:
    b = broker_factory(
        [{"Name": "bulk", "Subscribers": ["s"], **bulk}, {"Name": "small", "Subscribers": ["s"]}],
        [{"Name": "s", "BatchSize": 20000, "Window": 40000}],
    )
    return b, broker_factory.subscriber(b, "s", ack=None if bulk.get("AckRequired") is False else "connection")


def send_and_read_reply(path: str, frame: bytes) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(120)
        sock.connect(path)
        sock.sendall(frame)
        return msgspec.json.decode(sock.makefile("rb").readline())


def received(sub: Subscriber, topic: str) -> int:
    with sub.lock:
        return sum(len(b["Messages"]) for b in sub.batches if b["Topic"] == topic)


def test_a_16_mib_publish_lets_other_clients_and_subscribers_go_on_and_arrives_whole_once_in_order(broker_factory):
    # Given a subscriber of two topics, and a frame of the most tiny messages 16 MiB hold
    b, sub = start(broker_factory, AckRequired=False)
    payloads = numbered()
    n, frame = len(payloads), big_frame(payloads)
    log: list[tuple[str, int]] = []  # ("sent" | "small" | "big", messages of `small` the subscriber had by then)
    lock, done, reply = threading.Lock(), threading.Event(), {}

    def note(what: str) -> None:
        with lock:
            log.append((what, received(sub, "small")))

    def big() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(120)
            sock.connect(b.socket)
            sock.sendall(frame)
            note("sent")
            reply.update(msgspec.json.decode(sock.makefile("rb").readline()))
            note("big")
            done.set()

    # When one client sends it while another keeps publishing one message at a time
    thread = threading.Thread(target=big)
    thread.start()
    with Client(b.socket, timeout_s=WAIT_S) as small:
        i = 0
        while not done.is_set() or i < 5:
            small.publish("small", [{"Payload": i}])
            note("small")
            i += 1
    thread.join()
    # Then small replies and the subscriber's batches kept coming while the big one was stored
    sent, answered = next(k for k, (w, _) in enumerate(log) if w == "sent"), next(k for k, (w, _) in enumerate(log) if w == "big")
    between = [w for w, _ in log[sent:answered]]
    assert between.count("small") >= 5, f"{between.count('small')} small replies while the big publish was stored"
    assert log[answered][1] - log[sent][1] >= 3, "the subscriber got nothing while the big publish was stored"
    # And the big one is answered once, 200, and arrives whole, once, in order
    assert reply == {"Id": "big", "Status": 200, "Accepted": n}
    wait_for(lambda: received(sub, "bulk") >= n, timeout_s=60, what=f"{n} messages of the big publish")
    with sub.lock:
        got = [m["Payload"] for batch in sub.batches if batch["Topic"] == "bulk" for m in batch["Messages"]]
    assert got == [msgspec.json.decode(payload) for payload in payloads]
    wait_for(lambda: received(sub, "small") >= i, what=f"{i} small messages")
    assert sub.payloads("small") == list(range(i))


def fsck_exit_status(b: BrokerProcess) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ppmq.cli", "fsck", "-c", str(b.config_path)], capture_output=True, text=True, timeout=120)


def staging_record(b: BrokerProcess) -> bool:
    reader = StoreReader(b.config["DataPath"])
    try:
        with reader.snapshot() as txn:
            return txn.staged() is not None
    finally:
        reader.close()


def test_a_kill_9_while_a_publish_is_staged_leaves_nothing_of_it_after_restart_and_fsck_clean(broker_factory):
    # Given a large publish being staged (its record is in the store)
    b, sub = start(broker_factory)
    sender = threading.Thread(target=lambda: _ignore_errors(send_and_read_reply, b.socket, big_frame(numbered(4 << 20))), daemon=True)
    sender.start()
    wait_for(lambda: staging_record(b), what="the staging record")
    # When the broker is killed, then started again
    b.kill()
    sender.join(WAIT_S)
    b.start()
    # Then nothing of it is seen, and a publish after it still arrives
    with b.client() as c:
        c.publish("bulk", [{"Payload": "after"}])
    wait_for(lambda: sub.payloads("bulk") == ["after"], what="the publish after the crash")
    assert b.status()["Topics"]["bulk"]["Stored"] == 0 and b.status()["Topics"]["bulk"]["Published"] == 1
    # And once stopped (its rows deleted on the way), the store is clean and holds none of it
    assert b.stop() == 0
    assert not staging_record(b)
    done = fsck_exit_status(b)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "clean (0 messages" in done.stderr


def test_a_bad_message_at_index_1000000_rejects_the_whole_publish_naming_it_and_stores_nothing(broker_factory):
    b, sub = start(broker_factory)
    reply = send_and_read_reply(b.socket, big_frame([b"1"] * 1_000_001, bad_at=1_000_000))
    assert reply["Status"] == 400 and reply["Error"].startswith("Messages[1000000].Priority: 5 is out of range"), reply
    topic = b.status()["Topics"]["bulk"]
    assert (topic["Stored"], topic["Published"], topic["Subscribers"]["s"]["Ready"]) == (0, 0, [0])
    # And once stopped (the rows it staged deleted on the way), the store is clean and empty
    assert b.stop() == 0
    assert sub.payloads("bulk") == []
    done = fsck_exit_status(b)
    assert done.returncode == 0 and "clean (0 messages" in done.stderr, done.stdout + done.stderr


def _ignore_errors(call, *args) -> None:
    """The sender of a request whose broker is killed under it."""
    try:
        call(*args)
    except (OSError, ValueError, msgspec.DecodeError):
        pass


def test_a_connection_gets_its_replies_in_order_when_a_staged_publish_is_followed_by_a_small_one(broker_factory):
    # Given a publish just over a chunk (20,001 tiny messages, well under 1 MiB), then
    # a small publish, pipelined on one connection
    b, _ = start(broker_factory)
    big = b'{"Id":"big","Topic":"bulk","Messages":[' + b",".join([b'{"Payload":1}'] * 20_001) + b"]}\n"
    small = b'{"Id":"small","Topic":"small","Messages":[{"Payload":2}]}\n'
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(WAIT_S)
        sock.connect(b.socket)
        sock.sendall(big + small)
        replies = sock.makefile("rb")
        # Then the replies come in the order of the requests, both 200
        got = [msgspec.json.decode(replies.readline()) for _ in range(2)]
    assert [(r["Id"], r["Status"]) for r in got] == [("big", 200), ("small", 200)]
