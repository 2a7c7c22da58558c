"""`ppmq take` as a shell runs it: a subprocess consuming from a Pull subscriber of
a real broker (PROTOCOL §9), one JSON line a message.

Exit status: 0 when a message was printed, 1 when none came or the request failed,
2 usage error.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from ..conftest import WAIT_S, wait_for
from .test_cli import ENV, PPMQ, ppmq

PULL = {"Name": "w", "Pull": True, "Socket": None, "Metadata": True}
TOPICS = [{"Name": "j", "Priorities": 2, "AckRetry": "1h", "Subscribers": ["w", "p"]}]


@pytest.fixture
def broker(broker_factory):
    return broker_factory(TOPICS, [PULL, "p"])


def publish(b, *messages: tuple[object, int]) -> None:
    with b.client() as c:
        c.publish("j", [{"Payload": p, "Priority": prio} for p, prio in messages])


def take(b, *args: object) -> subprocess.CompletedProcess:
    return ppmq("take", "-c", b.config_path, "j", "w", *args)


def lines(r: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_take_prints_messages_in_delivery_order_one_json_line_each_and_acks_them(broker):
    # Given three messages of two priorities
    publish(broker, ("low", 1), ("high", 0), ({"n": 1}, 0))
    # When a shell takes two
    r = take(broker, "-n", "2")
    # Then it gets the two of priority 0, each a line as TAKE answers it, and they are done
    assert r.returncode == 0, r.stderr
    got = lines(r)
    assert [(m["Payload"], m["Priority"], m["Attempt"]) for m in got] == [("high", 0, 1), ({"n": 1}, 0, 1)]
    assert r.stdout.count("\n") == 2
    s = broker.sub_status("j", "w")
    assert (s["Ready"], s["InFlight"], s["Acked"]) == ([0, 1], 0, 2)
    # And without -n it takes one
    assert [m["Payload"] for m in lines(take(broker))] == ["low"]


def test_take_of_more_than_one_reply_holds_takes_again_until_it_has_n(broker_factory):
    # Given replies of 4 KiB at most and ten messages of 1 KB
    b = broker_factory(TOPICS, [PULL, "p"], MaxFrameBytes="4KiB")
    for i in range(10):
        publish(b, (f"{i}" * 1000, 0))
    # When a shell takes eight
    r = take(b, "-n", "8")
    # Then it gets the first eight, in order, over several TAKEs, all acked
    assert r.returncode == 0, r.stderr
    assert [m["Payload"][0] for m in lines(r)] == [str(i) for i in range(8)]
    s = b.sub_status("j", "w")
    assert (s["InFlight"], s["Acked"], sum(s["Ready"])) == (0, 8, 2)


def test_take_with_nothing_ready_exits_1_saying_so(broker):
    r = take(broker)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == "ppmq take: no message for subscriber 'w' on topic 'j'\n"


def test_take_with_wait_answers_as_soon_as_a_message_is_published(broker):
    # Given a take waiting up to a minute
    proc = subprocess.Popen([*PPMQ, "take", "-c", broker.config_path, "j", "w", "--wait", "1m"], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        wait_for(lambda: broker.sub_status("j", "w")["WaitingTakes"] == 1, what="the take to wait")
        # When a message is published
        publish(broker, ("now", 0))
        # Then the take prints it and exits 0, long before the minute is up
        out, _ = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert [m["Payload"] for m in map(json.loads, out.splitlines())] == ["now"]


def test_take_with_no_ack_prints_the_messages_and_they_go_back_when_it_exits(broker):
    # Given two messages
    publish(broker, ("a", 0), ("b", 0))
    # When a shell takes them without acking
    r = take(broker, "-n", "2", "--no-ack")
    # Then it printed both, and the broker gave them back as the command exited, a delivery counted
    assert [m["Payload"] for m in lines(r)] == ["a", "b"]
    wait_for(lambda: broker.sub_status("j", "w")["Ready"] == [2, 0], what="the messages back in the queue")
    assert broker.sub_status("j", "w")["Acked"] == 0
    assert [(m["Payload"], m["Attempt"]) for m in lines(take(broker, "-n", "2"))] == [("a", 2), ("b", 2)]


def test_take_stops_at_a_reader_that_went_away_and_acks_only_what_it_wrote(broker):
    # Given five messages
    publish(broker, *((i, 0) for i in range(5)))
    # When a shell pipes take into a reader that closes after the first line
    done = subprocess.run(
        f"{' '.join(PPMQ)} take -c {broker.config_path} j w -n 5 | head -n 1", shell=True, capture_output=True, text=True, env=ENV
    )
    # Then the reader got the first message, and no message is lost: each is acked or back in the queue
    assert [json.loads(line)["Payload"] for line in done.stdout.splitlines()] == [0]
    assert "Traceback" not in done.stderr
    wait_for(lambda: broker.sub_status("j", "w")["InFlight"] == 0, what="nothing left in flight")
    s = broker.sub_status("j", "w")
    assert s["Acked"] >= 1 and s["Acked"] + sum(s["Ready"]) == 5, s


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["j", "p"], "400: "),
        (["j", "ghost"], "404: "),
        (["nope", "w"], "404: "),
        (["j", "w", "--wait", "2h"], "400: Wait"),
    ],
    ids=["a push subscriber", "an unknown subscriber", "an unknown topic", "a wait over an hour"],
)
def test_a_take_the_broker_refuses_exits_1_with_its_error(broker, args, error):
    publish(broker, ("kept", 0))
    r = ppmq("take", "-c", broker.config_path, *args)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.startswith(f"ppmq take: {error}"), r.stderr
    assert r.stdout == ""
    assert broker.sub_status("j", "w")["Ready"] == [1, 0]


@pytest.mark.parametrize(
    "args",
    [["j"], ["j", "w", "-n", "0"], ["j", "w", "--wait", "soon"], ["j", "w", "--ack", "--no-ack"]],
    ids=["without subscriber", "n 0", "wait not a duration", "ack and no-ack"],
)
def test_a_usage_error_of_take_exits_2(args):
    r = ppmq("take", "-c", "x.yaml", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "usage:" in r.stderr
