"""Pull subscribers through a real `ppmq serve` (PROTOCOL §9): TAKE, its Wait, the
Window over several connections, competing worker processes killed mid-batch,
and a restart."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from ppmq.client.library import Client
from ppmq.errors import ClientError

from ..conftest import wait_for
from .test_metrics import metrics_now, value

PULL = {"Name": "w", "Pull": True, "Socket": None}
TOPIC = {"Name": "t", "Subscribers": ["w"], "AckRetry": "1h"}


def pull_broker(broker_factory, sub: dict | None = None, **topic: object):
    return broker_factory([{**TOPIC, **topic}], [{**PULL, **(sub or {})}])


def publish(b, *payloads: object) -> None:
    with b.client() as c:
        c.publish("t", [{"Payload": x} for x in payloads])


def test_take_answers_up_to_count_messages_in_flight_as_a_push_batch_carries_them(broker_factory):
    # Given three messages for a Pull subscriber with Metadata
    b = pull_broker(broker_factory, {"Metadata": True})
    publish(b, "a", "b", "c")
    with b.client() as c:
        # When a worker takes two
        taken = c.take("t", "w", count=2)
        # Then it gets the first two, as a push batch carries them, now in flight
        assert [(m.key, m.payload, m.attempt) for m in taken] == [("1", "a", 1), ("2", "b", 1)]
        assert taken[0].published is not None and taken[0].published.endswith("Z")
        s = b.sub_status("t", "w")
        assert (s["Ready"], s["InFlight"], s["Delivered"], s["Takers"], s["WaitingTakes"], s["Connected"]) == ([1], 2, 2, 1, 0, True)
        # And Count defaults to 1, and acks work as for any subscriber
        assert [m.key for m in c.take("t", "w")] == ["3"]
        assert c.ack("t", "w", ["1", "2", "3"]).accepted == 3
    s = b.sub_status("t", "w")
    assert (s["InFlight"], s["Acked"], s["Takers"], s["Connected"]) == (0, 3, 0, False)


@pytest.mark.parametrize(
    ("wrapper", "status", "field"),
    [
        ({"Count": 0}, 400, "Count"),
        ({"Count": 10001}, 400, "Count"),
        ({"Count": "2"}, 400, "Count"),
        ({"Wait": -1}, 400, "Wait"),
        ({"Wait": 3601}, 400, "Wait"),
        ({"Subscriber": "p"}, 400, "Subscriber"),
        ({"Subscriber": "nobody"}, 404, "Subscriber"),
        ({"Subscriber": "other"}, 404, "Subscriber"),
        ({"Topic": "nothing"}, 404, "Topic"),
    ],
)
def test_take_refuses_bad_input_naming_the_field(broker_factory, wrapper, status, field):
    # Given a Pull subscriber w, a push subscriber p and a Pull subscriber of another topic
    b = broker_factory(
        [{**TOPIC, "Subscribers": ["w", "p"]}, {"Name": "u", "Subscribers": ["other"]}],
        [PULL, {"Name": "p"}, {**PULL, "Name": "other"}],
    )
    publish(b, "x")
    # When a TAKE carries a bad value
    with b.client() as c, pytest.raises(ClientError) as exc:
        c.request({"Topic": "t", "Subscriber": "w", "Command": "TAKE", **wrapper})
    # Then it is refused, naming the field, and nothing is taken
    assert exc.value.status == status and exc.value.error.startswith(f"{field}:"), exc.value.error
    assert b.sub_status("t", "w")["InFlight"] == 0


def test_the_window_counts_what_every_connection_took(broker_factory):
    # Given a Pull subscriber with a Window of 3 and five messages
    b = pull_broker(broker_factory, {"Window": 3})
    publish(b, *range(5))
    with b.client() as one, b.client() as two:
        # When two connections take more than the Window allows
        assert len(one.take("t", "w", count=2)) == 2
        assert len(two.take("t", "w", count=10)) == 1
        # Then the Window is full for both until an ack makes room, from either
        assert two.take("t", "w", count=10) == [] and one.take("t", "w") == []
        assert len(two.take("t", "w", count=10, acks=["1", "2"])) == 2
    assert b.sub_status("t", "w")["Takers"] == 0  # both connections closed


def test_a_waiting_take_returns_as_soon_as_a_message_is_published(broker_factory):
    # Given a worker waiting up to 10 s in a TAKE on an empty subscriber
    b = pull_broker(broker_factory)
    got: list = []
    with b.client() as c:
        worker = threading.Thread(target=lambda: got.append((c.take("t", "w", count=5, wait_s=10), time.monotonic())))
        worker.start()
        wait_for(lambda: b.sub_status("t", "w")["WaitingTakes"] == 1, what="a waiting TAKE")
        assert b.sub_status("t", "w")["Takers"] == 1
        # And `ppmq metrics` shows the taker and its waiting TAKE
        fams = metrics_now(b)
        assert value(fams, "ppmq_takers", topic="t", subscriber="w") == 1
        assert value(fams, "ppmq_waiting_takes", topic="t", subscriber="w") == 1
        # When a message is published
        published = time.monotonic()
        publish(b, "late")
        worker.join(10)
    # Then the TAKE answers with it at once
    ((messages, answered),) = got
    assert [m.payload for m in messages] == ["late"]
    assert answered - published < 2.0


def test_a_waiting_take_is_answered_by_the_publishs_own_step(broker_factory):
    # Given a worker waiting in a TAKE, and the broker's commits counted (a STATUS is a step of its own)
    b = pull_broker(broker_factory)
    got: list = []
    with b.client() as c:
        worker = threading.Thread(target=lambda: got.append(c.take("t", "w", count=5, wait_s=10)))
        worker.start()
        wait_for(lambda: b.sub_status("t", "w")["WaitingTakes"] == 1, what="a waiting TAKE")
        assert b.status()["Commits"] - b.status()["Commits"] == -1  # nothing commits between two STATUS but the first
        before = b.status()["Commits"]
        # When two messages are published
        publish(b, "a", "b")
        worker.join(10)
        # Then the TAKE got them in the publish's step: one commit besides the STATUS, not one more to take them
        assert [[m.payload for m in ms] for ms in got] == [["a", "b"]]
        assert b.status()["Commits"] - before == 2


def test_a_waiting_take_on_a_full_window_gets_the_room_an_ack_makes(broker_factory):
    # Given a full Window of 1 and a second worker waiting for room
    b = pull_broker(broker_factory, {"Window": 1})
    publish(b, "a", "b")
    got: list = []
    with b.client() as one, b.client() as two:
        (first,) = one.take("t", "w")
        worker = threading.Thread(target=lambda: got.append(two.take("t", "w", wait_s=10)))
        worker.start()
        wait_for(lambda: b.sub_status("t", "w")["WaitingTakes"] == 1, what="a waiting TAKE")
        # When the first worker acks
        one.ack("t", "w", [first.key])
        worker.join(10)
    # Then the waiting one gets the next message
    assert [[m.payload for m in ms] for ms in got] == [["b"]]


def test_a_take_that_waits_in_vain_answers_with_nothing_when_its_wait_ends(broker_factory):
    b = pull_broker(broker_factory)
    with b.client() as c:
        started = time.monotonic()
        assert c.take("t", "w", count=3, wait_s=0.5) == []
        assert 0.5 <= time.monotonic() - started < 3.0
    assert b.sub_status("t", "w")["WaitingTakes"] == 0


def test_what_a_closed_connection_took_is_ready_again_at_once_at_its_place(broker_factory):
    # Given a connection that took two of three messages
    b = pull_broker(broker_factory, {"Metadata": True})
    publish(b, "a", "b", "c")
    c = Client(b.socket)
    assert len(c.take("t", "w", count=2)) == 2
    # When it closes without acking
    c.close()
    # Then both are ready again, first in line, as second attempts
    wait_for(lambda: b.sub_status("t", "w")["Ready"] == [3], what="taken messages back in ready")
    with b.client() as other:
        again = other.take("t", "w", count=3)
    assert [(m.payload, m.attempt) for m in again] == [("a", 2), ("b", 2), ("c", 1)]


def test_a_waiting_connection_that_closes_takes_nothing_and_stops_waiting(broker_factory):
    # Given a connection waiting in a TAKE, which then goes away
    b = pull_broker(broker_factory)
    c = Client(b.socket)
    c._sock.sendall(b'{"Id":1,"Topic":"t","Subscriber":"w","Command":"TAKE","Wait":30}\n')
    wait_for(lambda: b.sub_status("t", "w")["WaitingTakes"] == 1, what="a waiting TAKE")
    c.close()
    wait_for(lambda: b.sub_status("t", "w")["WaitingTakes"] == 0, what="the TAKE to stop waiting")
    # When a message is published
    publish(b, "x")
    # Then it stays ready for the next worker (a TAKE still waiting would have been served by now)
    s = b.settled_status()["Topics"]["t"]["Subscribers"]["w"]
    assert (s["Ready"], s["InFlight"], s["Takers"]) == ([1], 0, 0)


class RawTaker:
    """TAKEs on a socket of its own, each reply read as the line it is, to measure it."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.lines = self.sock.makefile("rb")

    def take(self, count: int, acks: list[str], wait_s: float = 0) -> tuple[int, list[dict]]:
        """(the reply line's bytes, newline included; its messages), acking `acks` first."""
        wrapper = {"Id": 1, "Topic": "t", "Subscriber": "w", "Command": "TAKE", "Count": count, "Wait": wait_s, "Acks": acks}
        self.sock.sendall(json.dumps(wrapper).encode() + b"\n")
        line = self.lines.readline()
        reply = json.loads(line)
        assert reply["Status"] == 200, reply
        return len(line), reply["Body"]["Messages"]

    def close(self) -> None:
        self.lines.close()
        self.sock.close()


FRAME_BYTES = 32768
SMALL = [f"{i:03d}" + "x" * 97 for i in range(250)]  # one publish of 29 KB, whose batch with metadata takes 50 KB


def take_all(taker: RawTaker, n: int) -> list[tuple[int, int]]:
    """(reply bytes, messages) of each TAKE until n messages came, in order."""
    sizes, payloads, acks = [], [], []
    while len(payloads) < n:
        size, messages = taker.take(1000, acks)
        sizes.append((size, len(messages)))
        payloads += [m["Payload"] for m in messages]
        acks = [m["Key"] for m in messages]
    assert payloads == SMALL
    return sizes


@pytest.mark.parametrize("queue", ["fresh", "in memory", "read from the store"])
def test_a_take_reply_holds_no_more_messages_than_max_frame_bytes_allows(broker_factory, queue):
    # Given a MaxFrameBytes of 32 KiB, and a Pull subscriber with Metadata
    b = broker_factory([TOPIC], [{**PULL, "Metadata": True, "Window": 1000}], MaxFrameBytes=FRAME_BYTES)
    taker = RawTaker(b.socket)
    first: list = []
    try:
        # When 250 messages come in one publish: into a waiting TAKE, to a queue
        # in memory, or to one the broker reads from the store after a restart
        if queue == "fresh":
            waiting = threading.Thread(target=lambda: first.append(taker.take(1000, [], wait_s=10)))
            waiting.start()
            wait_for(lambda: b.sub_status("t", "w")["WaitingTakes"] == 1, what="a waiting TAKE")
        publish(b, *SMALL)
        if queue == "read from the store":
            b.stop()
            b.start()
            taker.close()
            taker = RawTaker(b.socket)
        if queue == "fresh":
            waiting.join(10)
        # Then each TAKE of Count 1000 answers with as many as one frame holds, and all arrive in order
        sizes = take_all(taker, len(SMALL)) if not first else None
    finally:
        taker.close()
    if first:  # the waiting TAKE got the first part; the rest was left ready
        ((size, messages),) = first
        assert [m["Payload"] for m in messages] == SMALL[: len(messages)]
        sizes = [(size, len(messages))]
    assert all(size <= FRAME_BYTES for size, _ in sizes), sizes
    assert 1 < sizes[0][1] < len(SMALL) and sizes[0][0] > FRAME_BYTES * 0.8, sizes


def test_a_take_of_a_message_larger_than_max_frame_bytes_allows_answers_with_it_alone(broker_factory):
    # Given a MaxFrameBytes of 32 KiB and a message that fills a publish frame, behind a small one
    b = broker_factory([TOPIC], [{**PULL, "Metadata": True}], MaxFrameBytes=FRAME_BYTES, MaxMessageBytes=FRAME_BYTES)
    big = "x" * (FRAME_BYTES - 100)
    publish(b, "small")
    publish(b, big, "after")
    taker = RawTaker(b.socket)
    try:
        # When a worker takes, and takes again
        got = [taker.take(10, []) for _ in range(3)]
    finally:
        taker.close()
    # Then the large one comes alone, in a reply larger than one frame, and nothing is lost
    assert [[m["Payload"][:5] for m in ms] for _, ms in got] == [["small"], ["xxxxx"], ["after"]]
    assert got[1][1][0]["Payload"] == big and got[1][0] > FRAME_BYTES


def test_taken_unacked_messages_are_ready_again_after_a_restart(broker_factory):
    # Given messages taken and not acked on a connection still open, and the broker killed
    b = pull_broker(broker_factory)
    publish(b, "a", "b")
    held = Client(b.socket)
    assert len(held.take("t", "w", count=2)) == 2
    b.kill()
    held.close()
    # When it starts again
    b.start()
    # Then they are ready, at their places
    assert b.sub_status("t", "w")["Ready"] == [2]
    with b.client() as c:
        assert [m.payload for m in c.take("t", "w", count=5)] == ["a", "b"]


WORKER = """
import json, sys, time
from ppmq.client.library import Client
c = Client(sys.argv[1], timeout_s=30)
acks = None
while True:
    batch = c.take("t", "w", count=10, wait_s=2, acks=acks)
    if acks:
        print(json.dumps({"acked": acks}), flush=True)
    if not batch:
        break
    print(json.dumps({"took": [m.payload for m in batch]}), flush=True)
    time.sleep(0.02)  # the work: a kill -9 lands mid-batch
    acks = [m.key for m in batch]
"""


def test_competing_workers_killed_mid_batch_lose_nothing_and_ack_each_message_once(broker_factory, short_tmp: Path):
    # Given 2,000 messages and four worker processes taking batches of 10
    n = 2000
    b = pull_broker(broker_factory, {"Window": 200})
    publish(b, *range(n))
    logs = short_tmp / "logs"
    logs.mkdir()

    def worker(i: int) -> subprocess.Popen:
        out = open(logs / f"{i}.log", "w")
        return subprocess.Popen([sys.executable, "-c", WORKER, b.socket], stdout=out, env=os.environ)

    workers = {i: worker(i) for i in range(4)}
    # When workers are killed with kill -9 while they work, and replaced
    killed: set[int] = set()
    rng = random.Random(7)
    for i in range(4, 10):
        time.sleep(rng.uniform(0.1, 0.3))
        victim = rng.choice([k for k, p in workers.items() if p.poll() is None] or [None])
        if victim is None:
            break
        workers[victim].kill()
        killed.add(victim)
        workers[i] = worker(i)
    for p in workers.values():
        p.wait(60)
    # Then every message was acked exactly once and none is left
    s = b.sub_status("t", "w")
    assert (s["Acked"], s["IgnoredAcks"], s["InFlight"], s["Ready"]) == (n, 0, 0, [0]), s
    assert b.status()["Topics"]["t"]["Stored"] == 0
    # And a message was taken twice only if a killed worker had taken it
    taken: Counter = Counter()
    by_killed: set = set()
    for i in workers:
        for line in (logs / f"{i}.log").read_text().splitlines():
            record = json.loads(line)
            for x in record.get("took", ()):
                taken[x] += 1
                if i in killed:
                    by_killed.add(x)
    assert set(taken) == set(range(n))
    assert {x for x, k in taken.items() if k > 1} <= by_killed
    assert killed


def test_a_request_sent_behind_a_waiting_take_waits_for_its_answer_and_does_not_end_it(broker_factory):
    # Given a connection waiting up to 1 s in a TAKE on an empty subscriber
    b = pull_broker(broker_factory)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(b.socket)
        replies = s.makefile("rb")
        started = time.monotonic()
        s.sendall(b'{"Id":1,"Topic":"t","Subscriber":"w","Command":"TAKE","Wait":1}\n')
        wait_for(lambda: b.sub_status("t", "w")["WaitingTakes"] == 1, what="a waiting TAKE")
        # When it publishes on the same connection while the TAKE waits
        s.sendall(b'{"Id":2,"Topic":"t","Messages":[{"Payload":"x"}]}\n')
        first = json.loads(replies.readline())
        answered = time.monotonic()
        second = json.loads(replies.readline())
    # Then the TAKE waits its whole Wait (the peer is still there) and is answered
    # first, with nothing: the publish behind it is applied only after it
    assert (first["Id"], first["Status"], first["Body"]["Messages"]) == (1, 200, [])
    assert answered - started >= 1.0
    assert (second["Id"], second["Status"]) == (2, 200)
    assert b.sub_status("t", "w")["Ready"] == [1]
