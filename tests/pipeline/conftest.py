"""A real local Spark for the whole session, and journals written by real brokers
running a workload whose figures the tests know independently."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest

from ppmq.errors import ClientError

# Before any JVM starts: workers must run this interpreter (it has ppmq), on loopback.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession

from ppmq.pipeline.datasource import PpmqDataSource
from ppmq.pipeline.session import local_session

from ..conftest import BrokerProcess, Subscriber, make_config, wait_for

SLOW_GROUPS = ((40, 0.0), (16, 0.6), (4, 1.6))  # (messages, seconds the slow subscriber waits before acking them)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    base = tmp_path_factory.mktemp("spark")
    session = local_session(
        "local[2]",
        "ppmq tests",
        **{
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "1g",
            "spark.local.dir": str(base / "local"),
            "spark.sql.warehouse.dir": str(base / "warehouse"),
        },
    )
    session.dataSource.register(PpmqDataSource)
    yield session
    session.stop()


@dataclass
class Workload:
    """Journals of two hosts, and what the test side saw happen."""

    journals: list[Path]
    published: dict[tuple[str, str], int] = field(default_factory=dict)  # (host, topic) -> messages
    delivered_bytes: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (host, topic, sub) -> bytes of first deliveries
    ack_bounds_s: list[tuple[float, float]] = field(default_factory=list)  # per slow ack: (least, most) latency possible


def _start(tmp: Path, topics: list[dict], subs: list, host: str) -> BrokerProcess:
    return BrokerProcess(tmp, make_config(tmp, topics, subs, Journal={"Host": host})).start()


def _size(message: dict) -> int:
    """A delivered message's size as the journal counts it: its compact JSON."""
    return len(msgspec.json.encode({k: v for k, v in message.items() if k != "Topic"}))


def _alpha(tmp: Path, w: Workload) -> None:
    """orders: `fast` acks at once, `slow` acks in three groups after known waits;
    jobs: `flaky` gets everything twice (RECONNECT); cache: dedupe replacements and
    expiries nobody receives; one rejected publish."""
    topics = [
        {"Name": "orders", "Subscribers": ["fast", "slow"]},
        {"Name": "jobs", "Subscribers": ["flaky"]},
        {"Name": "cache", "Dedupe": True, "Expire": True, "Subscribers": ["away"]},
    ]
    subs = [{"Name": n, "BatchSize": 100} for n in ("fast", "slow", "flaky", "away")]
    b = _start(tmp, topics, subs, "alpha")
    fast = Subscriber(b.sub_socket("fast"), server_socket=b.socket)
    slow = Subscriber(b.sub_socket("slow"), ack=None)
    flaky = Subscriber(b.sub_socket("flaky"), ack=None)
    try:
        with b.client() as c:
            n = sum(k for k, _ in SLOW_GROUPS)
            sent = time.monotonic()
            c.publish("orders", [{"Payload": f"order {i}", "Priority": 0} for i in range(n)])
            confirmed = time.monotonic()
            keys = [m["Key"] for m in slow.wait_messages(n)]
            for count, wait_s in SLOW_GROUPS:
                time.sleep(max(0.0, confirmed + wait_s - time.monotonic()))
                group, keys = keys[:count], keys[count:]
                before = time.monotonic()
                c.ack("orders", "slow", group)
                after = time.monotonic()
                w.ack_bounds_s += [(before - confirmed, after - sent)] * count
            fast.wait_messages(n)
            c.publish("jobs", [{"Payload": i} for i in range(10)])
            flaky.wait_messages(10)
            c.reconnect("flaky")
            c.ack("jobs", "flaky", [m["Key"] for m in flaky.wait_messages(20)[10:]])
            for key in "abc":
                c.publish("cache", [{"Key": key, "Payload": 1, "TTL": 0.5}])
            c.publish("cache", [{"Key": "a", "Payload": 2, "TTL": 0.5}, {"Key": "b", "Payload": 2, "TTL": 0.5}])
            wait_for(lambda: b.status()["Topics"]["cache"]["Expired"] == 3, what="3 expiries")
            wait_for(lambda: b.sub_status("orders", "fast")["Acked"] == n, what="fast acks")
        _reject(b)
        w.published |= {("alpha", "orders"): n, ("alpha", "jobs"): 10, ("alpha", "cache"): 5}
        w.delivered_bytes[("alpha", "orders", "fast")] = sum(map(_size, fast.messages))
        w.delivered_bytes[("alpha", "jobs", "flaky")] = sum(map(_size, flaky.messages[:10]))
    finally:
        for s in (fast, slow, flaky):
            s.close()
        assert b.stop() == 0
    w.journals.append(Path(b.config["DataPath"]) / "journal")


def _reject(b: BrokerProcess) -> None:
    """A publish the broker rejects whole: its second message's priority is out of range."""
    with b.client() as c, pytest.raises(ClientError, match="Priority"):
        c.publish("orders", [{"Payload": "x"}, {"Payload": "y", "Priority": 3}])


def _beta(tmp: Path, w: Workload) -> None:
    """A second host: 25 orders to one subscriber that acks at once."""
    b = _start(tmp, [{"Name": "orders", "Subscribers": ["fast"]}], ["fast"], "beta")
    fast = Subscriber(b.sub_socket("fast"), server_socket=b.socket)
    try:
        with b.client() as c:
            c.publish("orders", [{"Payload": {"n": i}} for i in range(25)])
        fast.wait_messages(25)
        wait_for(lambda: b.sub_status("orders", "fast")["Acked"] == 25, what="beta acks")
        w.published[("beta", "orders")] = 25
        w.delivered_bytes[("beta", "orders", "fast")] = sum(map(_size, fast.messages))
    finally:
        fast.close()
        assert b.stop() == 0
    w.journals.append(Path(b.config["DataPath"]) / "journal")


@pytest.fixture(scope="session")
def workload() -> Iterator[Workload]:
    with tempfile.TemporaryDirectory(prefix="ppmq-w-") as d:
        w = Workload([])
        for name, run in (("a", _alpha), ("b", _beta)):
            tmp = Path(d) / name
            tmp.mkdir()
            run(tmp, w)
        yield w
