"""The writer, driven on a real store without sockets."""

from __future__ import annotations

import asyncio
import time

import msgspec

from ppmq import protocol as p
from ppmq import writer as writer_module
from ppmq.ops import Delivery
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
