"""The `ppmq` commands of delivery control (PROTOCOL §8 Command line) as a user runs
them: a subprocess against a real broker, or on a pseudo-terminal where `purge` asks.

Exit status: 0 ok, 1 the request failed (the error on stderr), 2 usage error.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import time

import pytest

from ..conftest import WAIT_S, wait_for
from .test_cli import ENV, PPMQ, ppmq

TOPICS = [
    {"Name": "u", "Priorities": 2, "DeadLetter": "dlq", "Subscribers": ["s"]},
    {"Name": "v", "AckRetry": "1m", "Subscribers": ["s", "r"]},  # a deadline for what is in flight
    {"Name": "dlq", "Subscribers": ["ops"]},  # nobody listens on ops: dead letters stay
]
QUESTION = "[y/N] "


@pytest.fixture
def broker(broker_factory):
    return broker_factory(TOPICS, ["s", "r", "ops"])


def run(b, *args: object, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`ppmq COMMAND -c CONFIG ARGS...`, asserting exit 0."""
    r = ppmq(args[0], "-c", b.config_path, *args[1:], stdin=stdin)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r


def publish(b, topic: str, *payloads: object, priority: int = 0) -> None:
    with b.client() as c:
        c.publish(topic, [{"Payload": p, "Priority": priority} for p in payloads])


def held(b, broker_factory, topic: str, *payloads: object):
    """A subscriber s that never acks, holding `payloads` of `topic` in flight."""
    sub = broker_factory.subscriber(b, "s", ack=None)
    publish(b, topic, *payloads)
    sub.wait_messages(len(payloads))
    return sub


def stored(b) -> dict[str, int]:
    return {name: t["Stored"] for name, t in b.status()["Topics"].items()}


def on_a_terminal(args: list[object], answer: bytes) -> tuple[int, str]:
    """Run ppmq with a pseudo-terminal as stdin, stdout and stderr, as a person at a
    terminal does; type `answer` once it asks. Returns the exit status and all it wrote."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([*PPMQ, *map(str, args)], stdin=slave, stdout=slave, stderr=slave, env=ENV)
    os.close(slave)
    try:
        seen = _read_pty(master, until=QUESTION)
        os.write(master, answer)
        seen += _read_pty(master)
        return proc.wait(WAIT_S), seen
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()


def _read_pty(fd: int, until: str | None = None) -> str:
    """What the process writes, up to `until`, or else until it closes the terminal."""
    seen, deadline = b"", time.monotonic() + WAIT_S
    while until is None or until.encode() not in seen:
        assert time.monotonic() < deadline, f"timed out waiting for {until!r}; got {seen!r}"
        if not select.select([fd], [], [], 0.1)[0]:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: every process that had the terminal open has gone
            break
        if not chunk:
            break
        seen += chunk
    return seen.decode(errors="replace")


# --- usage ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["peek", "-c", "x.yaml", "u", "--state", "delayed"],
        ["peek", "-c", "x.yaml", "u", "-n", "0"],
        ["peek", "-c", "x.yaml", "u", "-n", "many"],
        ["peek", "-c", "x.yaml"],
        ["nack", "-c", "x.yaml", "u", "s"],
        ["nack", "-c", "x.yaml", "u", "s", "k", "--delay", "-1"],
        ["nack", "-c", "x.yaml", "u", "s", "k", "--delay", "soon"],
        ["reject", "-c", "x.yaml", "u", "s"],
        ["purge", "-c", "x.yaml"],
        ["purge", "-c", "x.yaml", "u", "--key"],
        ["redrive", "-c", "x.yaml"],
        ["pause", "-c", "x.yaml"],
        ["resume", "-c", "x.yaml", "s", "--topic"],
        ["ping", "-c", "x.yaml", "extra"],
        ["publish", "-c", "x.yaml", "u", "x", "--delay", "nan"],
        ["publish", "-c", "x.yaml", "u", "x", "--delay", "90 s"],
        ["status", "-c", "x.yaml", "--topic"],
    ],
    ids=[
        "bad state",
        "limit 0",
        "limit not a number",
        "peek without topic",
        "nack without keys",
        "negative delay",
        "delay not a number",
        "reject without keys",
        "purge without topic",
        "key without value",
        "redrive without topic",
        "pause without subscriber",
        "topic without value",
        "ping with an argument",
        "publish delay nan",
        "publish delay with a space",
        "status topic without value",
    ],
)
def test_a_usage_error_of_a_control_command_exits_2_with_the_usage_on_stderr(args):
    r = ppmq(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "usage:" in r.stderr


def test_purge_without_yes_and_without_a_terminal_refuses_with_exit_2_and_purges_nothing(broker):
    # Given three ready messages
    publish(broker, "u", "a", "b", "c")
    # When purge runs from a script, stdin not a terminal, without --yes
    r = ppmq("purge", "-c", broker.config_path, "u", stdin="y\n")
    # Then it refuses, says to pass --yes, and nothing is gone
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "--yes" in r.stderr
    assert stored(broker)["u"] == 3


@pytest.mark.parametrize("answer", [b"n\n", b"\n", b"no\n", b"yess\n", b"\x04"], ids=["n", "just enter", "no", "yess", "end of input"])
def test_purge_on_a_terminal_asks_first_and_anything_but_y_or_yes_exits_1_with_nothing_purged(broker, answer):
    # Given three ready messages
    publish(broker, "u", "a", "b", "c")
    # When purge asks on a terminal and the answer is not a yes
    status, seen = on_a_terminal(["purge", "-c", broker.config_path, "u", "--subscriber", "s"], answer)
    # Then the question said what would go and how many, the command exits 1, and nothing is gone
    assert "purge every message of topic 'u' for subscriber 's', ready and in flight (3 now)? [y/N]" in seen, seen
    assert status == 1, seen
    assert "nothing purged" in seen
    assert stored(broker)["u"] == 3


# --- nack, reject, redrive -----------------------------------------------------------------------


def test_nack_gives_messages_in_flight_back_and_they_are_delivered_again(broker, broker_factory):
    # Given two messages in flight to s
    sub = held(broker, broker_factory, "u", "a", "b")
    a = next(m["Key"] for m in sub.messages if m["Payload"] == "a")
    # When s nacks one of them, and a key that is not in flight
    r = run(broker, "nack", "u", "s", a, "999999")
    # Then the one in flight is counted and delivered again, and the other is said to be ignored
    assert r.stdout.strip() == "nacked 1"
    assert "ppmq nack: not in flight to subscriber 's' on topic 'u', so ignored: 1 of the 2 keys" in r.stderr
    assert sub.wait_messages(3)[2]["Payload"] == "a"


@pytest.mark.parametrize("delay", ["1.5", "1500ms"])
def test_nack_with_a_delay_holds_the_message_back_that_long(broker, broker_factory, delay):
    # Given a message in flight to s
    sub = held(broker, broker_factory, "u", "a")
    # When s nacks it with a delay of 1.5 s
    started = time.monotonic()
    run(broker, "nack", "u", "s", sub.messages[0]["Key"], "--delay", delay)
    # Then it is delivered again, but not before the delay has passed
    sub.wait_messages(2)
    assert time.monotonic() - started >= 1.5


@pytest.mark.parametrize("command", ["ack", "nack", "reject"])
def test_settling_keys_not_in_flight_names_them_and_changes_nothing(broker, broker_factory, command):
    # Given a message in flight to s, and one acked already
    sub = held(broker, broker_factory, "u", "a", "b")
    run(broker, "ack", "u", "s", sub.messages[1]["Key"])
    # When s settles the acked one and an unknown key
    r = run(broker, command, "u", "s", sub.messages[1]["Key"], "424242")
    # Then none is counted, both are named, and the one in flight stays so
    assert r.stdout == f"{command}ed 0\n"
    assert r.stderr.startswith(
        f"ppmq {command}: not in flight to subscriber 's' on topic 'u', so ignored: {sub.messages[1]['Key']}, 424242 "
    )
    assert broker.settled_status()["Topics"]["u"]["Subscribers"]["s"]["InFlight"] == 1


def test_reject_dead_letters_the_message_and_redrive_brings_it_back(broker, broker_factory):
    # Given a message in flight to s on u, whose DeadLetter is dlq
    sub = held(broker, broker_factory, "u", "poison")
    # When s rejects it
    r = run(broker, "reject", "u", "s", sub.messages[0]["Key"])
    # Then it waits in dlq
    assert r.stdout.strip() == "rejected 1"
    wait_for(lambda: stored(broker) == {"u": 0, "v": 0, "dlq": 1}, what="the dead letter")
    # When an operator redrives dlq
    r = run(broker, "redrive", "dlq")
    # Then it goes back to s on u, and dlq is empty
    assert r.stdout.strip() == "redriven 1, skipped 0"
    assert sub.wait_messages(2)[1]["Payload"] == "poison"
    assert stored(broker) == {"u": 1, "v": 0, "dlq": 0}


def test_redrive_with_keys_moves_only_those(broker, broker_factory):
    # Given two messages dead-lettered in dlq
    sub = held(broker, broker_factory, "u", "a", "b")
    run(broker, "reject", "u", "s", *(m["Key"] for m in sub.messages))
    dead = json.loads(run(broker, "peek", "dlq", "--json").stdout)["Messages"]
    # When an operator redrives one of them by its key in dlq
    r = run(broker, "redrive", "dlq", "--key", next(m["Key"] for m in dead if m["Payload"] == "b"))
    # Then only that one goes back to s
    assert r.stdout.strip() == "redriven 1, skipped 0"
    assert sub.wait_messages(3)[2]["Payload"] == "b"
    assert stored(broker)["dlq"] == 1


# --- peek ----------------------------------------------------------------------------------------


def test_peek_prints_the_body_as_json_or_a_table_in_delivery_order(broker):
    # Given three ready messages of two priorities, and a payload too long for the table
    publish(broker, "u", "low", "x" * 100, priority=1)
    publish(broker, "u", {"urgent": True})
    # When an operator peeks as JSON
    body = json.loads(run(broker, "peek", "u", "--json").stdout)
    # Then the body lists them in delivery order, ready, never delivered
    assert [m["Payload"] for m in body["Messages"]] == [{"urgent": True}, "low", "x" * 100]
    assert {(m["Subscriber"], m["State"], m["Attempt"], m["Deadline"]) for m in body["Messages"]} == {("s", "ready", 0, None)}
    assert body["Next"] is None
    # When it peeks as a table
    lines = run(broker, "peek", "u").stdout.splitlines()
    # Then there is a header, and one line a message with its key, priority and payload cut short
    assert lines[0].split() == ["SUBSCRIBER", "STATE", "KEY", "PRIORITY", "ATTEMPT", "PUBLISHED", "DEADLINE", "PAYLOAD"]
    assert len(lines) == 4
    for line, m in zip(lines[1:], body["Messages"]):
        assert line.split()[:7] == ["s", "ready", m["Key"], str(m["Priority"]), "0", m["Published"], "-"], line
    assert lines[3].endswith('"' + "x" * 38 + "…")


def test_peek_filters_by_subscriber_and_state_and_limits_the_count(broker, broker_factory):
    # Given two messages on v, in flight to s and ready for r
    held(broker, broker_factory, "v", "a", "b")
    # When an operator peeks at what is in flight to s, at most one
    body = json.loads(run(broker, "peek", "v", "--subscriber", "s", "--state", "inflight", "-n", "1", "--json").stdout)
    # Then it sees the first, in flight with a deadline, and a cursor to the next
    (m,) = body["Messages"]
    assert (m["Payload"], m["Subscriber"], m["State"], m["Attempt"]) == ("a", "s", "inflight", 1)
    assert m["Deadline"] is not None
    assert body["Next"] is not None
    # When it peeks at v without a filter
    body = json.loads(run(broker, "peek", "v", "--json").stdout)
    # Then the copies of r (ready, by subscriber name) come before those of s (in flight)
    assert [(m["Subscriber"], m["State"]) for m in body["Messages"]] == [("r", "ready")] * 2 + [("s", "inflight")] * 2


# --- purge ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("answer", [b"y\n", b"YES\n"], ids=["y", "YES"])
def test_purge_on_a_terminal_purges_when_the_answer_is_yes(broker, answer):
    # Given three ready messages
    publish(broker, "u", "a", "b", "c")
    # When purge asks on a terminal and the answer is yes
    status, seen = on_a_terminal(["purge", "-c", broker.config_path, "u"], answer)
    # Then everything is gone and it says how many
    assert status == 0, seen
    assert "purged 3" in seen
    assert stored(broker)["u"] == 0


@pytest.mark.parametrize(
    ("args", "count"),
    [([], 6), (["--subscriber", "r"], 3), (["-k", "KEY0", "-k", "KEY1"], 4), (["-k", "KEY0", "--subscriber", "s"], 1)],
    ids=["every copy", "one subscriber's", "two keys", "a key of one subscriber"],
)
def test_purge_on_a_terminal_says_how_many_copies_it_would_remove(broker, broker_factory, args, count):
    # Given three messages on v, one in flight to s, and each ready for r
    sub = broker_factory.subscriber(broker, "s", ack=None)
    publish(broker, "v", "a")
    sub.wait_messages(1)
    publish(broker, "v", "b", "c")
    keys = [m["Key"] for m in json.loads(run(broker, "peek", "v", "--subscriber", "r", "--json").stdout)["Messages"]]
    args = [keys[int(a[3:])] if a.startswith("KEY") else a for a in args]
    # When purge asks, and is told no
    status, seen = on_a_terminal(["purge", "-c", broker.config_path, "v", *args], b"n\n")
    # Then its question counted the copies it would remove, as PURGE counts them
    assert re.search(rf"ready and in flight \({count} now\)\? \[y/N\]", seen), seen
    assert status == 1


def test_purge_by_an_admin_who_may_not_ask_status_asks_without_a_count(broker_factory):
    # Given a broker where this user may purge but not ask STATUS, and three messages
    b = broker_factory(TOPICS, ["s", "r", "ops"], AllowRoot=False, AdminUsers=[os.getuid()], StatusUsers=[])
    publish(b, "u", "a", "b", "c")
    # When purge asks on a terminal, and is told yes
    status, seen = on_a_terminal(["purge", "-c", b.config_path, "u"], b"y\n")
    # Then it asked what it would remove, without a count, and purged
    assert "purge every message of topic 'u', ready and in flight? [y/N]" in seen, seen
    assert status == 0 and "purged 3" in seen, seen


def test_purge_with_yes_removes_only_the_subscriber_and_keys_given(broker, broker_factory):
    # Given three messages on v, each held by s and by r
    publish(broker, "v", "a", "b", "c")
    keys = [m["Key"] for m in json.loads(run(broker, "peek", "v", "--subscriber", "r", "--json").stdout)["Messages"]]
    # When r's copies of two keys are purged
    r = run(broker, "purge", "v", "--subscriber", "r", "--key", keys[0], "-k", keys[1], "--yes")
    # Then two copies are gone, and every message is still stored for s
    assert r.stdout.strip() == "purged 2"
    assert stored(broker)["v"] == 3
    remaining = json.loads(run(broker, "peek", "v", "--json").stdout)["Messages"]
    assert sorted((m["Subscriber"], m["Payload"]) for m in remaining) == [("r", "c"), ("s", "a"), ("s", "b"), ("s", "c")]


# --- pause, resume, ping, status, publish --delay -------------------------------------------------


def test_pause_stops_deliveries_to_the_subscriber_until_resume(broker, broker_factory):
    # Given s paused on u
    assert run(broker, "pause", "s", "--topic", "u").stdout == "paused subscriber 's' on topic 'u'\n"
    sub = broker_factory.subscriber(broker, "s")
    # When a message is published on u, and one on v
    publish(broker, "u", "held back")
    publish(broker, "v", "goes out")
    # Then only v's reaches s (connected, it had a step's chance to get u's too), and status says s is paused on u
    sub.wait_messages(1)
    assert broker.settled_status()["Topics"]["u"]["Subscribers"]["s"]["Delivered"] == 0
    assert sub.payloads() == ["goes out"]
    assert json.loads(run(broker, "status", "--json").stdout)["Topics"]["u"]["Subscribers"]["s"]["Paused"] is True
    on_u, others = run(broker, "status").stdout.split("\nv: ")
    assert re.search(r"^  s \(paused\) ", on_u, re.M), on_u
    assert "(paused)" not in others
    # When s is resumed
    assert run(broker, "resume", "s", "--topic", "u").stdout == "resumed subscriber 's' on topic 'u'\n"
    # Then the message held back goes out
    assert sub.wait_messages(2)[1]["Payload"] == "held back"


def test_pause_and_resume_without_a_topic_say_they_act_on_every_topic_of_the_subscriber(broker):
    assert run(broker, "pause", "s").stdout == "paused subscriber 's' on every topic it is on\n"
    body = json.loads(run(broker, "status", "--json").stdout)["Topics"]
    assert [body[t]["Subscribers"]["s"]["Paused"] for t in ("u", "v")] == [True, True]
    assert run(broker, "resume", "s").stdout == "resumed subscriber 's' on every topic it is on\n"
    body = json.loads(run(broker, "status", "--json").stdout)["Topics"]
    assert [body[t]["Subscribers"]["s"]["Paused"] for t in ("u", "v")] == [False, False]


def test_ping_prints_the_brokers_version_and_uptime(broker):
    r = run(broker, "ping")
    assert re.fullmatch(r"ppmq \S+, up \d+\.\ds\n", r.stdout), r.stdout


def test_status_with_a_topic_shows_only_that_topic(broker):
    publish(broker, "u", "a")
    body = json.loads(run(broker, "status", "--topic", "u", "--json").stdout)
    assert list(body["Topics"]) == ["u"]
    assert body["Topics"]["u"]["Stored"] == 1
    assert run(broker, "status", "-t", "v").stdout.startswith("v: stored 0")


@pytest.mark.parametrize("delay", ["1.5", "1s500ms"])
def test_publish_with_a_delay_delivers_the_message_no_earlier(broker, broker_factory, delay):
    # Given a subscriber that acks
    sub = broker_factory.subscriber(broker, "s")
    # When one message is published with a delay of 1.5 s, then one without
    started = time.monotonic()
    run(broker, "publish", "u", "later", "--delay", delay)
    run(broker, "publish", "u", "now")
    # Then the one without comes first, the delayed one only after its delay
    assert sub.wait_messages(1)[0]["Payload"] == "now"
    assert sub.wait_messages(2)[1]["Payload"] == "later"
    assert time.monotonic() - started >= 1.5


# --- errors from the broker ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["nack", "u", "ghost", "1"], "404: Subscriber: unknown subscriber 'ghost'"),
        (["reject", "nope", "s", "1"], "404: Topic: unknown topic 'nope'"),
        (["peek", "nope"], "404: "),
        (["peek", "u", "-n", "1001"], "400: "),
        (["purge", "nope", "--yes"], "404: "),
        (["redrive", "u"], "400: "),
        (["pause", "ghost"], "404: "),
        (["resume", "s", "--topic", "nope"], "404: "),
        (["status", "--topic", "nope"], "404: "),
    ],
    ids=[
        "nack by an unknown subscriber",
        "reject on an unknown topic",
        "peek at an unknown topic",
        "peek over 1000",
        "purge an unknown topic",
        "redrive a topic that is nobody's DeadLetter",
        "pause an unknown subscriber",
        "resume on an unknown topic",
        "status of an unknown topic",
    ],
)
def test_a_request_the_broker_refuses_exits_1_with_its_error_on_stderr(broker, args, error):
    publish(broker, "u", "kept")
    r = ppmq(args[0], "-c", broker.config_path, *args[1:])
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert f"ppmq {args[0]}: {error}" in r.stderr
    assert r.stdout == ""
    assert stored(broker) == {"u": 1, "v": 0, "dlq": 0}


# --- --json, --help ---------------------------------------------------------------------------------


def json_of(b, *args: object) -> dict:
    """`ppmq ARGS... --json`: exit 0 and one JSON object on stdout."""
    r = run(b, *args, "--json")
    assert r.stdout.count("\n") == 1, r.stdout
    return json.loads(r.stdout)


def test_every_command_that_prints_a_result_prints_it_as_json_with_json(broker, broker_factory):
    # Given two messages in flight to s on u
    sub = held(broker, broker_factory, "u", "a", "b")
    a, b = (m["Key"] for m in sub.messages)
    assert json_of(broker, "nack", "u", "s", a, "999999") == {"Nacked": 1, "NotInFlight": 1}
    a = sub.wait_messages(3)[2]["Key"]
    assert json_of(broker, "ack", "u", "s", a) == {"Acked": 1, "NotInFlight": 0}
    assert json_of(broker, "reject", "u", "s", b) == {"Rejected": 1, "NotInFlight": 0}
    assert json_of(broker, "redrive", "dlq") == {"Redriven": 1, "Skipped": 0}
    for command in ("pause", "resume", "reconnect"):
        assert json_of(broker, command, "s", "--topic", "u") == {"Command": command.upper(), "Subscriber": "s", "Topic": "u"}
    assert json_of(broker, "pause", "r")["Topic"] is None
    publish(broker, "v", "x")
    assert json_of(broker, "purge", "v", "--subscriber", "r", "--yes") == {"Purged": 1}
    assert set(json_of(broker, "ping")) == {"Version", "UptimeSeconds"}
    assert json_of(broker, "check") == {"Path": str(broker.config_path), "Problems": [], "Topics": 3, "Subscribers": 3}
    fsck = json_of(broker, "fsck")
    assert (fsck["DataPath"], fsck["Problems"], fsck["Messages"], fsck["Queued"] + fsck["InFlight"]) == (
        broker.config["DataPath"],
        [],
        2,
        2,
    )
    # And migrate, once the broker has stopped and left its store
    broker.stop()
    assert json_of(broker, "migrate")["Converted"] is False


@pytest.mark.parametrize("command", ["check", "reload", "fsck", "migrate"])
def test_a_command_that_never_asks_the_broker_refuses_s(command):
    r = ppmq(command, "-c", "x.yaml", *(["1"] if command == "reload" else []), "-s", "x.sock")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "unrecognized arguments: -s x.sock" in r.stderr


@pytest.mark.parametrize(
    "command",
    ["serve", "check", "reload", "fsck", "migrate", "publish", "ack", "reconnect", "take", "nack", "reject", "peek", "purge"]
    + ["redrive", "pause", "resume", "ping", "bridge", "bridge to", "bridge from", "status", "metrics", "listen", "report"],
)
def test_help_of_every_command_ends_with_an_example(command):
    r = ppmq(*command.split(), "--help")
    assert r.returncode == 0, r.stderr
    assert re.search(rf"\nexample:\n  .*ppmq {command}\b", r.stdout), r.stdout
