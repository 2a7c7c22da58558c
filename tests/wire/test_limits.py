"""Limits on a real broker: MaxConnections (over every listener), ReadTimeout,
per-connection memory, per-topic MaxMessages and MaxBytes with both overflow
policies, and MaxAttempts with DeadLetter."""

from __future__ import annotations

import re
import resource
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import pytest

from ppmq.config import parse_config
from ppmq.errors import ClientError, ConfigError
from tests.conftest import rss_anon, wait_for
from tests.wire import phpmq_client as pm
from tests.wire.test_phpmq import phpmq, phpmq_broker

TIMEOUT_S = 15.0


class Conn:
    """A raw connection that sends bytes and reads reply lines."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(TIMEOUT_S)
        self.sock.connect(path)
        self.file = self.sock.makefile("rb")

    def ask(self, wrapper: dict) -> dict:
        self.sock.sendall(msgspec.json.encode(wrapper) + b"\n")
        return self.reply()

    def reply(self) -> dict:
        line = self.file.readline()
        assert line, "the broker closed the connection"
        return msgspec.json.decode(line)

    def closed_by_broker(self) -> bool:
        return self.file.readline() == b""

    def close(self) -> None:
        self.file.close()
        self.sock.close()


# --- connections ------------------------------------------------------------------------------


def test_a_connection_over_max_connections_gets_503_and_is_closed_and_logged_then_room_frees(broker_factory):
    b = broker_factory([{"Name": "t"}], MaxConnections=3)
    held = []
    try:
        for _ in range(3):  # each is being served (once the connections of the start-up probe are gone)
            held.append(wait_for(lambda: _served(b.socket, keep=True), what="a connection to be served"))
        extra = Conn(b.socket)
        reply = extra.reply()
        assert (reply["Status"], reply["Error"]) == (503, "too many connections: MaxConnections (3) reached")
        assert extra.closed_by_broker()
        extra.close()
        assert "MaxConnections (3) reached" in b.log
        held.pop().close()
        wait_for(lambda: _served(b.socket), what="a connection to be served again")
    finally:
        for c in held:
            c.close()


def _served(path: str, keep: bool = False) -> Conn | None:
    """A connection that got its STATUS answered (kept open if `keep`), or None."""
    c = Conn(path)
    try:
        served = c.ask({"Id": 1, "Command": "STATUS"})["Status"] == 200
    except OSError:
        served = False
    if not (keep and served):
        c.close()
    return c if served else None


def listener_connections(b) -> dict[str, int]:
    """STATUS Listeners: connections open on each listener, the STATUS's own included."""
    return {name: entry["Connections"] for name, entry in b.status()["Listeners"].items()}


def test_max_connections_counts_the_connections_of_both_listeners_together(broker_factory, short_tmp):
    # Given MaxConnections 3, held by two PHPMQ connections and one on ServerSocket
    b = phpmq_broker(broker_factory, short_tmp, MaxConnections=3)
    held = [phpmq(b), phpmq(b)]
    try:
        wait_for(lambda: listener_connections(b) == {"ServerSocket": 1, "PhpmqSocket": 2}, what="two PHPMQ connections open")
        server = wait_for(lambda: _served(b.socket, keep=True), what="a ServerSocket connection to be served")
        held.append(server)
        # When one more connects on either socket
        extra_phpmq, extra_server = phpmq(b), Conn(b.socket)
        # Then each is refused: PHPMQ, which has no replies, by a close; ServerSocket with a 503
        assert extra_phpmq.closed_by_peer()
        assert extra_server.reply()["Status"] == 503 and extra_server.closed_by_broker()
        extra_phpmq.close()
        extra_server.close()
        # And a PHPMQ connection that closes makes room on ServerSocket
        held.pop(0).close()
        wait_for(lambda: _served(b.socket), what="a ServerSocket connection to be served again")
        wait_for(lambda: listener_connections(b) == {"ServerSocket": 2, "PhpmqSocket": 1}, what="the probes gone")
    finally:
        for c in held:
            c.close()


def test_phpmq_connections_over_max_connections_are_closed_and_cannot_take_the_brokers_descriptors(broker_factory, short_tmp):
    # Given a broker allowed 128 open files and 5 connections, all of them PHPMQ's
    b = phpmq_broker(broker_factory, short_tmp, MaxConnections=5)
    resource.prlimit(b.proc.pid, resource.RLIMIT_NOFILE, (128, 128))
    held = [phpmq(b) for _ in range(4)]
    try:
        wait_for(lambda: listener_connections(b)["PhpmqSocket"] == 4, what="four PHPMQ connections open")
        held.append(phpmq(b))  # accepted before the ones below: the fifth
        # When far more PHPMQ connections come than it has descriptors
        for i in range(150):
            with phpmq(b) as extra:
                # Then each one is closed at once
                assert extra.closed_by_peer(5.0), f"PHPMQ connection {i + 6} was kept open over MaxConnections (5)"
        assert "MaxConnections (5) reached" in b.log
        # And ServerSocket serves as soon as a PHPMQ connection makes room
        held.pop().close()
        wait_for(lambda: _served(b.socket), what="a ServerSocket connection to be served")
        with b.client() as c:
            assert c.publish("q", [{"Payload": "still served"}]).accepted == 1
    finally:
        for c in held:
            c.close()


PARTIAL_FRAMES = 32  # connections that each send most of a large PHPMQ frame
PARTIAL_BYTES = 3584 << 10  # of a frame's content, under MaxFrameBytes (4 MiB)


def test_many_phpmq_connections_holding_partial_large_frames_hold_memory_within_max_connections(broker_factory, short_tmp):
    # Given MaxConnections 2 and MaxFrameBytes 4 MiB
    b = phpmq_broker(broker_factory, short_tmp, MaxConnections=2, MaxFrameBytes="4MiB")
    wait_for(lambda: listener_connections(b) == {"ServerSocket": 1, "PhpmqSocket": 0}, what="the start-up probes gone")
    baseline = rss_anon(b.proc.pid)
    # When many PHPMQ connections each send all but the last byte of a large send (001)
    head = pm.message("001", pm.packet(pm.QUEUE, "q"), count=2) + b"P02%029d" % PARTIAL_BYTES
    socks = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(PARTIAL_FRAMES)]

    def send(sock: socket.socket) -> None:
        try:
            sock.connect(b.config["PhpmqSocket"])
            sock.sendall(head + b"x" * (PARTIAL_BYTES - 1))
        except OSError:
            pass  # refused: closed by the broker

    threads = [threading.Thread(target=send, args=(sock,), daemon=True) for sock in socks]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT_S)
        peak, until = baseline, time.monotonic() + 1.0
        while time.monotonic() < until:  # what was sent last reaches the broker
            peak = max(peak, rss_anon(b.proc.pid))
            time.sleep(0.05)
        # Then the broker holds no more than MaxConnections times one connection's bound (docs/security.md)
        bound = 2 * 4 * (4 << 20) + SLACK_BYTES
        assert peak - baseline < bound, f"RssAnon grew by {(peak - baseline) >> 20} MiB ({baseline >> 20} -> {peak >> 20} MiB)"
    finally:
        for sock in socks:
            sock.close()
    # And once they are gone, ServerSocket serves again
    wait_for(lambda: _served(b.socket), what="a ServerSocket connection to be served")
    assert b.alive()


def test_a_connection_stalled_in_the_middle_of_a_frame_gets_408_and_is_closed_but_an_idle_one_stays(broker_factory):
    b = broker_factory([{"Name": "t"}], ReadTimeout="1s")
    idle, stalled = Conn(b.socket), Conn(b.socket)
    try:
        stalled.sock.sendall(b'{"Id": "x", "Topic": "t", "Messages": [{"Payl')
        started = time.monotonic()
        reply = stalled.reply()
        assert reply == {"Status": 408, "Error": "frame not complete within ReadTimeout (1s)"}
        assert 0.9 < time.monotonic() - started < 10
        assert stalled.closed_by_broker()
        # The idle connection is older than the stalled one's first byte: a
        # ReadTimeout that counted for it too would have cut it off first
        assert idle.ask({"Id": 2, "Command": "STATUS"})["Body"]["Topics"]["t"]["Published"] == 0
        assert "stalled in the middle of a frame" in b.log
    finally:
        idle.close()
        stalled.close()


def test_a_peer_trickling_a_frame_byte_by_byte_is_cut_off_at_read_timeout_from_its_first_byte(broker_factory):
    b = broker_factory([{"Name": "t"}], ReadTimeout="1s")
    c = Conn(b.socket)
    try:
        c.sock.sendall(b'{"Id": "x", ')
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                c.sock.sendall(b" ")
            except OSError:
                break  # closed by the broker
            time.sleep(0.1)
        assert c.reply()["Status"] == 408
    finally:
        c.close()


# --- peers that send requests and never read the replies ----------------------------------------

HOSTILE = 4  # connections that flood STATUS requests and never read
FLOOD_BYTES = 4 << 20  # pipelined requests each of them sends
# What one such connection may hold (docs/security.md): one STATUS outstanding, the
# transport's 64 KiB of unsent replies plus that STATUS reply, and the reads in
# transit; 1 MiB covers it. The rest is the allocator's slack, as in test_isolation.
PER_CONNECTION_BYTES = 1 << 20
SLACK_BYTES = 16 << 20
SLOW_S = 2.5  # a reply this late means the flood held the honest client up


def _status_flood(first_id: int, size: int) -> bytes:
    """`{"Command":"STATUS","Id":n}` lines, Ids counting up from first_id, `size` bytes or so."""
    lines, n = [], first_id
    while len(lines) * 28 < size:
        lines.append(b'{"Command":"STATUS","Id":%d}\n' % n)
        n += 1
    return b"".join(lines)


def _flood(path: str) -> tuple[socket.socket, threading.Thread]:
    """A connection that sends FLOOD_BYTES of STATUS requests in the background (the
    send blocks once the broker stops reading) and reads nothing."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    data = _status_flood(0, FLOOD_BYTES)

    def send() -> None:
        try:
            sock.sendall(data)
        except OSError:
            pass  # shut down by the test once it has read what it wanted

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return sock, thread


def test_peers_that_flood_requests_without_reading_replies_hold_bounded_memory_and_slow_only_themselves(broker_factory):
    # Given a broker whose STATUS replies are large (16 topics of 8 subscribers: about 25 KB)
    subs = [f"subscriber{i:02d}" for i in range(8)]
    b = broker_factory([{"Name": f"topic{i:02d}", "Subscribers": subs} for i in range(16)], subs)
    honest = Conn(b.socket)
    honest.ask({"Id": "warm", "Command": "STATUS"})
    baseline = rss_anon(b.proc.pid)
    floods = [_flood(b.socket) for _ in range(HOSTILE)]
    try:
        # When each hostile connection pipelines megabytes of STATUS requests and never reads,
        # while an honest client asks for STATUS all along
        worst_s, peak, until = 0.0, baseline, time.monotonic() + 4.0
        while time.monotonic() < until:
            started = time.monotonic()
            assert honest.ask({"Id": "honest", "Command": "STATUS"})["Status"] == 200
            worst_s = max(worst_s, time.monotonic() - started)
            peak = max(peak, rss_anon(b.proc.pid))
            time.sleep(0.05)
        # Then the honest client is answered promptly
        assert worst_s < SLOW_S, f"a STATUS of the honest client took {worst_s:.2f}s"
        # And the broker holds no more than the stated bound per connection
        bound = HOSTILE * PER_CONNECTION_BYTES + SLACK_BYTES
        assert peak - baseline < bound, f"RssAnon grew by {(peak - baseline) >> 20} MiB ({baseline >> 20} -> {peak >> 20} MiB)"
        # And a hostile connection that finally reads gets its replies, in order
        for sock, _ in floods:
            sock.settimeout(TIMEOUT_S)
            replies = sock.makefile("rb")
            assert [msgspec.json.decode(replies.readline())["Id"] for _ in range(100)] == list(range(100))
            replies.close()
        assert b.alive()
    finally:
        honest.close()
        for sock, thread in floods:
            sock.shutdown(socket.SHUT_RDWR)
            sock.close()
            thread.join(TIMEOUT_S)


# --- per-topic limits ---------------------------------------------------------------------------


def test_a_full_topic_with_reject_answers_507_naming_the_message_and_the_limit_and_stores_nothing_of_it(broker_factory):
    b = broker_factory([{"Name": "t", "Subscribers": ["s"], "MaxMessages": 3}], ["s"])
    with b.client() as c:
        assert c.publish("t", [{"Payload": i} for i in range(2)]).accepted == 2
        with pytest.raises(ClientError) as err:
            c.publish("t", [{"Payload": "fits"}, {"Payload": "does not"}])
    assert (err.value.status, err.value.error) == (507, "Messages[1]: topic 't' is full: MaxMessages (3) reached")
    assert b.status()["Topics"]["t"]["Stored"] == 2
    sub = broker_factory.subscriber(b, "s")
    sub.wait_messages(2)
    wait_for(lambda: b.status()["Topics"]["t"]["Stored"] == 0, what="acks to free the topic")
    with b.client() as c:  # room again once messages are done
        assert c.publish("t", [{"Payload": i} for i in range(3)]).accepted == 3


def test_max_bytes_counts_the_stored_messages_as_delivered(broker_factory):
    b = broker_factory([{"Name": "t", "Subscribers": ["s"], "MaxBytes": 200}], ["s"])
    with b.client() as c:
        c.publish("t", [{"Payload": "x" * 100}])
        stored = b.status()["Topics"]["t"]["StoredBytes"]
        assert 100 < stored < 200
        with pytest.raises(ClientError, match=r"507: Messages\[0\]: topic 't' is full: MaxBytes \(200\) reached"):
            c.publish("t", [{"Payload": "y" * 100}])
        with pytest.raises(ClientError, match=r"507: Messages\[0\]: \d+ bytes exceeds MaxBytes \(200\) of topic 't'"):
            c.publish("t", [{"Payload": "z" * 300}])
    assert b.status()["Topics"]["t"]["StoredBytes"] == stored


def test_drop_oldest_makes_room_by_dropping_the_oldest_message_of_the_lowest_priority(broker_factory):
    topic = {"Name": "t", "Subscribers": ["s"], "Priorities": 2, "MaxMessages": 3, "OverflowPolicy": "drop-oldest"}
    b = broker_factory([topic], ["s"])
    with b.client() as c:
        c.publish("t", [{"Payload": "a", "Priority": 0}, {"Payload": "b", "Priority": 1}, {"Payload": "c", "Priority": 1}])
        c.publish("t", [{"Payload": "d", "Priority": 0}])  # b goes
        c.publish("t", [{"Payload": "e", "Priority": 0}])  # c goes
    assert b.status()["Topics"]["t"] | {"Subscribers": None} == {
        "Stored": 3,
        "Published": 5,
        "Replaced": 0,
        "Expired": 0,
        "StoredBytes": b.status()["Topics"]["t"]["StoredBytes"],
        "Dropped": 2,
        "Subscribers": None,
    }
    assert "t: stored 3 (" in status_table(b) and ", dropped 2" in status_table(b)
    sub = broker_factory.subscriber(b, "s")
    sub.wait_messages(3)
    assert sub.payloads() == ["a", "d", "e"]


def status_table(b) -> str:
    """What `ppmq status` prints."""
    run = subprocess.run([sys.executable, "-m", "ppmq.cli", "status", "-c", str(b.config_path)], capture_output=True, text=True, check=True)
    return run.stdout


def test_drop_oldest_refuses_with_507_when_everything_stored_is_in_flight(broker_factory):
    topic = {"Name": "t", "Subscribers": ["s"], "MaxMessages": 2, "OverflowPolicy": "drop-oldest"}
    b = broker_factory([topic], ["s"])
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Payload": 1}, {"Payload": 2}])
        sub.wait_messages(2)
        with pytest.raises(ClientError, match="507: Messages.0.: topic 't' is full: MaxMessages .2. reached"):
            c.publish("t", [{"Payload": 3}])
    assert b.status()["Topics"]["t"]["Dropped"] == 0


# --- poison messages -----------------------------------------------------------------------------


def test_a_message_delivered_max_attempts_times_without_an_ack_goes_to_the_dead_letter_topic(broker_factory):
    topics = [
        {"Name": "jobs", "Subscribers": ["worker"], "MaxAttempts": 2, "DeadLetter": "dead", "Priorities": 3},
        {"Name": "dead", "Subscribers": ["morgue"]},
    ]
    b = broker_factory(topics, ["worker", "morgue"])
    worker = broker_factory.subscriber(b, "worker", ack=None)
    morgue = broker_factory.subscriber(b, "morgue")
    with b.client() as c:
        c.publish("jobs", [{"Payload": {"poison": True}, "Priority": 2}, {"Payload": "fine"}])
        worker.wait_messages(2)
        c.ack("jobs", "worker", [m["Key"] for m in worker.messages if m["Payload"] == "fine"])
        c.reconnect("worker")  # the second delivery
        worker.wait_messages(3)
        c.reconnect("worker")  # two deliveries without an ack: given up
    (dead,) = morgue.wait_messages(1)
    assert (dead["Payload"], dead["Priority"], dead["Topic"]) == ({"poison": True}, 0, "dead")
    wait_for(lambda: b.status()["Topics"]["dead"]["Stored"] == 0, what="the morgue's ack")
    status = b.status()["Topics"]
    assert status["jobs"]["Stored"] == 0
    assert status["jobs"]["Subscribers"]["worker"] | {"OldestReadyAge": None} == {
        "Ready": [0, 0, 0],
        "InFlight": 0,
        "OldestReadyAge": None,
        "Delivered": 3,
        "Acked": 1,
        "Redelivered": 1,
        "Expired": 0,
        "IgnoredAcks": 0,
        "DeadLettered": 1,
        "Connected": True,
        "Paused": False,
        "Delayed": 0,
    }
    assert (dead["Origin"]["Topic"], dead["Origin"]["Subscriber"], dead["Origin"]["Reason"], dead["Origin"]["Attempts"]) == (
        "jobs",
        "worker",
        "attempts",
        2,
    )
    assert status["dead"]["Published"] == 1
    assert re.search(r"^  worker +0/0/0 +0 +0 +- +3 +1 +1 +0 +1$", status_table(b), re.M), status_table(b)
    assert [m["Payload"] for m in worker.messages] == ["fine", {"poison": True}, {"poison": True}]


def test_without_a_dead_letter_topic_a_poison_message_is_dropped_with_a_log_record(broker_factory):
    b = broker_factory([{"Name": "jobs", "Subscribers": ["worker"], "MaxAttempts": 1, "AckRetry": "1s"}], ["worker"])
    worker = broker_factory.subscriber(b, "worker", ack=None)
    with b.client() as c:
        c.publish("jobs", [{"Payload": "poison"}])
    worker.wait_messages(1)
    wait_for(lambda: b.sub_status("jobs", "worker")["DeadLettered"] == 1, what="AckRetry to give the message up")
    assert b.status()["Topics"]["jobs"]["Stored"] == 0
    assert "topic jobs: message 1 dropped for subscriber worker after 1 deliveries without an ack (no DeadLetter)" in b.log
    # Past another AckRetry (a marker published now is given up in turn): never delivered again
    with b.client() as c:
        c.publish("jobs", [{"Payload": "marker"}])
    wait_for(lambda: b.sub_status("jobs", "worker")["DeadLettered"] == 2, what="AckRetry to give the marker up")
    assert [m["Payload"] for m in worker.messages] == ["poison", "marker"]


# --- configuration ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "topics, error",
    [
        ("[{Name: a, DeadLetter: nowhere}]", "Topics[0].DeadLetter: unknown topic 'nowhere'"),
        ("[{Name: a, DeadLetter: b}, {Name: b, DeadLetter: a}]", "Topics[0].DeadLetter: leads back to topic 'a'"),
        ("[{Name: a, DeadLetter: a}]", "Topics[0].DeadLetter: leads back to topic 'a'"),
        ("[{Name: a, OverflowPolicy: drop-newest}]", "Topics[0].OverflowPolicy: must be one of reject, drop-oldest, got 'drop-newest'"),
        ("[{Name: a, MaxMessages: -1}]", "Topics[0].MaxMessages: must not be negative, got -1"),
        ("[{Name: a, MaxBytes: 12XB}]", "Topics[0].MaxBytes: invalid size '12XB'"),
    ],
)
def test_limit_keys_that_cannot_work_are_configuration_errors_naming_the_key(topics: str, error: str):
    with pytest.raises(ConfigError) as err:
        parse_config(f"ServerSocket: /tmp/s\nDataPath: mem\nTopics: {topics}\n", Path("/etc/ppmq.yaml"))
    assert error in str(err.value)


@pytest.mark.parametrize("mode, parsed", [("0640", 0o640), ("0o600", 0o600), (0o660, 0o660)])
def test_socket_mode_is_read_in_octal(mode, parsed):
    config = parse_config(f"ServerSocket: /tmp/s\nDataPath: mem\nSocketMode: {mode!r}\n".replace("'", '"'), Path("/x.yaml"))
    assert config.socket_mode == parsed


def test_a_socket_mode_that_is_not_octal_permission_bits_is_a_configuration_error():
    with pytest.raises(ConfigError, match="SocketMode: invalid mode 'rw-rw----'"):
        parse_config("ServerSocket: /tmp/s\nDataPath: mem\nSocketMode: rw-rw----\n", Path("/x.yaml"))
