"""Commands as the broker dispatches them (PROTOCOL §2, §4, §8): an unknown command
is the client's mistake, answered 400 with its name; a command handler that fails
on a bug is the broker's, answered 500 with its traceback logged, the request
alone undone, and the broker goes on."""

from __future__ import annotations

import logging

import msgspec
import pytest

from ppmq.protocol import messages as p
from ppmq.store.fsck import check, read_snapshot

from .test_broker import NOW, open_broker, publish


def command(name: str, **fields: object) -> p.Request:
    return p.Request(command=name, id=msgspec.Raw(b'"c"'), **fields)


def logged_tracebacks(caplog: pytest.LogCaptureFixture) -> list[type[BaseException]]:
    """The exception classes whose tracebacks the broker logged."""
    return [r.exc_info[0] for r in caplog.records if r.name == "ppmq.broker" and r.exc_info]


@pytest.mark.parametrize("name", ["FLUSH", "peak"])
def test_an_unknown_command_is_answered_400_naming_the_command(tmp_path, name):
    # Given a broker
    broker, store = open_broker(tmp_path)
    # When a client sends a command the broker does not know
    step = broker.step([command(name)], set(), NOW)
    # Then it is answered 400, and the error names the command as the client spelt it
    (reply,) = step.replies
    assert reply.status == 400
    assert reply.error.startswith(f"Command: unknown command {name!r}")
    store.close()


def test_a_key_error_inside_a_command_handler_is_answered_500_and_logged_and_not_taken_for_an_unknown_command(
    tmp_path, monkeypatch, caplog
):
    # Given a broker whose PEEK handler meets a bug that raises KeyError
    broker, store = open_broker(tmp_path)

    def broken(*args: object) -> dict:
        raise KeyError("s")

    monkeypatch.setattr(broker._admin, "peek", broken)
    # When a client sends PEEK
    with caplog.at_level(logging.ERROR, logger="ppmq.broker"):
        step = broker.step([command("PEEK", topic="t")], set(), NOW)
    # Then it is answered 500 naming the exception, and its traceback is logged once
    (reply,) = step.replies
    assert (reply.status, reply.error) == (500, "internal error: KeyError: 's'")
    assert logged_tracebacks(caplog) == [KeyError]
    assert broker.state.rejected == 1
    # And once the handler works again, the next PEEK is answered as usual
    monkeypatch.undo()
    (reply,) = broker.step([command("PEEK", topic="t")], set(), NOW).replies
    assert reply.status == 200
    store.close()


def test_a_command_handler_that_fails_after_it_wrote_leaves_nothing_behind_and_the_broker_goes_on(tmp_path, monkeypatch, caplog):
    # Given three messages stored for s, and a PURGE handler that removes them, then fails on a bug
    broker, store = open_broker(tmp_path)
    broker.step([publish(b"1", b"2", b"3")], set(), NOW)
    purge = broker._admin._purge

    def purge_then_fail(*args: object) -> int:
        purge(*args)
        raise RuntimeError("a bug after the writes")

    monkeypatch.setattr(broker._admin, "_purge", purge_then_fail)
    # When a client sends that PURGE, and another publishes in the same step
    with caplog.at_level(logging.ERROR, logger="ppmq.broker"):
        step = broker.step([command("PURGE", topic="t"), publish(b"4")], set(), NOW)
    # Then the PURGE alone is answered 500, and undone: the three messages are still there beside the fourth
    assert [r.status for r in step.replies] == [500, 200]
    assert step.replies[0].error == "internal error: RuntimeError: a bug after the writes"
    assert logged_tracebacks(caplog) == [RuntimeError]
    assert broker.state.topics["t"].stored == 4
    # And once the handler works again, the next PURGE removes all four
    monkeypatch.undo()
    (reply,) = broker.step([command("PURGE", topic="t")], set(), NOW).replies
    assert (reply.status, reply.body) == (200, {"Purged": 4})
    store.close()
    assert check(read_snapshot(str(tmp_path)), broker.config) == []
