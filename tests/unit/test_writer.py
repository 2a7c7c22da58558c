"""The writer, driven on a real store without sockets."""

from __future__ import annotations

import asyncio
import time

import msgspec

from ppmq import protocol as p
from ppmq import writer as writer_module
from ppmq.broker import Broker
from ppmq.ops import Delivery
from ppmq.store import Store
from ppmq.writer import Writer
from tests.unit.test_broker import STATUS, open_broker, publish


def test_a_caller_cancelled_before_its_reply_does_not_stop_the_writer(tmp_path):
    # Given a writer, and a caller waiting for a reply
    broker, store = open_broker(tmp_path)

    async def run() -> int:
        writer = Writer(broker)
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
        writer = Writer(broker)
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

    async def run() -> tuple[float, float, int]:
        writer = Writer(broker, on_step=steps.append)
        task = asyncio.create_task(writer.run())
        await asyncio.sleep(0.05)  # idle
        went_round = writer._heartbeat
        # When s acks its batch one-way
        writer.submit(acks)
        await asyncio.sleep(0.1)
        # Then the writer was not woken for it (it did not go round its loop)
        quiet = writer._heartbeat
        # And the acks are applied in the step of the publish that comes next
        await asyncio.wait_for(writer.call(publish(b"3")), timeout=10)
        in_flight = (await writer.call(STATUS)).body["Topics"]["t"]["Subscribers"]["s"]["InFlight"]
        writer.stop()
        await task
        return went_round, quiet, in_flight

    went_round, quiet, in_flight = asyncio.run(run())
    assert quiet == went_round
    assert in_flight == 0 and len(steps) == 2  # the publish with the acks, then STATUS
    store.close()


def test_one_way_acks_that_find_no_company_go_alone_when_the_gathering_ends(tmp_path, monkeypatch):
    # Given s with a batch in flight, a writer waiting idle, and acks that wait 0.2 s for company
    broker, store, acks = _acks_of_a_batch_in_flight(tmp_path, monkeypatch, gather_s=0.2)
    steps: list[float] = []

    async def run() -> float:
        writer = Writer(broker, on_step=lambda _: steps.append(time.monotonic()))
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
        writer = Writer(broker, lambda events: written.append(([e.event for e in events], writer.busy)))
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

    def __init__(self, writer: Writer, name: str) -> None:
        self.writer, self.name = writer, name

    def push(self, delivery: Delivery) -> None:
        self.writer.open(self.name, self)


def test_without_sync_a_steps_batch_leaves_before_its_commit_and_the_reply_after(tmp_path):
    # Given a writer without Sync, and subscriber s open for batches, whose outlet
    # notes whether the step was still under way, and the publisher answered
    broker, store = open_broker(tmp_path)
    seen: list[tuple[bool, bool]] = []

    async def run() -> None:
        writer = Writer(broker, durable=False)
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
