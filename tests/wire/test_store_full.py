"""A full store and a full disk (PROTOCOL §4, status 507): publishes are refused
whole, acks and deliveries go on, and the broker takes publishes again by itself
once there is room; nothing refused is stored, nothing confirmed is lost."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import msgspec
import pytest

from ppmq.client.library import Client
from ppmq.config import Config, SubscriberConfig, TopicConfig
from ppmq.core.broker import Broker
from ppmq.core.ops import Unwritten
from ppmq.errors import ClientError
from ppmq.protocol import messages as p
from ppmq.store.fsck import read_snapshot
from ppmq.store.migrate import CONVERT_BYTES
from ppmq.store.schema import SCHEMA_VERSION
from ppmq.store.state import NS
from ppmq.store.store import Store
from tests.data.make_old_store import FULL_MAX_BYTES, FULL_PAYLOAD_BYTES, full_payload

from ..conftest import BrokerProcess, Subscriber, wait_for

DATA = Path(__file__).parent.parent / "data"

PAD = "x" * 20_000
NOW = 1_800_000_000 * NS


class Publisher:
    """Publishes batches of five 20 KB messages, numbered, and files each under the
    status it got; a 507 must say why."""

    def __init__(self, socket_path: str, why: str) -> None:
        self.path, self.why = socket_path, why
        self.confirmed: list[str] = []
        self.refused: list[str] = []
        self.refused_batches: list[int] = []
        self.last_confirmed_batch = -1
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def publish_one(self, client: Client, n: int) -> None:
        names = [f"{n}.{i}" for i in range(5)]
        try:
            client.publish("t", [{"Payload": f"{name}:{PAD}"} for name in names])
        except ClientError as exc:
            assert exc.status == 507 and self.why in exc.error, exc
            self.refused += names
            self.refused_batches.append(n)
        else:
            self.confirmed += names
            self.last_confirmed_batch = n

    def _run(self) -> None:
        with Client(self.path, timeout_s=30) as client:
            n = 0
            while not self.stop.is_set():
                self.publish_one(client, n)
                n += 1

    def accepted_after_refusal(self) -> bool:
        return bool(self.refused_batches) and self.last_confirmed_batch > self.refused_batches[0]

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def names(sub: Subscriber) -> set[str]:
    return {m["Payload"].split(":", 1)[0] for m in sub.messages}


def fsck(b: BrokerProcess) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ppmq.cli", "fsck", "-c", str(b.config_path)], capture_output=True, text=True, timeout=60)


def ack_delivered(b: BrokerProcess, sub: Subscriber, acked: set[str]) -> None:
    """Ack, through ServerSocket, every key delivered and not acked yet."""
    keys = [m["Key"] for m in sub.messages if m["Key"] not in acked]
    if keys:
        with b.client() as c:
            assert c.ack("t", "s", keys).accepted == len(keys)
        acked.update(keys)


def test_at_max_store_bytes_publishes_get_507_while_acks_free_room_and_publishing_resumes_unaided(broker_factory):
    # Given a 2 MiB store, a publisher that never stops, and a subscriber that acks only when told
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], [{"Name": "s", "BatchSize": 20, "Window": 20}], MaxStoreBytes="2MiB")
    sub = broker_factory.subscriber(b, "s", ack=None)
    publisher = Publisher(b.socket, "MaxStoreBytes")
    try:
        wait_for(lambda: publisher.refused, what="the store to fill up")
        # When the subscriber acks what it was given, again and again, while the store is full
        acked: set[str] = set()
        wait_for(lambda: ack_delivered(b, sub, acked) or publisher.accepted_after_refusal(), timeout_s=60, what="publishes accepted again")
    finally:
        publisher.finish()
    wait_for(lambda: ack_delivered(b, sub, acked) or b.status()["Topics"]["t"]["Stored"] == 0, timeout_s=60, what="the backlog to drain")
    # Then everything confirmed was delivered, nothing refused was, and the store is consistent
    assert names(sub) == set(publisher.confirmed)
    assert not names(sub) & set(publisher.refused)
    assert fsck(b).returncode == 0


@contextmanager
def tmpfs(disk: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of `size_bytes` mounted on `disk`: a disk to fill up."""
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(disk)], capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs to fill up (needs root and mount rights): {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


@pytest.fixture
def small_disk(short_tmp: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs: a disk that fills up long before the store's MaxStoreBytes."""
    with tmpfs(short_tmp / "disk", 8 << 20) as disk:
        yield disk


def test_a_full_disk_fails_the_commit_with_507_stores_nothing_half_and_recovers_when_space_returns(small_disk, broker_factory):
    # Given a store on an 8 MiB disk, with MaxStoreBytes far above that
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"], DataPath=str(small_disk / "data"), MaxStoreBytes="1GiB")
    publisher = Publisher(b.socket, "disk full")
    try:
        # When the disk fills up
        wait_for(lambda: len(publisher.refused) >= 50, timeout_s=60, what="publishes refused on a full disk")
    finally:
        publisher.finish()
    # Then what was confirmed is stored, what was refused is not, and the store is consistent
    # (read from the store: STATUS commits its counters, so it may fail on a full disk too)
    assert len(read_snapshot(str(small_disk / "data")).bodies) == len(publisher.confirmed) > 0
    assert fsck(b).returncode == 0
    # And when space returns, publishes are taken again without a restart
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    with b.client() as c:
        publisher.publish_one(c, publisher.refused_batches[-1] + 1)
    assert publisher.accepted_after_refusal()
    # And after a kill -9 and a restart, a subscriber gets exactly the confirmed messages
    b.kill()
    assert fsck(b).returncode == 0
    b.start()
    sub = broker_factory.subscriber(b, "s")
    sub.wait_messages(len(publisher.confirmed), timeout_s=60)
    assert names(sub) == set(publisher.confirmed)


def fill(disk: Path) -> None:
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass


@contextmanager
def broker_on(disk: Path, batch_size: int) -> Iterator[Broker]:
    """A broker driven directly (topic t, subscriber s) on a store on `disk`."""
    config = Config(
        server_socket="/nonexistent",
        data_path=str(disk / "data"),
        sync=False,
        max_store_bytes=1 << 30,
        subscribers=[SubscriberConfig(name="s", socket="/nonexistent/s", batch_size=batch_size)],
        topics=[TopicConfig(name="t", subscribers=["s"])],
    )
    store = Store(config.data_path, sync=False, max_bytes=config.max_store_bytes)
    try:
        yield Broker(config, store, NOW)
    finally:
        store.close()


def test_an_unwritten_batch_in_a_step_whose_commit_fails_goes_back_to_ready_once_the_disk_has_room(small_disk):
    # The broker is driven directly: over the wire, a batch cannot be made to come
    # back at the very step whose commit hits the full disk.
    with broker_on(small_disk, batch_size=10) as broker:
        # Given a batch in flight to s, and a full disk
        broker.step([publish(b'"m%d"' % i for i in range(10))], set(), NOW)
        (batch,) = broker.step([], {"s"}, NOW).deliveries
        fill(small_disk)
        # When the batch comes back (its write failed) in a step whose commit fails
        step = broker.step([Unwritten("s", "t", batch.msgs), publish([b'"' + b"x" * 100_000 + b'"'] * 40)], set(), NOW)
        assert step.replies[0] is None and step.replies[1].status == 507
        # Then, once the disk has room, the batch is ready again and pushed again
        (small_disk / "filler").unlink()
        (again,) = broker.step([], {"s"}, NOW).deliveries
        assert again.msgs == batch.msgs
        assert broker.state.subs["t"]["s"].inflight == 10


def test_a_key_pushed_by_a_step_whose_commit_fails_is_never_handed_out_again(small_disk):
    # The broker is driven directly: over the wire, the commit that fails cannot be
    # told from the one before it. Batches leave before their step's commit.
    with broker_on(small_disk, batch_size=100) as broker:
        # Given a full disk
        fill(small_disk)
        # When a step pushes new messages to s, then fails to commit them
        pushed = []
        step = broker.step([publish([b'"first"'] + [b'"' + b"x" * 100_000 + b'"'] * 40)], {"s"}, NOW, pushed.extend)
        assert step.replies[0].status == 507
        left = {m["Key"] for d in pushed for m in msgspec.json.decode(d.frame)["Messages"]}
        assert len(left) == 41
        # Then, once the disk has room, the next message gets a key none of them left with,
        # also beside a request that fails, which makes the step run again from the last commit
        (small_disk / "filler").unlink()
        unknown = p.Request(topic="nope", messages=[p.Message(payload=msgspec.Raw(b"1"))], id=msgspec.Raw(b"2"))
        step = broker.step([publish([b'"second"']), unknown], {"s"}, NOW)
        assert [reply.status for reply in step.replies] == [200, 404]
        (again,) = step.deliveries
        (key,) = [m["Key"] for m in msgspec.json.decode(again.frame)["Messages"]]
        assert key not in left


def publish(payloads) -> p.Request:
    return p.Request(topic="t", messages=[p.Message(payload=msgspec.Raw(x)) for x in payloads], id=msgspec.Raw(b"1"))


HOLD_A_SNAPSHOT = """
import sys, time
from ppmq.store.reader import StoreReader
with StoreReader(sys.argv[1]).snapshot():
    print("reading", flush=True)
    time.sleep(60)
"""


def test_a_reader_killed_inside_a_snapshot_does_not_keep_the_store_growing(broker_factory):
    # Given a reader (a report, fsck) killed with kill -9 in the middle of its snapshot
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"], Sync=False)
    _sub = broker_factory.subscriber(b, "s")
    data = Path(b.config["DataPath"])
    reader = subprocess.Popen([sys.executable, "-c", HOLD_A_SNAPSHOT, str(data)], stdout=subprocess.PIPE)
    assert reader.stdout.readline() == b"reading\n"
    reader.kill()
    reader.wait()
    size_before = (data / "data.mdb").stat().st_size
    # When thousands of messages come and go, leaving nothing stored
    with b.client() as c:
        for _ in range(5000):
            c.publish("t", [{"Payload": "x" * 1000}])
    wait_for(lambda: b.sub_status("t", "s")["Acked"] == 5000, what="every message acked")
    # Then the store reuses its pages instead of growing towards map full
    growth = (data / "data.mdb").stat().st_size - size_before
    assert growth < 4 << 20, f"data.mdb grew by {growth} bytes"
    assert b.status()["Topics"]["t"]["Stored"] == 0


def full_old_store(data: Path) -> Path:
    """The store a schema 4 ppmq filled until it refused a publish for want of
    room (tests/data/make_old_store.py --full), unpacked into `data`."""
    with tarfile.open(DATA / "schema4-full-store.tar.gz") as tar:
        tar.extractall(data, filter="data")
    return data


def full_store_broker(broker_factory, data: Path) -> BrokerProcess:
    """A broker, not started, on the full store's config and the store at `data`."""
    return broker_factory(
        [{"Name": "bulk", "Subscribers": ["a"]}],
        [{"Name": "a", "BatchSize": 50}],
        start=False,
        DataPath=str(data),
        MaxStoreBytes=FULL_MAX_BYTES,
    )


def drains_in_order(b: BrokerProcess, sub: Subscriber, stored: int) -> None:
    """sub gets and acks every message of the full store, each as the old ppmq
    stored it: also those the old ppmq had in flight to it, which it asks for
    again as a subscriber that starts does (PROTOCOL §3 RECONNECT)."""
    with b.client() as c:
        c.reconnect("a")
    wait_for(lambda: b.status()["Topics"]["bulk"]["Stored"] == 0, timeout_s=60, what="the full store to drain")
    payloads = sorted(sub.payloads("bulk"), key=lambda payload: int(payload.split(":")[0]))
    assert [msgspec.json.encode(payload) for payload in dict.fromkeys(payloads)] == [full_payload(n) for n in range(stored)]


def test_serve_upgrades_a_store_an_older_ppmq_filled_to_its_max_store_bytes_and_keeps_within_them(broker_factory, short_tmp):
    # Given a store that a schema 4 ppmq filled until it refused a publish for want of room
    b = full_store_broker(broker_factory, full_old_store(short_tmp / "data"))
    # When ppmq serve starts on it, with the MaxStoreBytes it was filled to
    b.start()
    # Then the store is converted, and still full: a publish is refused for want of room
    assert "converted from schema 4 to 5" in b.log and f"to {SCHEMA_VERSION} (" in b.log
    stored = b.status()["Topics"]["bulk"]["Stored"]
    assert stored * FULL_PAYLOAD_BYTES > FULL_MAX_BYTES * 0.9
    with b.client() as c, pytest.raises(ClientError) as refused:
        c.publish("bulk", [{"Payload": "x" * 1000}])
    assert refused.value.status == 507 and "MaxStoreBytes" in refused.value.error
    # And once its subscriber has taken and acked every message, each as it was stored, publishes are taken again
    drains_in_order(b, broker_factory.subscriber(b, "a"), stored)
    with b.client() as c:
        assert c.publish("bulk", [{"Payload": "x" * 1000}]).accepted == 1
    assert fsck(b).returncode == 0


def test_an_upgrade_cut_short_by_a_full_disk_fails_cleanly_hides_the_store_and_is_finished_by_the_next_start(broker_factory, short_tmp):
    # Given the full store on a disk with room for it and for one slice of its conversion, not for the slices after it
    data_bytes = (full_old_store(short_tmp / "unpacked") / "data.mdb").stat().st_size
    with tmpfs(short_tmp / "disk", data_bytes + CONVERT_BYTES + (1 << 20)) as disk:
        shutil.copytree(short_tmp / "unpacked", disk / "data")
        b = full_store_broker(broker_factory, disk / "data")
        # When ppmq migrate converts it and runs out of disk
        migrate = subprocess.run(
            [sys.executable, "-m", "ppmq.cli", "migrate", "-c", str(b.config_path)], capture_output=True, text=True, timeout=60
        )
        # Then it says so, without a traceback
        assert migrate.returncode == 1 and "Traceback" not in migrate.stderr
        assert f"cannot bring the store at {disk / 'data'} to schema {SCHEMA_VERSION}: disk full" in migrate.stderr
        # and fsck, which reads no store half converted, refuses it
        checked = fsck(b)
        assert checked.returncode == 2 and "part converted" in checked.stderr, checked.stderr
        # And once the disk has room, the broker's start finishes the conversion, and every message is there as it was
        subprocess.run(["mount", "-o", f"remount,size={2 * data_bytes}", str(disk)], check=True)
        b.start()
        stored = b.status()["Topics"]["bulk"]["Stored"]
        assert stored * FULL_PAYLOAD_BYTES > FULL_MAX_BYTES * 0.9
        drains_in_order(b, broker_factory.subscriber(b, "a"), stored)
        assert b.stop() == 0
        assert fsck(b).returncode == 0
