"""The writer, driven on a real store without sockets."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import msgspec
import pytest

from ppmq.core import staging
from ppmq.core.broker import Broker
from ppmq.core.ops import Delivery
from ppmq.protocol import messages as p
from ppmq.server import group_commit as writer_module
from ppmq.server.group_commit import GroupCommit
from ppmq.store.store import Store
from tests.unit.core.test_broker import STATUS, open_broker, publish, two_subscribers
from tests.unit.core.test_pull import open_pull_broker, take
from tests.unit.core.test_pull import publish as publish_to


def test_a_caller_cancelled_before_its_reply_does_not_stop_the_writer(tmp_path):
    # Given a writer, and a caller waiting for a reply
    broker, store = open_broker(tmp_path)

    async def run() -> int:
        writer = GroupCommit(broker)
        task = asyncio.create_task(writer.run())
        caller = asyncio.create_task(writer.call(publish(b"1")))
        await asyncio.sleep(0)  # submitted
        # When the caller is cancelled before the step that answers it ends
        caller.cancel()
        # Then the writer goes on answering others
        reply = await asyncio.wait_for(writer.call(STATUS), timeout=10)
        writer.stop()
        await task
        return reply.body["Topics"]["t"]["Published"]

    assert asyncio.run(run()) == 1
    store.close()


def test_acks_that_free_room_for_waiting_messages_are_applied_without_waiting_for_company(tmp_path, monkeypatch):
    # Given subscriber s with its one-batch Window full and more messages ready
    broker, store = open_broker(tmp_path)
    first = broker.step([publish(*[b"%d" % i for i in range(150)])], {"s"}, time.time_ns())
    [batch] = first.deliveries
    assert broker.has_backlog("s")
    # ... and a writer that would hold one-way acks a minute for company
    monkeypatch.setattr(writer_module, "ACK_GATHER_S", 60.0)
    keys = [m["Key"] for m in msgspec.json.decode(batch.frame)["Messages"]]

    async def run() -> Delivery:
        writer = GroupCommit(broker)
        task = asyncio.create_task(writer.run())
        pushed: asyncio.Future[Delivery] = asyncio.get_running_loop().create_future()
        writer.open("s", _Outlet(pushed))
        # When s acks its batch one-way, as ppMQ subscribers do
        writer.submit(p.Request(topic="t", subscriber="s", acks=keys))
        # Then the next batch comes at once: the acks did not wait for company
        delivery = await asyncio.wait_for(pushed, timeout=10)
        writer.stop()
        await task
        return delivery

    delivery = asyncio.run(run())
    assert len(delivery.msgs) == 50
    store.close()


def test_one_way_acks_wait_for_company_without_waking_the_idle_writer_and_share_the_next_step(tmp_path, monkeypatch):
    # Given s with a batch in flight and nothing more ready, a writer waiting idle,
    # and one-way acks that wait up to a minute for company
    broker, store, acks = _acks_of_a_batch_in_flight(tmp_path, monkeypatch, gather_s=60.0)
    steps: list[float] = []

    async def run() -> tuple[bool, float, float, int]:
        writer = GroupCommit(broker, on_step=steps.append)
        task = asyncio.create_task(writer.run())
        await _until(lambda: _waits(writer))  # idle
        went_round = writer._heartbeat
        # When s acks its batch one-way
        writer.submit(acks)
        # Then the writer was not woken for it (submit is where that is decided),
        # and it did not go round its loop when the event loop went round
        woken = not _waits(writer)
        await asyncio.sleep(0)
        quiet = writer._heartbeat
        # And the acks are applied in the step of the publish that comes next
        await asyncio.wait_for(writer.call(publish(b"3")), timeout=10)
        in_flight = (await writer.call(STATUS)).body["Topics"]["t"]["Subscribers"]["s"]["InFlight"]
        writer.stop()
        await task
        return woken, went_round, quiet, in_flight

    woken, went_round, quiet, in_flight = asyncio.run(run())
    assert not woken and quiet == went_round
    assert in_flight == 0 and len(steps) == 2  # the publish with the acks, then STATUS
    store.close()


def test_one_way_acks_that_find_no_company_go_alone_when_the_gathering_ends(tmp_path, monkeypatch):
    # Given s with a batch in flight, a writer waiting idle, and acks that wait 0.2 s for company
    broker, store, acks = _acks_of_a_batch_in_flight(tmp_path, monkeypatch, gather_s=0.2)
    steps: list[float] = []

    async def run() -> float:
        writer = GroupCommit(broker, on_step=lambda _: steps.append(time.monotonic()))
        task = asyncio.create_task(writer.run())
        await asyncio.sleep(0.05)
        # When s acks its batch one-way and nothing else comes
        submitted = time.monotonic()
        writer.submit(acks)
        await writer.until(lambda: bool(steps))
        writer.stop()
        await task
        return steps[0] - submitted

    # Then they are applied once the gathering ends: not before, and not only at
    # the writer's next timer (a second away when nothing is due)
    assert 0.2 <= asyncio.run(run()) < 0.8
    [status] = broker.step([STATUS], set(), time.time_ns()).replies
    assert status.body["Topics"]["t"]["Subscribers"]["s"]["InFlight"] == 0
    store.close()


def _waits(writer: GroupCommit) -> bool:
    """The writer waits, for work or a timer, and nothing has woken it yet."""
    return writer._waiter is not None and not writer._waiter.done()


async def _until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Until predicate holds, looked at every millisecond."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.001)


def _acks_of_a_batch_in_flight(tmp_path, monkeypatch, gather_s: float) -> tuple[Broker, Store, p.Request]:
    """A broker with one batch in flight to s and nothing more ready, the one-way
    acks of that batch, and one-way acks gathering for `gather_s`."""
    broker, store = open_broker(tmp_path)
    [batch] = broker.step([publish(b"1", b"2")], {"s"}, time.time_ns()).deliveries
    monkeypatch.setattr(writer_module, "ACK_GATHER_S", gather_s)
    keys = [m["Key"] for m in msgspec.json.decode(batch.frame)["Messages"]]
    return broker, store, p.Request(topic="t", subscriber="s", acks=keys)


class _Outlet:
    def __init__(self, pushed: asyncio.Future[Delivery]) -> None:
        self.pushed = pushed

    def push(self, delivery: Delivery) -> None:
        self.pushed.set_result(delivery)


def test_a_steps_journal_events_are_written_while_the_next_step_commits_and_the_last_before_the_writer_waits(tmp_path, monkeypatch):
    # Given a writer taking one request a step, a subscriber that takes every batch,
    # and a journal that notes, for each step's events, whether a step was running
    broker, store = open_broker(tmp_path)
    monkeypatch.setattr(writer_module, "MAX_OPS_PER_STEP", 1)
    written: list[tuple[list[str], bool]] = []

    async def run() -> None:
        writer = GroupCommit(broker, lambda events: written.append(([e.event for e in events], writer.busy)))
        writer.open("s", _Reopening(writer, "s"))
        task = asyncio.create_task(writer.run())
        # When two publishes are answered, one step each
        await asyncio.wait_for(asyncio.gather(writer.call(publish(b"1")), writer.call(publish(b"2"))), timeout=10)
        # Then the first step's events were written during the second step (its
        # batch went out before its commit), and the second's once the writer had
        # nothing left to do, without a third step
        for _ in range(1000):
            if len(written) == 2:
                break
            await asyncio.sleep(0.01)
        writer.stop()
        await task

    asyncio.run(run())
    assert written == [(["publish", "deliver"], True), (["publish", "deliver"], False)]
    store.close()


class _Reopening:
    """A subscriber that is ready again as soon as it is given a batch."""

    def __init__(self, writer: GroupCommit, name: str) -> None:
        self.writer, self.name = writer, name

    def push(self, delivery: Delivery) -> None:
        self.writer.open(self.name, self)


def test_without_sync_a_steps_batch_leaves_before_its_commit_and_the_reply_after(tmp_path):
    # Given a writer without Sync, and subscriber s open for batches, whose outlet
    # notes whether the step was still under way, and the publisher answered
    broker, store = open_broker(tmp_path)
    seen: list[tuple[bool, bool]] = []

    async def run() -> None:
        writer = GroupCommit(broker, durable=False)
        task = asyncio.create_task(writer.run())
        replied = asyncio.get_running_loop().create_future()

        class Outlet:
            def push(self, delivery: Delivery) -> None:
                seen.append((writer.busy, replied.done()))

        writer.open("s", Outlet())
        # When a message is published
        writer.submit(publish(b"1"), replied.set_result)
        await asyncio.wait_for(replied, timeout=10)
        writer.stop()
        await task

    asyncio.run(run())
    # Then its batch was pushed while its step ran, before the commit and the reply
    assert seen == [(True, False)]
    store.close()


@pytest.mark.parametrize("ready", [0, 50])
def test_a_publish_to_a_subscriber_with_its_window_full_and_at_most_a_batch_ready_waits_for_its_acks_and_shares_their_step(
    tmp_path, monkeypatch, ready
):
    # Given s with a whole Window (100) in flight and `ready` more ready (a
    # queue kept one batch behind by a publisher that keeps pace), open for its
    # next batch, and a writer without Sync that lets ops wait a minute for company
    broker, store, acks = _a_full_window_in_flight(tmp_path, monkeypatch, gather_s=60.0)
    broker.step([publish(*[b"%d" % i for i in range(ready)])] if ready else [], set(), time.time_ns())
    steps: list[float] = []
    pushed: list[Delivery] = []

    async def run() -> tuple[bool, dict]:
        writer = GroupCommit(broker, durable=False, on_step=steps.append)
        task = asyncio.create_task(writer.run())
        writer.open("s", _Recording(pushed))
        await _until(lambda: _waits(writer))  # idle
        # When a message is published
        replied = asyncio.get_running_loop().create_future()
        writer.submit(publish(b'"new"'), replied.set_result)
        # Then it waits for s's acks, which are on their way: the writer, not
        # woken, gathers company for it (submit is where that is decided)
        gathering = writer._gather_until is not None and _waits(writer)
        await asyncio.sleep(0)
        waited = gathering and not replied.done() and not steps
        # And comes with them in one step, which sends s its next batch: what
        # was ready and the new message (straight into flight, with nothing ready)
        writer.submit(acks)
        await asyncio.wait_for(replied, timeout=10)
        in_step = len(steps)
        status = (await writer.call(STATUS)).body["Topics"]["t"]["Subscribers"]["s"]
        writer.stop()
        await task
        return waited and in_step == 1, status

    one_step, status = asyncio.run(run())
    assert one_step
    assert [len(d.msgs) for d in pushed] == [ready + 1]
    assert msgspec.json.decode(pushed[0].frame)["Messages"][-1]["Payload"] == "new"
    assert (status["InFlight"], status["Ready"]) == (ready + 1, [0])
    store.close()


def test_a_publish_waiting_for_acks_that_do_not_come_goes_alone_when_the_gathering_ends_and_the_next_does_not_wait(tmp_path, monkeypatch):
    # Given s with a whole Window in flight, and a writer that lets ops wait 0.2 s for company
    broker, store, _ = _a_full_window_in_flight(tmp_path, monkeypatch, gather_s=0.2)

    async def run() -> tuple[float, int]:
        writer = GroupCommit(broker, durable=False)
        task = asyncio.create_task(writer.run())
        await asyncio.sleep(0.05)
        # When a message is published and s does not ack
        submitted = time.monotonic()
        await asyncio.wait_for(writer.call(publish(b"1")), timeout=10)
        answered = time.monotonic() - submitted
        # (and then another, with ops let wait a minute)
        monkeypatch.setattr(writer_module, "ACK_GATHER_S", 60.0)
        reply = await asyncio.wait_for(writer.call(publish(b"2")), timeout=10)
        writer.stop()
        await task
        return answered, reply.status

    # Then it is stored once the gathering ends, and waits for s in its ready queue
    answered, status = asyncio.run(run())
    assert 0.2 <= answered < 0.8
    # And the next is answered at once: s's acks did not come in time, and are
    # not waited for again until they come (a slow subscriber holds up no publisher)
    assert status == 200
    [status] = broker.step([STATUS], set(), time.time_ns()).replies
    assert status.body["Topics"]["t"]["Subscribers"]["s"]["Ready"] == [2]
    store.close()


def test_a_publish_waits_for_no_acks_when_its_subscriber_has_room_or_more_than_a_batch_ready(tmp_path, monkeypatch):
    # Given a writer that would let ops wait a minute for company
    monkeypatch.setattr(writer_module, "ACK_GATHER_S", 60.0)
    broker, store = open_broker(tmp_path)
    # When a message is published while s has room in its Window (99 of 100 in flight)
    broker.step([publish(*[b"%d" % i for i in range(99)])], {"s"}, time.time_ns())
    # Then it is answered at once
    assert asyncio.run(_published_through_a_writer(broker)) == 200
    # And so it is once s's Window is full and more than a batch (100) waits
    # ready for it: s is behind anyway, and a publisher is not held back by it
    broker.step([publish(*[b"%d" % i for i in range(102)])], {"s"}, time.time_ns())
    assert broker.state.subs["t"]["s"].inflight == 100 and broker.state.subs["t"]["s"].ready == [102]
    assert asyncio.run(_published_through_a_writer(broker)) == 200
    store.close()


def test_a_publish_waits_for_no_acks_of_a_pull_subscriber(tmp_path, monkeypatch):
    # Given Pull subscriber w, whose workers took its whole Window, and a writer
    # that would let ops wait a minute for company
    monkeypatch.setattr(writer_module, "ACK_GATHER_S", 60.0)
    broker, store = open_pull_broker(tmp_path, window=2)
    publish_to(broker, 2)
    assert len(take(broker, 1, 2)) == 2
    # When a message is published, then it is answered at once: a worker's acks
    # come with its next TAKE, whenever it likes
    assert asyncio.run(_published_through_a_writer(broker)) == 200
    store.close()


async def _published_through_a_writer(broker: Broker) -> int:
    """The status of a publish through an idle writer without Sync (a test's
    timeout, not ACK_GATHER_S, if it waits for company)."""
    writer = GroupCommit(broker, durable=False)
    task = asyncio.create_task(writer.run())
    await asyncio.sleep(0.05)
    reply = await asyncio.wait_for(writer.call(publish(b"x")), timeout=10)
    writer.stop()
    await task
    return reply.status


def _a_full_window_in_flight(tmp_path, monkeypatch, gather_s: float) -> tuple[Broker, Store, p.Request]:
    """A broker with s's whole Window (100) in flight and nothing ready, the
    one-way acks of that batch, and ops waiting up to `gather_s` for company."""
    broker, store = open_broker(tmp_path)
    [batch] = broker.step([publish(*[b"%d" % i for i in range(100)])], {"s"}, time.time_ns()).deliveries
    assert broker.state.subs["t"]["s"].inflight == 100 and not broker.has_backlog("s")
    monkeypatch.setattr(writer_module, "ACK_GATHER_S", gather_s)
    keys = [m["Key"] for m in msgspec.json.decode(batch.frame)["Messages"]]
    return broker, store, p.Request(topic="t", subscriber="s", acks=keys)


class _Recording:
    """A subscriber that notes each batch it is given and is ready again at once."""

    def __init__(self, pushed: list[Delivery]) -> None:
        self.pushed = pushed

    def push(self, delivery: Delivery) -> None:
        self.pushed.append(delivery)


@pytest.mark.parametrize("ready", [0, 50])
def test_a_publish_waits_for_the_acks_of_every_subscriber_it_waits_for(tmp_path, monkeypatch, ready):
    # Given s and r each with a whole Window in flight and `ready` more ready (an
    # ack of a subscriber with messages ready waits too, once a publish waits for
    # it), and a writer without Sync that lets ops wait a minute for company
    config = two_subscribers(tmp_path)
    store = Store(str(tmp_path), sync=False, max_bytes=1 << 24)
    broker = Broker(config, store, time.time_ns())
    batches = broker.step([publish(*[b"%d" % i for i in range(100)])], {"s", "r"}, time.time_ns()).deliveries
    broker.step([publish(*[b"%d" % i for i in range(ready)])] if ready else [], set(), time.time_ns())
    acks = {
        d.subscriber: p.Request(topic="t", subscriber=d.subscriber, acks=[m["Key"] for m in msgspec.json.decode(d.frame)["Messages"]])
        for d in batches
    }
    monkeypatch.setattr(writer_module, "ACK_GATHER_S", 60.0)
    steps: list[float] = []

    async def run() -> list[bool]:
        writer = GroupCommit(broker, durable=False, on_step=steps.append)
        task = asyncio.create_task(writer.run())
        await _until(lambda: _waits(writer))  # idle
        replied = asyncio.get_running_loop().create_future()
        # When a message is published, and s acks
        writer.submit(publish(b"1"), replied.set_result)
        writer.submit(acks["s"])
        # Then the publish still waits, for r: the writer, not woken, gathers company for it
        gathering = writer._gather_until is not None and _waits(writer)
        await asyncio.sleep(0)
        waited = gathering and not replied.done() and not steps
        # Until r acks too: one step for all three
        writer.submit(acks["r"])
        await asyncio.wait_for(replied, timeout=10)
        writer.stop()
        await task
        return [waited, len(steps) == 1]

    assert asyncio.run(run()) == [True, True]
    # (both batches acked; the new message waits ready for each, since neither is open here)
    assert [(broker.state.subs["t"][s].inflight, broker.state.subs["t"][s].ready) for s in ("s", "r")] == [(0, [ready + 1])] * 2
    store.close()


def _batches_by_the_rule(pending: list[tuple[p.Request, str]], max_ops: int, max_messages: int, chunk: int) -> list[list[p.Request]]:
    """The steps' ops as _take_batch's docstring says, one op at a time: up to
    max_ops ops and max_messages messages (a large publish counting one chunk),
    a connection's ops after its large publish left for a later step (none is
    staged here: each step answers)."""
    batches = []
    while pending:
        batch: list[tuple[p.Request, str]] = []
        kept, messages, waiting = [], 0, set()
        for i, (op, sink) in enumerate(pending):
            if len(batch) >= max_ops or (batch and messages >= max_messages):
                kept += pending[i:]
                break
            if sink in waiting:
                kept.append((op, sink))
                continue
            batch.append((op, sink))
            n = len(op.messages or ())
            messages += min(n, chunk)
            if n > chunk:
                waiting.add(sink)
        batches.append([op for op, _ in batch])
        pending = kept
    return batches


def _queues() -> list[list[tuple[int, str]]]:
    """Queues of (messages, connection) to take steps from: at the limits, then at random."""
    at_limits = [[(n, "a"), (m, "b"), (0, "a")] for n in range(8) for m in range(4)]
    at_limits += [[(n, "a"), (0, "a"), (0, "b")] for n in range(4, 9)]  # up to a publish of a chunk, and over
    at_limits += [[(0, "a"), (0, "b")] * 2, [(0, "a"), (0, "b")] * 2 + [(0, "a")]]  # as many ops as a step takes, and one more
    rng = random.Random(7)
    return at_limits + [[(rng.choice([0, 0, 1, 2, 3, 5, 7]), rng.choice("ab")) for _ in range(rng.randrange(1, 9))] for _ in range(60)]


@pytest.mark.parametrize("max_messages, chunk", [(5, 5), (8, 5), (5, 6)])
@pytest.mark.parametrize("queued", _queues())
def test_the_steps_take_what_is_queued_as_the_rule_says_whether_all_of_it_fits_or_not(queued, max_messages, chunk, monkeypatch):
    # Given small limits, and ops of two connections
    monkeypatch.setattr(writer_module, "MAX_OPS_PER_STEP", 4)
    monkeypatch.setattr(writer_module, "MAX_MESSAGES_PER_STEP", max_messages)
    monkeypatch.setattr(staging, "CHUNK_MESSAGES", chunk)
    sinks = {"a": lambda reply: None, "b": lambda reply: None}
    pending = [
        (p.Request(topic="t", messages=[p.Message(payload=msgspec.Raw(b"1"))] * n if n else None, acks=None if n else ["1"]), name)
        for n, name in queued
    ]
    writer = GroupCommit(None)  # type: ignore[arg-type]  # no step runs: only what each would take
    # When they are queued while a step runs, and each step takes its batch
    for op, name in pending:
        writer.submit(op, sinks[name])
    taken = []
    while writer._pending:
        taken.append([op for op, _ in writer._take_batch()])
    # Then each step took what the rule says
    assert taken == _batches_by_the_rule(pending, 4, max_messages, chunk)


def test_a_gathering_that_ends_within_the_loops_millisecond_is_not_waited_for_turn_by_turn(tmp_path, monkeypatch):
    # Given uvloop, whose clock and timers count whole milliseconds, and one-way acks
    # whose gathering ends a nanosecond after they begin, inside the loop's current millisecond
    uvloop = pytest.importorskip("uvloop")
    broker, store, acks = _acks_of_a_batch_in_flight(tmp_path, monkeypatch, gather_s=1e-9)
    waits: list[float] = []

    async def run() -> None:
        writer = GroupCommit(broker, durable=False, on_step=lambda _: None)
        sleep = writer._sleep

        def counted(timeout_s: float) -> asyncio.Future[None]:
            waits.append(timeout_s)
            return sleep(timeout_s)

        writer._sleep = counted  # type: ignore[method-assign]
        task = asyncio.create_task(writer.run())
        await _until(lambda: _waits(writer))
        # When they are submitted, twenty times over
        for _ in range(20):
            before = len(waits)
            writer.submit(acks)
            await _until(lambda before=before: _waits(writer) and len(waits) > before)
        writer.stop()
        await task

    uvloop.run(run())
    # Then each gathering ends at once: no wait shorter than the loop's tick,
    # which would fire at the next turn of a clock that has not moved, again and again
    assert min(waits) >= writer_module.LOOP_TICK_S
    assert len(waits) <= 1 + 20 * 2
    store.close()
