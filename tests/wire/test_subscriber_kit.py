"""The subscriber kit against a real broker: both flavours deliver and ack, a
failing handler gets its messages again, an idle subscriber exits, and a start
sends RECONNECT so that what an earlier run left unacked comes back, unless that
run exited idle having acked all it was given."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ppmq.client import subscriber as kit
from ppmq.errors import SubscriberError
from tests.conftest import BrokerProcess, wait_for


class KitThread:
    """`kit.run` or `kit.serve` on a thread of the test, with a record of what it was handed."""

    def __init__(self, handler: Callable, settings: kit.Settings, flavour: str) -> None:
        self.error: BaseException | None = None
        target = (lambda: kit.run(handler, settings)) if flavour == "blocking" else (lambda: asyncio.run(kit.serve(handler, settings)))
        self.thread = threading.Thread(target=self._main, args=(target,), daemon=True)
        self.thread.start()

    def _main(self, target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as exc:  # surfaced by the test through .error
            self.error = exc

    def join(self, timeout_s: float) -> bool:
        self.thread.join(timeout_s)
        return not self.thread.is_alive()


def settings_for(b: BrokerProcess, name: str, idle_exit_s: float = 0) -> kit.Settings:
    return kit.settings(name, str(b.config_path), idle_exit_s=idle_exit_s)


def recording(seen: list, fail: Callable[[kit.Message], bool] = lambda m: False) -> Callable[[kit.Batch], None]:
    def handle(batch: kit.Batch) -> None:
        for m in batch.messages:
            seen.append((m.key, m.payload))
        if any(fail(m) for m in batch.messages):
            raise RuntimeError("handler failed")

    return handle


def recording_async(seen: list, fail: Callable[[kit.Message], bool] = lambda m: False) -> Callable:
    sync = recording(seen, fail)

    async def handle(batch: kit.Batch) -> None:
        await asyncio.sleep(0)
        sync(batch)

    return handle


HANDLERS = {"blocking": recording, "asyncio": recording_async}
FLAVOURS = pytest.mark.parametrize("flavour", ["blocking", "asyncio"])


def publish(b: BrokerProcess, topic: str, payloads: list[object], priority: int = 0) -> None:
    with b.client() as c:
        c.publish(topic, [{"Payload": p, "Priority": priority} for p in payloads])


def all_acked(b: BrokerProcess, topic: str, sub: str, n: int) -> bool:
    s = b.sub_status(topic, sub)
    return s["Acked"] >= n and s["InFlight"] == 0 and not any(s["Ready"])


@FLAVOURS
def test_every_message_is_handed_over_in_priority_order_and_acked(broker_factory, flavour):
    # Given a backlog on two priorities
    b = broker_factory([{"Name": "jobs", "Subscribers": ["worker"], "Priorities": 2}], ["worker"])
    publish(b, "jobs", [f"low{i}" for i in range(30)], priority=1)
    publish(b, "jobs", [f"high{i}" for i in range(30)], priority=0)
    seen: list = []
    # When the kit runs with the name only, reading paths from the broker's config
    k = KitThread(HANDLERS[flavour](seen), settings_for(b, "worker"), flavour)
    # Then every message arrives once, priority 0 first, and all are acked
    wait_for(lambda: all_acked(b, "jobs", "worker", 60), what="60 acks")
    assert [p for _, p in seen] == [f"high{i}" for i in range(30)] + [f"low{i}" for i in range(30)]
    assert b.sub_status("jobs", "worker")["Redelivered"] == 0
    assert k.error is None


@FLAVOURS
def test_a_batch_whose_handler_raises_is_not_acked_and_comes_again(broker_factory, flavour):
    b = broker_factory([{"Name": "jobs", "Subscribers": ["worker"], "AckRetry": "1s"}], ["worker"])
    publish(b, "jobs", ["flaky", "fine"])
    seen: list = []
    attempts = {"n": 0}

    def fail_first(m: kit.Message) -> bool:
        attempts["n"] += m.payload == "flaky"
        return m.payload == "flaky" and attempts["n"] == 1

    # Given a handler that raises the first time it sees "flaky"
    KitThread(HANDLERS[flavour](seen, fail_first), settings_for(b, "worker"), flavour)
    # Then the whole batch is redelivered after AckRetry, handled again and acked
    wait_for(lambda: all_acked(b, "jobs", "worker", 2), what="both acked after the retry")
    assert [p for _, p in seen] == ["flaky", "fine", "flaky", "fine"]
    assert b.sub_status("jobs", "worker")["Redelivered"] == 2


def test_each_acks_the_messages_that_succeeded_and_only_the_failed_one_comes_again(broker_factory):
    b = broker_factory([{"Name": "jobs", "Subscribers": ["worker"], "AckRetry": "1s"}], ["worker"])
    publish(b, "jobs", ["a", "bad", "c"])
    calls: list = []

    def handle_one(m: kit.Message) -> None:
        calls.append(m.payload)
        if m.payload == "bad" and calls.count("bad") == 1:
            raise ValueError("cannot handle this one yet")

    KitThread(kit.each(handle_one), settings_for(b, "worker"), "blocking")
    wait_for(lambda: all_acked(b, "jobs", "worker", 3), what="three acks")
    assert calls == ["a", "bad", "c", "bad"]
    assert b.sub_status("jobs", "worker")["Redelivered"] == 1


def test_a_handler_returning_keys_acks_exactly_those(broker_factory):
    b = broker_factory([{"Name": "jobs", "Subscribers": ["worker"]}], ["worker"])
    publish(b, "jobs", [1, 2, 3, 4])
    k = KitThread(lambda batch: [m for m in batch.messages if m.payload % 2 == 0], settings_for(b, "worker"), "blocking")
    wait_for(lambda: b.sub_status("jobs", "worker")["Acked"] == 2, what="two acks")
    # (the ack of a later batch, on the same connection, comes after anything more the kit sent for the first)
    publish(b, "jobs", [6])
    wait_for(lambda: b.sub_status("jobs", "worker")["Acked"] == 3, what="the later batch's ack")
    s = b.sub_status("jobs", "worker")
    assert (s["Acked"], s["InFlight"]) == (3, 2)
    assert k.error is None


@FLAVOURS
def test_an_idle_subscriber_exits_and_removes_the_socket_it_bound(broker_factory, flavour):
    b = broker_factory([{"Name": "jobs", "Subscribers": ["worker"]}], ["worker"])
    publish(b, "jobs", ["only"])
    seen: list = []
    started = time.monotonic()
    k = KitThread(HANDLERS[flavour](seen), settings_for(b, "worker", idle_exit_s=1.0), flavour)
    assert k.join(15), "the subscriber did not exit when idle"
    assert k.error is None
    assert [p for _, p in seen] == ["only"]
    assert time.monotonic() - started >= 1.0
    assert not Path(b.sub_socket("worker")).exists()
    assert all_acked(b, "jobs", "worker", 1)


@pytest.mark.parametrize("fails", [False, True], ids=["all acked", "one unacked"])
def test_an_idle_exit_records_that_all_was_acked_and_a_start_uses_the_record_up(broker_factory, tmp_path, fails):
    # Given a kit with a runtime directory, whose handler acks all or leaves one message unacked
    b = broker_factory([{"Name": "jobs", "Subscribers": ["worker"], "AckRetry": 0}], ["worker"])
    publish(b, "jobs", ["x", "y"])
    seen: list = []
    settings = kit.settings("worker", str(b.config_path), idle_exit_s=1.0)
    settings.runtime_dir = str(tmp_path)
    k = KitThread(recording(seen, fail=lambda m: fails and m.payload == "y"), settings, "blocking")
    # When it exits idle
    assert k.join(15), "the subscriber did not exit when idle"
    assert k.error is None
    # Then the record says whether it owes nothing, and the next start uses it up
    record = tmp_path / "acked-all"
    assert record.exists() is not fails
    if not fails:
        publish(b, "jobs", ["z"])
        later = KitThread(recording(seen), settings, "blocking")
        assert later.join(15) and later.error is None
        assert [p for _, p in seen] == ["x", "y", "z"]
        assert b.sub_status("jobs", "worker")["Redelivered"] == 0


@FLAVOURS
def test_a_start_sends_reconnect_so_what_an_earlier_run_left_unacked_comes_again(broker_factory, flavour):
    # Given messages delivered to an earlier run that died without acking (AckRetry off)
    b = broker_factory([{"Name": "jobs", "Subscribers": ["worker"], "AckRetry": 0}], ["worker"])
    earlier = broker_factory.subscriber(b, "worker", ack=None)
    publish(b, "jobs", ["x", "y", "z"])
    earlier.wait_messages(3)
    earlier.close()
    assert b.sub_status("jobs", "worker")["InFlight"] == 3
    # When the kit starts
    seen: list = []
    KitThread(HANDLERS[flavour](seen), settings_for(b, "worker"), flavour)
    # Then they are delivered again and acked
    wait_for(lambda: all_acked(b, "jobs", "worker", 3), what="the earlier run's messages acked")
    assert [p for _, p in seen] == ["x", "y", "z"]


def test_explicit_paths_need_no_config_file(broker_factory, short_tmp):
    b = broker_factory([{"Name": "jobs", "Subscribers": ["worker"]}], ["worker"])
    s = kit.settings("worker", socket_path=b.sub_socket("worker"), server_socket=b.socket, idle_exit_s=0)
    assert s == kit.Settings("worker", b.sub_socket("worker"), b.socket, 0)
    seen: list = []
    KitThread(recording(seen), s, "blocking")
    publish(b, "jobs", ["hi"])
    wait_for(lambda: all_acked(b, "jobs", "worker", 1), what="one ack")


def test_an_unknown_subscriber_name_is_an_error_naming_the_file_and_the_known_names(broker_factory):
    b = broker_factory([{"Name": "jobs", "Subscribers": ["worker"]}], ["worker"], start=False)
    with pytest.raises(SubscriberError, match=r"ppmq\.yaml: no subscriber named 'wroker' \(Subscribers: worker\)"):
        kit.settings("wroker", str(b.config_path))


def test_a_socket_another_subscriber_listens_on_is_not_taken_over(broker_factory):
    b = broker_factory([{"Name": "jobs", "Subscribers": ["worker"]}], ["worker"], start=False)
    broker_factory.subscriber(b, "worker")
    with pytest.raises(SubscriberError, match="already listening"):
        kit.run(recording([]), settings_for(b, "worker"))


SLOW_SUBSCRIBER = """
import sys, time
from ppmq.client.subscriber import main

def handle(batch):
    print("handling", len(batch.messages), flush=True)
    time.sleep(1.0)

raise SystemExit(main("worker", handle))
"""


def test_sigterm_finishes_and_acks_the_batch_in_hand_then_exits_0(broker_factory, short_tmp):
    # Given a subscriber script in the middle of a slow batch
    b = broker_factory([{"Name": "jobs", "Subscribers": ["worker"], "AckRetry": 0}], ["worker"])
    publish(b, "jobs", ["a", "b", "c"])
    out = short_tmp / "worker.log"
    with open(out, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", SLOW_SUBSCRIBER, "-c", str(b.config_path)], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "handling 3" in out.read_text(), what="the batch to be in hand")
        # When systemd stops it
        proc.send_signal(signal.SIGTERM)
        # Then it acks that batch and exits 0
        assert proc.wait(timeout=15) == 0, out.read_text()
    finally:
        proc.kill()
    assert all_acked(b, "jobs", "worker", 3), out.read_text()
    assert "stopped, exiting" in out.read_text()


def test_after_the_broker_restarts_what_it_never_saw_acked_comes_again(broker_factory):
    # Given a batch in the handler's hands when the broker is killed (AckRetry off)
    b = broker_factory([{"Name": "jobs", "Subscribers": ["worker"], "AckRetry": 0}], ["worker"])
    publish(b, "jobs", ["a", "b"])
    release = threading.Event()
    seen: list = []

    def handle(batch: kit.Batch) -> None:
        seen.extend(m.payload for m in batch.messages)
        release.wait(15)

    KitThread(handle, settings_for(b, "worker"), "blocking")
    wait_for(lambda: seen, what="the first batch")
    b.kill()
    release.set()  # its ack goes to a dead connection
    # When the broker comes back on the same data
    b.start()
    # Then the kit asks for everything unacked again, and all is acked
    wait_for(lambda: all_acked(b, "jobs", "worker", 2), what="both acked after the restart")
    assert seen == ["a", "b", "a", "b"]
