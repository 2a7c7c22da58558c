"""Waiters: tasks waiting for the next wake, as an asyncio.Event's wait()."""

from __future__ import annotations

import asyncio

from ppmq.server.waiters import Waiters


def test_a_wake_ends_every_wait_begun_before_it_and_none_begun_after():
    async def scenario() -> None:
        waiters = Waiters()
        early = [asyncio.create_task(waiters.wait()) for _ in range(3)]
        await asyncio.sleep(0)
        waiters.wake()
        late = asyncio.create_task(waiters.wait())
        await asyncio.sleep(0)
        assert all(task.done() for task in early)
        assert not late.done()
        waiters.wake()
        await asyncio.wait_for(late, 1)

    asyncio.run(scenario())


def test_a_cancelled_wait_leaves_nothing_behind_and_the_others_still_wake():
    async def scenario() -> None:
        waiters = Waiters()
        cancelled, kept = asyncio.create_task(waiters.wait()), asyncio.create_task(waiters.wait())
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.sleep(0)
        assert len(waiters.futures) == 1
        waiters.wake()
        await asyncio.wait_for(kept, 1)

    asyncio.run(scenario())
