"""sd-daemon conventions read from the environment: watchdog interval, journald lines."""

from __future__ import annotations

import logging
import os

import pytest

from ppmq.systemd import JournalFormatter, Notifier, listen_fds


def _record(level: int, msg: str) -> logging.LogRecord:
    return logging.LogRecord("ppmq.x", level, __file__, 1, msg, None, None)


@pytest.mark.parametrize(
    ("level", "prefix"),
    [(logging.DEBUG, "<7>"), (logging.INFO, "<6>"), (logging.WARNING, "<4>"), (logging.ERROR, "<3>"), (logging.CRITICAL, "<2>")],
)
def test_journal_lines_carry_the_syslog_priority_of_their_level(level: int, prefix: str):
    assert JournalFormatter().format(_record(level, "hello")) == f"{prefix}ppmq.x: hello"


def test_every_line_of_a_multi_line_record_keeps_its_priority():
    assert JournalFormatter().format(_record(logging.ERROR, "a\nb")) == "<3>ppmq.x: a\n<3>b"


@pytest.mark.parametrize(
    ("usec", "pid", "interval"),
    [("30000000", None, 15.0), ("400000", "self", 0.2), ("400000", "1", None), ("0", None, None), ("x", None, None), (None, None, None)],
)
def test_watchdog_interval_is_half_of_watchdog_usec_for_this_process(monkeypatch, usec, pid, interval):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    for key, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", str(os.getpid()) if pid == "self" else pid)):
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)
    assert Notifier().watchdog_interval_s == interval


def test_listen_fds_meant_for_another_process_are_ignored_and_unset(monkeypatch):
    monkeypatch.setenv("LISTEN_PID", "1")
    monkeypatch.setenv("LISTEN_FDS", "1")
    monkeypatch.setenv("LISTEN_FDNAMES", "server")
    assert listen_fds() == {}
    assert "LISTEN_FDS" not in os.environ and "LISTEN_PID" not in os.environ
