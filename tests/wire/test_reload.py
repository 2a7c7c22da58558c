"""SIGHUP reload (PROTOCOL §6 DropTopics): the new config takes over without
dropping a message or a connection, or is refused whole and the old one runs on."""

from __future__ import annotations

import copy
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from ppmq.errors import ClientError

from ..conftest import WAIT_S, BrokerProcess, NotifyListener, wait_for


def _reloaded(b: BrokerProcess, notify: NotifyListener, config: dict | str) -> dict[str, str]:
    """Reload and wait until it is over; return the READY message that ends it."""
    notify.wait("READY", "1")  # the start's, which may come just after the socket accepts
    before = len(notify.messages("READY"))
    b.reload(config)
    return notify.wait("READY", "1", count=before + 1)[-1]


def _topic(name: str, subs: list[str], **extra) -> dict:
    return {"Name": name, "Subscribers": subs, **extra}


def test_adding_a_subscriber_and_a_topic_while_messages_flow_loses_nothing(broker_factory, notify_socket):
    b = broker_factory([_topic("orders", ["audit"])], ["audit"], start=False).start(env=notify_socket.env())
    audit = broker_factory.subscriber(b, "audit")
    sent: list[int] = []
    stop = threading.Event()

    def publish() -> None:  # one connection, kept across the reload
        with b.client() as c:
            i = 0
            while not stop.is_set():
                assert c.publish("orders", [{"Payload": i}]).accepted == 1
                sent.append(i)
                i += 1

    publisher = threading.Thread(target=publish)
    publisher.start()
    wait_for(lambda: len(sent) > 50, what="messages flowing")

    config = copy.deepcopy(b.config)
    config["Subscribers"].append({"Name": "billing", "Socket": str(b.tmp / "sub" / "billing.sock"), "BatchSize": 7})
    config["Topics"][0]["Subscribers"].append("billing")
    config["Topics"].append(_topic("invoices", ["billing"]))
    ready = _reloaded(b, notify_socket, config)
    billing = broker_factory.subscriber(b, "billing")
    assert "last error" not in ready["STATUS"]
    with b.client() as c:
        assert c.publish("invoices", [{"Payload": "inv-1"}]).accepted == 1
    wait_for(lambda: len(sent) > 50 + 200, what="more messages after the reload")
    stop.set()
    publisher.join()

    wait_for(lambda: sorted(audit.payloads("orders")) == sent, what=f"audit to get all {len(sent)} messages")
    wait_for(lambda: billing.payloads("orders")[-1:] == sent[-1:], what="billing to get the last message")
    assert billing.payloads("invoices") == ["inv-1"]
    got = billing.payloads("orders")
    assert got and got == sent[-len(got) :], "billing takes the topic from the reload on, in order"
    assert all(len(batch["Messages"]) <= 7 for batch in billing.batches)
    assert audit.connections == 1, "the reload must not drop the existing subscriber's connection"
    assert "subscribers added: billing" in b.log and "topics added: invoices" in b.log


def test_new_batch_size_and_window_apply_without_reconnecting(broker_factory, notify_socket):
    b = broker_factory([_topic("t", ["s"])], [{"Name": "s", "BatchSize": 50}], start=False).start(env=notify_socket.env())
    sub = broker_factory.subscriber(b, "s")
    with b.client() as c:
        c.publish("t", [{"Payload": i} for i in range(10)])
    sub.wait_messages(10)
    assert len(sub.batches[0]["Messages"]) == 10

    config = copy.deepcopy(b.config)
    config["Subscribers"][0]["BatchSize"] = 3
    _reloaded(b, notify_socket, config)
    with b.client() as c:
        c.publish("t", [{"Payload": i} for i in range(10, 20)])
    sub.wait_messages(20)
    later = [len(batch["Messages"]) for batch in sub.batches[1:]]
    assert later and max(later) <= 3
    assert sub.connections == 1


def test_removing_a_topic_that_holds_messages_is_refused_unless_dropped(broker_factory, notify_socket):
    b = broker_factory([_topic("keep", ["s"]), _topic("old", ["s"])], ["s"], start=False).start(env=notify_socket.env())
    with b.client() as c:
        c.publish("old", [{"Payload": i} for i in range(5)])
        c.publish("keep", [{"Payload": "k"}])
    config = copy.deepcopy(b.config)
    config["Topics"] = [t for t in config["Topics"] if t["Name"] != "old"]

    ready = _reloaded(b, notify_socket, config)
    assert "topic 'old' was removed but holds 5 messages; list it in DropTopics" in ready["STATUS"]
    assert b.status()["Topics"]["old"]["Stored"] == 5

    config["DropTopics"] = ["old"]
    ready = _reloaded(b, notify_socket, config)
    assert "last error" not in ready["STATUS"]
    status = b.status()
    assert "old" not in status["Topics"] and status["Topics"]["keep"]["Stored"] == 1
    with b.client() as c:
        try:
            c.publish("old", [{"Payload": "x"}])
            raise AssertionError("publish to a dropped topic succeeded")
        except ClientError as exc:
            assert exc.status == 404

    # Across a restart too: the store no longer has the topic's messages.
    b.stop()
    b.start()
    sub = broker_factory.subscriber(b, "s")
    assert sub.wait_messages(1) and sub.payloads() == ["k"]


def test_removing_a_subscriber_from_a_topic_drops_only_its_copies(broker_factory, notify_socket):
    b = broker_factory([_topic("t", ["a", "b"])], ["a", "b"], start=False).start(env=notify_socket.env())
    with b.client() as c:
        c.publish("t", [{"Payload": i} for i in range(4)])
    config = copy.deepcopy(b.config)
    config["Topics"][0]["Subscribers"] = ["a"]
    config["Subscribers"] = [s for s in config["Subscribers"] if s["Name"] == "a"]
    ready = _reloaded(b, notify_socket, config)
    assert "last error" not in ready["STATUS"]
    status = b.status()["Topics"]["t"]
    assert list(status["Subscribers"]) == ["a"] and status["Stored"] == 4
    a = broker_factory.subscriber(b, "a")
    a.wait_messages(4)
    wait_for(lambda: b.status()["Topics"]["t"]["Stored"] == 0, what="messages deleted once a acked them")
    assert "subscriber b removed from topic t: 4 pending messages dropped" in b.log


def test_dedupe_cannot_change_on_a_topic_that_holds_messages(broker_factory, notify_socket):
    b = broker_factory([_topic("t", ["s"])], ["s"], start=False).start(env=notify_socket.env())
    with b.client() as c:
        c.publish("t", [{"Payload": 1}])
    config = copy.deepcopy(b.config)
    config["Topics"][0]["Dedupe"] = True
    ready = _reloaded(b, notify_socket, config)
    assert "Topics[t].Dedupe: cannot change while the topic holds 1 messages" in ready["STATUS"]


def test_restart_only_keys_are_kept_with_a_warning(broker_factory, notify_socket):
    b = broker_factory([_topic("t", ["s"])], ["s"], start=False).start(env=notify_socket.env())
    config = copy.deepcopy(b.config)
    config["Sync"] = False
    config["Topics"].append(_topic("u", ["s"]))
    ready = _reloaded(b, notify_socket, config)
    assert "last error" not in ready["STATUS"]
    assert "reload: Sync changed; it takes effect at the next restart" in b.log
    assert "u" in b.status()["Topics"]


def test_a_restart_with_a_topic_removed_that_holds_messages_is_refused(broker_factory, short_tmp):
    b = broker_factory([_topic("t", ["s"]), _topic("gone", ["s"])], ["s"])
    with b.client() as c:
        c.publish("gone", [{"Payload": 1}])
    b.stop()
    config = copy.deepcopy(b.config)
    config["Topics"] = config["Topics"][:1]
    restarted = BrokerProcess(short_tmp, config)
    restarted.start(wait=False)
    try:
        assert restarted.proc.wait(15) == 1
    finally:
        if restarted.alive():
            restarted.kill()
    assert "topic 'gone' was removed but holds 1 messages; list it in DropTopics" in restarted.log


def test_a_window_lowered_below_what_is_in_flight_leaves_the_writer_idle(broker_factory, notify_socket):
    # Given 10 messages in flight to a subscriber that does not ack (Window 10), 10 more ready
    b = broker_factory([_topic("t", ["s"])], [{"Name": "s", "BatchSize": 10}], start=False).start(env=notify_socket.env())
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Payload": i} for i in range(20)])
    sub.wait_messages(10)
    # When a reload lowers its BatchSize (and so its Window) to 2
    config = copy.deepcopy(b.config)
    config["Subscribers"][0]["BatchSize"] = 2
    _reloaded(b, notify_socket, config)
    # Then the broker commits about once a second (its timers), not thousands of times
    before = b.status()["Commits"]
    time.sleep(2.0)
    assert b.status()["Commits"] - before <= 6
    assert len(sub.messages) == 10


def test_a_topic_dropped_and_created_again_goes_on_with_new_keys(broker_factory, notify_socket):
    # Given topic t that gave out keys 1..3 to s, then was dropped with its messages
    b = broker_factory([_topic("t", ["s"])], ["s"], start=False).start(env=notify_socket.env())
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        c.publish("t", [{"Payload": i} for i in range(3)])
    sub.wait_messages(3)
    _reloaded(b, notify_socket, dict(b.config, Topics=[], DropTopics=["t"]))
    # When it is created again, and a message published to it after a restart
    _reloaded(b, notify_socket, dict(b.config, Topics=[_topic("t", ["s"])], DropTopics=[]))
    b.stop()
    b.start()
    with b.client() as c:
        c.publish("t", [{"Payload": "new"}])
    # Then that message has a key t never gave before, and an ack of an old key acks nothing
    sub.wait_messages(4)
    keys = [m["Key"] for m in sub.messages]
    assert keys[:3] == ["1", "2", "3"] and int(keys[3]) > 3
    with b.client() as c:
        c.ack("t", "s", ["1"])
    assert b.sub_status("t", "s")["InFlight"] == 1 and b.sub_status("t", "s")["IgnoredAcks"] == 1


def ppmq_reload(config_path: Path, pid: int) -> subprocess.CompletedProcess:
    """`ppmq reload -c FILE PID`, as ppmq.service's ExecReload runs it."""
    return subprocess.run(
        [sys.executable, "-m", "ppmq.cli", "reload", "-c", str(config_path), str(pid)], capture_output=True, text=True, timeout=WAIT_S
    )


def test_ppmq_reload_checks_the_file_then_has_the_broker_reload_it(broker_factory, notify_socket):
    # Given a running broker and its config file with a topic added
    b = broker_factory([_topic("t", ["s"])], ["s"], start=False).start(env=notify_socket.env())
    notify_socket.wait("READY", "1")
    before = len(notify_socket.messages("READY"))
    config = copy.deepcopy(b.config)
    config["Topics"].append(_topic("added", ["s"]))
    b.config_path.write_text(yaml.safe_dump(config))
    # When `ppmq reload` is given the file and the broker's pid
    done = ppmq_reload(b.config_path, b.proc.pid)
    # Then it says the file is fine, and the broker reloads it
    assert (done.returncode, done.stderr) == (0, "") and "ok" in done.stdout
    notify_socket.wait("READY", "1", count=before + 1)
    assert "added" in b.status()["Topics"]


def test_ppmq_reload_of_a_broken_file_exits_1_naming_the_problem_and_sends_no_signal(broker_factory, short_tmp):
    # Given a config file with an unknown key, and a process that SIGHUP would end
    b = broker_factory([_topic("t", ["s"], Bogus=1)], ["s"], start=False)
    target = subprocess.Popen(["sleep", "60"])
    try:
        # When `ppmq reload` is given the file and that process's pid
        done = ppmq_reload(b.config_path, target.pid)
        # Then it exits 1 naming the file, the line and the key
        assert done.returncode == 1, done
        assert f"{b.config_path}:" in done.stderr and "Topics[0].Bogus: unknown key" in done.stderr
    finally:
        target.terminate()
    # And the process got no SIGHUP: a pending one would have ended it before the SIGTERM
    assert target.wait(timeout=WAIT_S) == -signal.SIGTERM
