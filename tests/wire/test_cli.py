"""The `ppmq` command (PROTOCOL §7) as a user runs it: a subprocess against a real broker.

Exit status: 0 ok, 1 the request failed (the error on stderr), 2 usage error.
`-c` defaults to $PPMQ_CONFIG.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ..conftest import WAIT_S, wait_for

TOPICS = [
    {"Name": "t", "Priorities": 3, "Expire": True, "Subscribers": ["s"]},
    {"Name": "d", "Dedupe": True, "Subscribers": ["s"]},
    {"Name": "u", "Subscribers": ["s"]},
]
TOPIC_KEYS = {"Stored", "Published", "Replaced", "Expired", "Subscribers"}
SUBSCRIBER_KEYS = {"Ready", "InFlight", "OldestReadyAge", "Delivered", "Acked", "Redelivered", "Expired"}
# Whatever the environment running the tests says, only what a test sets counts.
ENV = {k: v for k, v in os.environ.items() if k != "PPMQ_CONFIG"}
PPMQ = [sys.executable, "-m", "ppmq.cli"]


def ppmq(*args: object, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*PPMQ, *map(str, args)], input=stdin, capture_output=True, text=True, timeout=WAIT_S, env=env or ENV)


@pytest.fixture
def broker(broker_factory):
    return broker_factory(TOPICS, ["s"])


def published(b) -> dict[str, int]:
    return {name: t["Published"] for name, t in b.status()["Topics"].items()}


# --- version ------------------------------------------------------------------------------


def test_version_prints_the_version_the_broker_answers_ping_with(broker):
    r = ppmq("--version")
    assert r.returncode == 0, r.stderr
    with broker.client() as c:
        version = c.request({"Command": "PING"}).body["Version"]
    assert r.stdout == f"ppmq {version}\n"


# --- check ------------------------------------------------------------------------------


def test_check_accepts_a_good_config_and_exits_0(broker_factory):
    b = broker_factory(TOPICS, ["s"], start=False)
    r = ppmq("check", "-c", b.config_path)
    assert r.returncode == 0, r.stderr
    assert str(b.config_path) in r.stdout


CONFIG_HEAD = """\
ServerSocket: {d}/ppmq.sock
DataPath: {d}/data
Subscribers:
  - Name: s
    Socket: {d}/s.sock
Topics:
  - Name: t
    Subscribers: [s]
"""  # the lines a case appends start at line 9


@pytest.mark.parametrize(
    ("tail", "errors"),
    [
        ("    Bogus: 1\n", [(9, "Topics[0].Bogus: unknown key")]),
        ("    Priorities: many\n", [(9, "Topics[0].Priorities: ")]),
        ("    AckRetry: 5 minutes\n", [(9, "Topics[0].AckRetry: ")]),
        ("  - Name: u\n    Subscribers: [s, ghost]\n", [(10, "Topics[1].Subscribers[1]: unknown subscriber 'ghost'")]),
        ("  - Name: t\n    Subscribers: [ghost]\n", [(9, "Topics[1].Name: duplicate name 't'"), (10, "Topics[1].Subscribers[0]: ")]),
    ],
    ids=["unknown key", "wrong type", "bad duration", "unknown subscriber", "two errors at once"],
)
def test_check_rejects_a_bad_config_naming_file_line_and_key_and_exits_1(tmp_path, tail, errors):
    path = tmp_path / "ppmq.yaml"
    path.write_text(CONFIG_HEAD.format(d=tmp_path) + tail)
    r = ppmq("check", "-c", path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    for line, text in errors:
        assert f"{path}:{line}: {text}" in r.stderr, r.stderr


def test_check_reports_every_problem_of_a_file_at_once_by_line_in_the_words_of_the_config(tmp_path):
    # Given a file with a misspelt key, a value of the wrong type and an unknown subscriber
    path = tmp_path / "ppmq.yaml"
    path.write_text(CONFIG_HEAD.format(d=tmp_path) + "    Priorites: 2\n    Expire: maybe\n  - Name: u\n    Subscribers: [ghost]\n")
    # When it is checked
    r = ppmq("check", "-c", path)
    # Then every problem is named at once, at its line, in the file's order
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.splitlines() == [
        f"ppmq check: {path}:9: Topics[0].Priorites: unknown key; did you mean Priorities?",
        f"{path}:10: Topics[0].Expire: use true or false, not 'maybe'",
        f"{path}:12: Topics[1].Subscribers[0]: unknown subscriber 'ghost'",
    ]


@pytest.mark.parametrize("command", ["check", "reload"])
def test_check_and_reload_with_json_print_the_problems_exit_1_and_send_no_signal(tmp_path, command):
    # Given a file with a misspelt key, and a process that SIGHUP would end
    path = tmp_path / "ppmq.yaml"
    path.write_text(CONFIG_HEAD.format(d=tmp_path) + "    Priorites: 2\n")
    target = subprocess.Popen(["sleep", "60"])
    try:
        # When it is checked, or reloaded into that process, with --json
        r = ppmq(command, "-c", path, "--json", *([target.pid] if command == "reload" else []))
        # Then the problems are the JSON result, and the command exits 1
        assert r.returncode == 1, (r.stdout, r.stderr)
        assert json.loads(r.stdout) == {
            "Path": str(path),
            "Problems": [f"{path}:9: Topics[0].Priorites: unknown key; did you mean Priorities?"],
        }
    finally:
        target.terminate()
    # And the process got no SIGHUP: a pending one would have ended it before the SIGTERM
    assert target.wait(timeout=WAIT_S) == -signal.SIGTERM


# --- publish ------------------------------------------------------------------------------

STDIN_MESSAGES = '{"Payload": "low", "Priority": 2}\n\n{"Payload": {"n": 1}}\n{"Payload": "mid", "Priority": 1, "Key": "ignored"}\n'
STDIN_GO_STYLE = '{"payload": "x", "priority": 1, "expires": "0001-01-01T00:00:00Z"}\r\n{"PAYLOAD": "y"}\r\n'


@pytest.mark.parametrize(
    ("args", "stdin", "expected"),
    [
        (["t", "hello", "wide world"], None, [("hello", 0, None), ("wide world", 0, None)]),
        (
            ["t", "--json", '{"a": [1, 2]}', "[1, 2]", "3", '"s"', "null"],
            None,
            [({"a": [1, 2]}, 0, None), ([1, 2], 0, None), (3, 0, None), ("s", 0, None), (None, 0, None)],
        ),
        (["t", "a", "b", "--priority", "2"], None, [("a", 2, None), ("b", 2, None)]),
        (["t", "a", "--priority", "1", "b"], None, [("a", 1, None), ("b", 1, None)]),
        (["d", "v1", "--key", "k1"], None, [("v1", 0, "k1")]),
        (["d", "--json", "--key", "k2", "-p", "0", "[true]"], None, [([True], 0, "k2")]),
        (["t", "-"], STDIN_MESSAGES, [({"n": 1}, 0, None), ("mid", 1, None), ("low", 2, None)]),
        (["t", "-"], STDIN_GO_STYLE, [("y", 0, None), ("x", 1, None)]),
    ],
    ids=[
        "strings",
        "json values",
        "priority after the payloads",
        "priority between payloads",
        "key",
        "json with key",
        "stdin",
        "stdin in Go's spelling with CRLF",
    ],
)
def test_publish_waits_for_the_broker_and_the_subscriber_receives_what_was_given(broker, broker_factory, args, stdin, expected):
    sub = broker_factory.subscriber(broker, "s")
    r = ppmq("publish", "-c", broker.config_path, *args, stdin=stdin)
    assert (r.returncode, r.stdout.strip()) == (0, f"published {len(expected)}"), r.stderr
    got = sub.wait_messages(len(expected))
    assert [(m["Payload"], m["Priority"]) for m in got] == [(p, prio) for p, prio, _ in expected]
    assert [m["Key"] for m, (_, _, key) in zip(got, expected) if key is not None] == [k for _, _, k in expected if k is not None]
    assert all(m["Topic"] == args[0] for m in got)


@pytest.mark.parametrize(("ttl", "seconds"), [("60", 60), ("5m", 300), ("1h30m", 5400), ("90.5s", 90.5)])
def test_publish_with_ttl_delivers_a_message_that_expires_that_long_later(broker, broker_factory, ttl, seconds):
    sub = broker_factory.subscriber(broker, "s")
    r = ppmq("publish", "-c", broker.config_path, "t", "short-lived", "--ttl", ttl)
    assert r.returncode == 0, r.stderr
    (m,) = sub.wait_messages(1)
    expires = dt.datetime.fromisoformat(m["Expires"].replace("Z", "+00:00")).timestamp()
    assert abs(expires - (time.time() + seconds)) < 10, m


@pytest.mark.parametrize(
    ("args", "stdin", "error"),
    [
        (["publish", "nope", "x"], None, "unknown topic 'nope'"),
        (["publish", "t", "x", "--priority", "7"], None, "Messages[0].Priority: 7 is out of range 0..2 for topic 't'"),
        (["publish", "d", "no key"], None, "Messages[0].Key: "),
        (["publish", "t", "-"], '{"Payload": 1}\n{"Payload": 2, "Priority": 9}\n', "Messages[1].Priority: 9 is out of range"),
        (["publish", "t", "-"], '{"Payload": 1}\n{"Payload": 2\n', "line 2"),
        (["publish", "t", "-"], '{"Payload": 1}\n"just a string"\n', "line 2"),
        (["ack", "t", "ghost", "1"], None, "unknown subscriber 'ghost'"),
        (["reconnect", "s", "--topic", "nope"], None, "unknown topic 'nope'"),
    ],
    ids=[
        "unknown topic",
        "priority out of range",
        "no key on a dedupe topic",
        "bad message on stdin",
        "bad JSON on stdin",
        "not an object on stdin",
        "ack by an unknown subscriber",
        "reconnect on an unknown topic",
    ],
)
def test_a_failed_request_exits_1_with_the_brokers_error_on_stderr_and_changes_nothing(broker, args, stdin, error):
    r = ppmq(args[0], "-c", broker.config_path, *args[1:], stdin=stdin)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert error in r.stderr
    assert r.stdout == ""
    assert published(broker) == {"t": 0, "d": 0, "u": 0}


@pytest.mark.parametrize(
    ("args", "stdin"),
    [(["t", "x" * 100_000], None), (["t", "-"], json.dumps({"Payload": "x" * 3_000_000}) + "\n")],
    ids=["read whole before the reply", "refused while still being sent"],
)
def test_a_publish_over_max_frame_bytes_exits_1_with_the_brokers_413(broker_factory, args, stdin):
    # Given a broker that takes frames of 64 KiB at most
    b = broker_factory(TOPICS, ["s"], MaxFrameBytes="64KiB")
    # When a publish sends a larger one
    r = ppmq("publish", "-c", b.config_path, *args, stdin=stdin)
    # Then the command says what the broker said, not how the connection ended, and nothing is stored
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr == "ppmq publish: 413: frame exceeds MaxFrameBytes (65536 bytes)\n"
    assert published(b) == {"t": 0, "d": 0, "u": 0}


@pytest.mark.parametrize(
    ("args", "env", "where"),
    [
        ([], {}, "/etc/ppmq/ppmq.yaml (the default)"),
        ([], {"PPMQ_CONFIG": "/nonexistent/ppmq.yaml"}, "/nonexistent/ppmq.yaml (from PPMQ_CONFIG)"),
        (["-c", "/nonexistent/c.yaml"], {}, "/nonexistent/c.yaml (given with -c)"),
    ],
    ids=["default", "PPMQ_CONFIG", "-c"],
)
@pytest.mark.parametrize(("command", "status"), [("status", 1), ("check", 1), ("serve", 1), ("fsck", 2)])
def test_a_missing_config_says_where_it_was_looked_for_and_how_to_name_one(args, env, where, command, status):
    if where.endswith("(the default)") and os.path.exists("/etc/ppmq/ppmq.yaml"):
        pytest.skip("this host has a config at the default path")  # looked at now: a package test may install one meanwhile
    r = ppmq(command, *args, env={**ENV, **env})
    assert r.returncode == status, (r.stdout, r.stderr)
    assert r.stderr == f"ppmq {command}: no config file at {where}; name one with -c FILE or PPMQ_CONFIG=FILE\n"


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["frobnicate"],
        ["publish"],
        ["publish", "-c", "x.yaml", "t", "x", "--priority", "high"],
        ["publish", "-c", "x.yaml", "t", "x", "--ttl"],
        ["publish", "-c", "x.yaml", "t", "x", "--ttl", "5 minutes"],
        ["publish", "-c", "x.yaml", "t", "x", "--ttl", "inf"],
        ["ack", "-c", "x.yaml", "t", "s"],
        ["reconnect", "-c", "x.yaml"],
        ["status", "-c", "x.yaml", "--bogus"],
        ["listen"],
    ],
    ids=[
        "no command",
        "unknown command",
        "publish without topic",
        "priority not a number",
        "ttl without value",
        "ttl not a duration",
        "ttl endless",
        "ack without keys",
        "reconnect without subscriber",
        "unknown option",
        "listen without socket",
    ],
)
def test_a_usage_error_exits_2_with_the_usage_on_stderr(args):
    r = ppmq(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "usage:" in r.stderr


NOT_UTF8 = os.fsdecode(b"\xff\xfe")  # as Python hands such an argument over: lone surrogates


@pytest.mark.parametrize(
    ("args", "argument"),
    [
        (["publish", "t", NOT_UTF8], "PAYLOAD"),
        (["publish", NOT_UTF8, "x"], "topic"),
        (["publish", "d", "x", "--key", NOT_UTF8], "--key/-k"),
        (["ack", "t", "s", "1", NOT_UTF8], "KEY"),
        (["nack", "t", NOT_UTF8, "1"], "subscriber"),
        (["reconnect", "s", "--topic", NOT_UTF8], "--topic/-t"),
        (["status", "--topic", NOT_UTF8], "--topic/-t"),
        (["peek", NOT_UTF8], "topic"),
        (["purge", "t", "--key", NOT_UTF8, "--yes"], "--key/-k"),
        (["redrive", NOT_UTF8], "DEADTOPIC"),
        (["pause", NOT_UTF8], "subscriber"),
        (["bridge", "to", f"nats://{NOT_UTF8}", "s"], "NATS_URL"),
        (["bridge", "from", "nats://localhost", "S", "C", NOT_UTF8], "TOPIC"),
    ],
    ids=lambda v: " ".join(v).replace(NOT_UTF8, "\\xff\\xfe") if isinstance(v, list) else v,
)
def test_an_argument_that_is_not_utf8_is_a_usage_error_naming_it(broker, args, argument):
    # Given a broker that would take the request
    before = published(broker)
    # When an argument holds bytes that are not UTF-8
    r = ppmq(*args, "-c", broker.config_path)
    # Then the command exits 2 naming the argument and its bytes, with no traceback, and sends nothing
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"argument {argument}: not UTF-8: b'" in r.stderr and "\\xff\\xfe'\n" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert published(broker) == before


def test_a_config_path_that_is_not_utf8_is_read_like_any_other(broker, short_tmp):
    path = short_tmp / f"{NOT_UTF8}.yaml"
    path.write_bytes(broker.config_path.read_bytes())
    r = ppmq("publish", "-c", path, "t", "hello")
    assert (r.returncode, r.stdout) == (0, "published 1\n"), r.stderr


# --- ack, reconnect, status -----------------------------------------------------------------


def in_flight(b, broker_factory, counts: dict[str, int]):
    """A subscriber that never acks, holding `counts[topic]` messages of each topic in flight."""
    sub = broker_factory.subscriber(b, "s", ack=None)
    with b.client() as c:
        for topic, n in counts.items():
            c.publish(topic, [{"Payload": f"{topic}{i}"} for i in range(n)])
    sub.wait_messages(sum(counts.values()))
    return sub


def test_ack_acknowledges_the_keys_given_and_ignores_unknown_ones(broker, broker_factory):
    sub = in_flight(broker, broker_factory, {"u": 3})
    k0, k1, _ = (m["Key"] for m in sub.messages)
    r = ppmq("ack", "-c", broker.config_path, "u", "s", k0, k1, "999999")
    assert (r.returncode, r.stdout.strip()) == (0, "acked 2"), r.stderr
    assert "not in flight to subscriber 's' on topic 'u', so ignored: 1 of the 3 keys" in r.stderr
    st = broker.status()["Topics"]["u"]
    assert (st["Stored"], st["Subscribers"]["s"]["Acked"], st["Subscribers"]["s"]["InFlight"]) == (1, 2, 1)


@pytest.mark.parametrize(
    ("args", "redelivered"),
    [(["--topic", "t"], {"t": 2, "u": 0}), ([], {"t": 2, "u": 3})],
    ids=["one topic", "every topic"],
)
def test_reconnect_redelivers_what_is_in_flight_to_the_subscriber(broker, broker_factory, args, redelivered):
    sub = in_flight(broker, broker_factory, {"t": 2, "u": 3})
    r = ppmq("reconnect", "-c", broker.config_path, "s", *args)
    assert r.returncode == 0, r.stderr
    where = "on topic 't'" if args else "on every topic it is on"
    assert r.stdout == f"requeued what was in flight to subscriber 's' {where}, to be delivered again\n"
    # One transaction gives back what was in flight on every topic named, so when t's are back, u's would be too
    wait_for(lambda: broker.sub_status("t", "s")["Redelivered"] == 2, what="t redelivered")
    assert {topic: broker.sub_status(topic, "s")["Redelivered"] for topic in redelivered} == redelivered
    sub.wait_messages(5 + sum(redelivered.values()))


def status_json(b) -> dict:
    r = ppmq("status", "-c", b.config_path, "--json")
    assert r.returncode == 0, r.stderr
    body = json.loads(r.stdout)
    for t in body["Topics"].values():
        assert t.keys() >= TOPIC_KEYS
        for s in t["Subscribers"].values():
            assert s.keys() >= SUBSCRIBER_KEYS
    return body


def test_status_prints_a_table_or_the_json_body_and_its_counts_follow_the_messages(broker, broker_factory):
    # Given three messages on t waiting for a subscriber that is not there yet
    with broker.client() as c:
        c.publish("t", [{"Payload": "a", "Priority": 0}, {"Payload": "b", "Priority": 1}, {"Payload": "c", "Priority": 1}])
    t = status_json(broker)["Topics"]["t"]
    s = t["Subscribers"]["s"]
    assert (t["Stored"], t["Published"], t["Replaced"], t["Expired"]) == (3, 3, 0, 0)
    assert (s["Ready"], s["InFlight"], s["Delivered"], s["Acked"], s["Redelivered"], s["Expired"]) == ([1, 2, 0], 0, 0, 0, 0, 0)
    assert s["OldestReadyAge"] >= 0
    table = ppmq("status", "-c", broker.config_path)
    assert table.returncode == 0, table.stderr
    for topic in ("t", "d", "u"):
        assert re.search(rf"^{topic}\b", table.stdout, re.M), table.stdout
    assert re.search(r"\bs\b.*\b1/2/0\b", table.stdout), table.stdout
    # When the subscriber comes and acks everything
    broker_factory.subscriber(broker, "s")
    wait_for(lambda: broker.status()["Topics"]["t"]["Stored"] == 0, what="t to empty")
    t = status_json(broker)["Topics"]["t"]
    s = t["Subscribers"]["s"]
    assert (t["Stored"], t["Published"]) == (0, 3)
    assert (s["Ready"], s["InFlight"], s["OldestReadyAge"], s["Delivered"], s["Acked"]) == ([0, 0, 0], 0, None, 3, 3)


# --- listen ---------------------------------------------------------------------------------


def stdout_lines(proc: subprocess.Popen) -> queue.Queue:
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    return lines


@pytest.mark.parametrize("config_args", [False, True], ids=["acks on the delivery connection", "acks through ServerSocket"])
def test_listen_prints_each_batch_as_a_json_line_in_priority_order_and_acks_it(broker, config_args):
    payloads = [("p2", 2), ("p0", 0), ("p1", 1), ("q0", 0), ("q2", 2)]
    with broker.client() as c:
        c.publish("t", [{"Payload": p, "Priority": prio} for p, prio in payloads])
    args = ["-c", broker.config_path] if config_args else []
    proc = subprocess.Popen(
        [*PPMQ, "listen", broker.sub_socket("s"), "--ack", *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV
    )
    try:
        batch = json.loads(stdout_lines(proc).get(timeout=WAIT_S))
        assert (batch["Topic"], batch["Subscriber"]) == ("t", "s")
        assert [m["Payload"] for m in batch["Messages"]] == ["p0", "q0", "p1", "p2", "q2"]
        wait_for(lambda: broker.sub_status("t", "s")["Acked"] == 5, what="the listener's acks")
        assert broker.status()["Topics"]["t"]["Stored"] == 0
    finally:
        proc.terminate()
        proc.wait(WAIT_S)


# --- configuration from the environment, and no broker ---------------------------------------


def test_config_defaults_to_ppmq_config_from_the_environment(broker):
    env = {**ENV, "PPMQ_CONFIG": str(broker.config_path)}
    r = ppmq("publish", "t", "via the environment", env=env)
    assert r.returncode == 0, r.stderr
    r = ppmq("status", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["Topics"]["t"]["Published"] == 1


@pytest.mark.parametrize("stale", [False, True], ids=["no socket file", "a stale socket file"])
@pytest.mark.parametrize(
    "args",
    [
        ["publish", "t", "x"],
        ["ack", "t", "s", "1"],
        ["reconnect", "s"],
        ["status"],
        ["nack", "t", "s", "1"],
        ["reject", "t", "s", "1"],
        ["peek", "t"],
        ["purge", "t", "--yes"],
        ["redrive", "t"],
        ["pause", "s"],
        ["resume", "s"],
        ["ping"],
    ],
    ids=["publish", "ack", "reconnect", "status", "nack", "reject", "peek", "purge", "redrive", "pause", "resume", "ping"],
)
def test_a_client_command_exits_1_with_a_clear_message_when_no_broker_listens(broker_factory, args, stale):
    b = broker_factory(TOPICS, ["s"], start=False)
    if stale:  # a broker that died without removing its socket
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(b.socket)
        dead.close()
    r = ppmq(args[0], "-c", b.config_path, *args[1:])
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert f"cannot connect to {b.socket}" in r.stderr
    assert "Traceback" not in r.stderr
    assert Path(b.socket).exists() == stale


def test_serve_refuses_to_steal_the_socket_of_a_running_broker_and_exits_1(broker, short_tmp):
    b = broker
    other = short_tmp / "other.yaml"  # another DataPath: one DataPath is refused before any socket
    other.write_text(json.dumps({**b.config, "DataPath": str(short_tmp / "other-data")}))
    proc = ppmq("serve", "-c", other)
    assert proc.returncode == 1
    assert f"another process is already listening on {b.socket}" in proc.stderr
    assert b.status()["Topics"]  # the first one still serves


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("DataPath", "{tmp}/a-file", "cannot create DataPath {tmp}/a-file"),
        ("ServerSocket", "{tmp}/a-file/s.sock", "cannot listen on {tmp}/a-file/s.sock"),
    ],
)
def test_serve_exits_1_with_a_clear_message_when_it_cannot_open_its_store_or_socket(short_tmp, key, value, message):
    (short_tmp / "a-file").write_text("")
    config = {"ServerSocket": f"{short_tmp}/s.sock", "DataPath": f"{short_tmp}/d", key: value.format(tmp=short_tmp)}
    path = short_tmp / "c.yaml"
    path.write_text(json.dumps(config))
    proc = ppmq("serve", "-c", path)
    assert proc.returncode == 1
    assert message.format(tmp=short_tmp) in proc.stderr
    assert "Traceback" not in proc.stderr
