"""The broker as a systemd service, checked with systemd's own conventions and tools:
a NOTIFY_SOCKET the test binds, `systemd-socket-activate` holding the server
socket, and a stderr that is the journal stream."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import lmdb
import pytest

from ppmq.client.library import Client

from ..conftest import WAIT_S, BrokerProcess, NotifyListener, make_config, wait_for

TOPIC = [{"Name": "jobs", "Subscribers": ["worker"]}]


def _can_connect(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def test_ready_is_sent_only_once_the_server_socket_accepts(broker_factory, notify_socket: NotifyListener):
    b = broker_factory(TOPIC, ["worker"], start=False)
    accepted_at_ready: list[bool] = []
    notify_socket.on_message = lambda f: accepted_at_ready.append(_can_connect(b.socket)) if "READY" in f else None
    b.start(env=notify_socket.env())

    ready = notify_socket.wait("READY", "1")[0]
    assert accepted_at_ready == [True]
    assert ready["STATUS"].startswith("1 topics, 0 ready, 0 delayed, 0 in flight, 0/1 subscribers connected, 0 subscriptions paused")
    assert {pid for _, pid, _ in notify_socket.received} == {b.proc.pid}  # NotifyAccess=main holds


def test_status_follows_the_backlog_and_connected_subscribers(broker_factory, notify_socket: NotifyListener):
    b = broker_factory(TOPIC, ["worker"], start=False).start(env=notify_socket.env())
    with b.client() as c:
        c.publish("jobs", [{"Payload": i} for i in range(7)])
    notify_socket.wait("STATUS", "1 topics, 7 ready, 0 delayed, 0 in flight, 0/1 subscribers connected, 0 subscriptions paused")

    sub = broker_factory.subscriber(b, "worker")
    sub.wait_messages(7)
    notify_socket.wait("STATUS", "1 topics, 0 ready, 0 delayed, 0 in flight, 1/1 subscribers connected, 0 subscriptions paused")


def _pings(listener: NotifyListener, since: float) -> int:
    return sum(1 for at, _, f in list(listener.received) if "WATCHDOG" in f and at >= since)


def _withheld(b: BrokerProcess) -> int:
    """The watchdog rounds that withheld their ping, as the broker logged them."""
    return b.log.count("withholding the watchdog ping")


def test_watchdog_pings_at_half_the_interval_and_stop_while_the_writer_is_stuck(broker_factory, notify_socket: NotifyListener):
    b = broker_factory(TOPIC, ["worker"], start=False).start(env=notify_socket.env(WATCHDOG_USEC="400000"))
    notify_socket.wait("WATCHDOG", "1", count=4)  # every 0.2 s

    # Another process holds LMDB's write lock: the broker's next commit blocks on it,
    # as it would on a dead disk.
    env = lmdb.open(str(b.tmp / "data"), max_dbs=16)
    blocker = env.begin(write=True)
    replies: list[int] = []
    publisher = threading.Thread(target=lambda: replies.append(b.client().publish("jobs", [{"Payload": 1}]).accepted))
    publisher.start()
    # The watchdog says so at each round it withholds its ping: from the first on
    # (once every ping sent before it is read), five more rounds go by without one
    wait_for(lambda: _withheld(b) >= 1, what="a withheld watchdog ping")
    quiet_from = notify_socket.flush()
    wait_for(lambda: _withheld(b) >= 6, what="five more rounds without a watchdog ping")
    assert _pings(notify_socket, quiet_from) == 0
    assert replies == []

    blocker.abort()
    env.close()
    publisher.join(WAIT_S)
    assert replies == [1]
    resumed_from = time.monotonic()
    wait_for(lambda: _pings(notify_socket, resumed_from) >= 2, what="pings to resume")


def test_watchdog_pings_stop_while_the_event_loop_is_stopped(broker_factory, notify_socket: NotifyListener):
    b = broker_factory(TOPIC, ["worker"], start=False).start(env=notify_socket.env(WATCHDOG_USEC="400000"))
    notify_socket.wait("WATCHDOG", "1", count=2)
    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(0.1)
        stopped_from = time.monotonic()
        time.sleep(0.8)
        assert _pings(notify_socket, stopped_from) == 0
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    resumed_from = time.monotonic()
    wait_for(lambda: _pings(notify_socket, resumed_from) >= 2, what="pings to resume")


def test_no_watchdog_pings_for_another_process(broker_factory, notify_socket: NotifyListener):
    """WATCHDOG_PID names who systemd watches; a broker that is not that process stays quiet."""
    b = broker_factory(TOPIC, ["worker"], start=False)
    b.start(env=notify_socket.env(WATCHDOG_USEC="200000", WATCHDOG_PID="1"))
    notify_socket.wait("READY", "1")
    # A watchdog would ping at once, before the broker reads a request: a reply
    # shows that point passed, and once our own datagram is read, so is any ping
    b.status()
    notify_socket.flush()
    assert notify_socket.messages("WATCHDOG") == []


def test_sighup_sends_reloading_then_ready_and_sigterm_sends_stopping(broker_factory, notify_socket: NotifyListener):
    b = broker_factory(TOPIC, ["worker"], start=False).start(env=notify_socket.env())
    notify_socket.wait("READY", "1")
    b.proc.send_signal(signal.SIGHUP)
    reloading = notify_socket.wait("RELOADING", "1")[0]
    assert int(reloading["MONOTONIC_USEC"]) > 0
    notify_socket.wait("READY", "1", count=2)
    order = [k for _, _, f in notify_socket.received for k in ("RELOADING", "READY") if k in f]
    assert order == ["READY", "RELOADING", "READY"]

    assert b.stop() == 0
    notify_socket.wait("STOPPING", "1")
    assert "config reloaded" in b.log


def test_a_broken_config_on_sighup_keeps_the_old_one_and_says_so(broker_factory, notify_socket: NotifyListener):
    b = broker_factory(TOPIC, ["worker"], start=False).start(env=notify_socket.env())
    sub = broker_factory.subscriber(b, "worker")
    good = b.config_path.read_text()

    b.reload(good.replace("Topics:", "Topics:\n- Name: extra\n  Priorities: 999\n"))
    ready = notify_socket.wait("READY", "1", count=2)[-1]
    assert "last error: reload refused: " in ready["STATUS"]
    assert "Topics[0].Priorities: must be 1..256" in ready["STATUS"]
    assert "Priorities: must be 1..256" in b.log and "still running the previous config" in b.log

    with b.client() as c:  # the old config still serves, and has no topic "extra"
        assert c.publish("jobs", [{"Payload": "after"}]).accepted == 1
        assert "extra" not in c.status().topics
    assert sub.wait_messages(1)[0]["Payload"] == "after"

    b.reload(good)  # fixed: the error goes away
    ready = notify_socket.wait("READY", "1", count=3)[-1]
    assert "last error" not in ready["STATUS"]


def test_sigterm_answers_what_committed_and_exits_zero_quickly(broker_factory, notify_socket: NotifyListener):
    b = broker_factory(TOPIC, ["worker"], start=False).start(env=notify_socket.env())
    with b.client() as c:
        assert c.publish("jobs", [{"Payload": i} for i in range(100)]).accepted == 100
    started = time.monotonic()
    assert b.stop() == 0
    assert time.monotonic() - started < 5
    assert not os.path.exists(b.socket)  # we bound it, so we remove it
    b.start()
    assert b.sub_status("jobs", "worker")["Ready"] == [100]


# --- socket activation of the broker itself -------------------------------------------------


@pytest.fixture
def socket_activate() -> str:
    path = shutil.which("systemd-socket-activate")
    if path is None:
        pytest.skip("systemd-socket-activate is not installed (package systemd)")
    return path


def test_broker_started_by_systemd_socket_activate_serves_a_producer_that_connected_first(short_tmp: Path, socket_activate: str):
    b = BrokerProcess(short_tmp, make_config(short_tmp, TOPIC, ["worker"]))
    log = open(b.log_path, "ab")
    activator = subprocess.Popen(
        [socket_activate, "-l", b.socket, "--fdname=server", sys.executable, "-m", "ppmq.cli", "serve", "-c", str(b.config_path)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        # Not the socket's path: it exists from bind() on, and a connect before
        # listen() is refused. The activator says this once it listens.
        wait_for(lambda: f"Listening on {b.socket}" in b.log, what="the activator to listen")
        # The producer connects before any broker runs; systemd's socket holds it.
        with Client(b.socket, timeout_s=WAIT_S) as c:
            assert c.publish("jobs", [{"Payload": "early"}]).accepted == 1
            assert c.status().topics["jobs"].subscribers["worker"].ready == [1]
        assert f"serving on {b.socket} (from systemd)" in b.log
        activator.send_signal(signal.SIGTERM)  # the activator exec'd the broker: same pid
        assert activator.wait(WAIT_S) == 0
        assert os.path.exists(b.socket), "an inherited socket is systemd's; the broker must not unlink it"
    finally:
        if activator.poll() is None:
            activator.kill()


def test_listen_fds_for_another_pid_are_ignored(broker_factory):
    b = broker_factory(TOPIC, ["worker"], start=False)
    b.start(env={"LISTEN_FDS": "1", "LISTEN_PID": "1", "LISTEN_FDNAMES": "server"})
    wait_for(lambda: "serving on" in b.log, what="the start to be logged")
    assert "(from systemd)" not in b.log
    with b.client() as c:
        assert c.publish("jobs", [{"Payload": 1}]).accepted == 1


# --- logging under journald ------------------------------------------------------------------


def _journal_env(log_path: Path) -> dict[str, str]:
    st = os.stat(log_path)
    return {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}


def test_under_journald_lines_carry_syslog_priorities_and_no_timestamps(broker_factory):
    b = broker_factory(TOPIC, [{"Name": "worker", "Socket": "/nonexistent/worker.sock"}], start=False)
    b.log_path.touch()
    b.start(env=_journal_env(b.log_path))
    with b.client() as c:
        c.publish("jobs", [{"Payload": 1}])
    wait_for(lambda: "cannot connect" in b.log, what="the missing subscriber's warning")
    lines = [line for line in b.log.splitlines() if line]
    assert any(line.startswith("<6>ppmq.daemon: serving on ") for line in lines)
    assert any(line.startswith("<4>ppmq.delivery: subscriber worker: cannot connect") for line in lines)
    assert all(line[:3] in ("<3>", "<4>", "<6>", "<7>") for line in lines), lines


def test_a_journal_stream_that_is_not_stderr_keeps_timestamps(broker_factory, short_tmp: Path):
    b = broker_factory(TOPIC, ["worker"], start=False)
    other = short_tmp / "other"
    other.touch()
    b.start(env=_journal_env(other))
    wait_for(lambda: "serving on" in b.log, what="the start to be logged")
    line = next(line for line in b.log.splitlines() if "serving on" in line)
    assert line[:4].isdigit() and " INFO ppmq.daemon: serving on " in line
