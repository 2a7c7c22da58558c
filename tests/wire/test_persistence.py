"""PROTOCOL §3 Persistence: what was answered 200 survives a restart and a kill -9."""

from __future__ import annotations

import threading

import pytest

from ppmq.client.library import Client
from ppmq.errors import ClientError

from ..conftest import wait_for


def test_a_clean_restart_keeps_the_backlog_in_flight_entries_and_counters(broker_factory):
    b = broker_factory([{"Name": "t", "Priorities": 2, "Subscribers": ["s"]}], [{"Name": "s", "BatchSize": 2}])
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Payload": i, "Priority": i % 2} for i in range(6)])
    sub.wait_messages(2)
    before = b.sub_status("t", "s")
    assert b.stop() == 0
    b.start()
    after = b.sub_status("t", "s")
    assert after.pop("OldestReadyAge") >= before.pop("OldestReadyAge")
    assert after == before
    with b.client() as c:
        c.reconnect("s")  # what a restarted subscriber sends: in-flight ones come again, in order
    sub.wait_messages(4)
    assert sub.payloads() == [0, 2, 0, 2]


def test_every_message_confirmed_before_a_kill_9_is_delivered_after_the_restart(broker_factory):
    # Given a publisher that keeps sending confirmed batches
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"])
    confirmed: list[int] = []
    stop = threading.Event()

    def publish() -> None:
        n = 0
        try:
            with Client(b.socket, timeout_s=5) as c:
                while not stop.is_set():
                    c.publish("t", [{"Payload": n + i} for i in range(100)])
                    confirmed.extend(range(n, n + 100))
                    n += 100
        except ClientError:
            pass  # the broker was killed under us; unconfirmed batches may or may not be stored

    publisher = threading.Thread(target=publish)
    publisher.start()
    wait_for(lambda: len(confirmed) >= 2000, what="some confirmed batches")
    # When the broker is killed with SIGKILL in the middle of it and restarted
    b.kill()
    stop.set()
    publisher.join()
    b.start()
    # Then a subscriber receives every confirmed message (at least once), in publish order
    sub = broker_factory.subscriber(b, "s")
    wait_for(lambda: set(confirmed) <= set(sub.payloads()), what=f"{len(confirmed)} confirmed messages")
    got = sub.payloads()
    assert got == sorted(got)
    st = b.status()["Topics"]["t"]
    assert st["Published"] >= len(confirmed)


def test_a_kill_9_while_batches_are_in_flight_loses_nothing_and_reconnect_brings_them_back(broker_factory):
    b = broker_factory([{"Name": "t", "AckRetry": "1h", "Subscribers": ["s"]}], [{"Name": "s", "BatchSize": 10, "Window": 10}])
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Payload": i} for i in range(30)])
    sub.wait_messages(10)
    b.kill()
    b.start()
    assert b.sub_status("t", "s")["InFlight"] == 10
    with b.client() as c:
        c.reconnect("s")
    keys = [m["Key"] for m in sub.wait_messages(20)]
    assert sub.payloads()[10:20] == list(range(10))
    with b.client() as c:
        assert c.ack("t", "s", keys[10:20]).accepted == 10
    sub.wait_messages(30)
    assert sub.payloads()[20:30] == list(range(10, 20))


def test_data_path_mem_keeps_a_throwaway_store_that_is_gone_after_the_stop(broker_factory):
    import re
    from pathlib import Path

    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"], DataPath="mem")
    with b.client() as c:
        c.publish("t", [{"Payload": 1}])
    sub = broker_factory.subscriber(b, "s")
    sub.wait_messages(1)
    store = Path(re.search(r"data in (\S+)", b.log)[1])
    assert store.is_dir() and store.name.startswith("ppmq-mem-")
    assert b.stop() == 0
    assert not store.exists()


def test_a_full_store_refuses_publishes_with_507_while_deliveries_and_acks_free_it(broker_factory):
    b = broker_factory([{"Name": "t", "Subscribers": ["s"]}], ["s"], MaxStoreBytes="2MiB")
    big = "x" * 50_000
    with b.client() as c:
        stored = 0
        with pytest.raises(ClientError) as err:
            for _ in range(200):
                stored += c.publish("t", [{"Payload": big}] * 5).accepted
        assert err.value.status == 507 and "MaxStoreBytes" in err.value.error
        assert b.status()["Topics"]["t"]["Stored"] == stored > 0
        sub = broker_factory.subscriber(b, "s")
        sub.wait_messages(stored)
        wait_for(lambda: b.status()["Topics"]["t"]["Stored"] == 0, what="acks to free the store")
        assert c.publish("t", [{"Payload": big}] * 5).accepted == 5
