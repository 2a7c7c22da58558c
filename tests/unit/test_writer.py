"""The writer, driven on a real store without sockets."""

from __future__ import annotations

import asyncio

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
