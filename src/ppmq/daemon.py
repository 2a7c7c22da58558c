"""Composition root: wires config, store, broker, writer, server and subscriber links.

Nothing else builds these objects, and none of them is a global: a test can
run a whole broker in-process, and `ppmq serve` is this module plus a logger.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

from .broker import Broker
from .config import Config
from .delivery import SubscriberLink
from .journal import Journal
from .server import Server
from .store import Store
from .writer import Writer

log = logging.getLogger(__name__)

STOP_GRACE_S = 5.0  # how long open connections get to read their last replies


async def run(config: Config, stop: asyncio.Event | None = None) -> None:
    """Serve until `stop` is set or SIGTERM/SIGINT arrives, then shut down cleanly."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    store = Store(config.data_path, sync=config.sync, max_bytes=config.max_store_bytes)
    journal = None
    try:
        broker = Broker(config, store, time.time_ns())
        if config.journaled:
            jc = config.journal
            journal = Journal(os.path.join(config.data_path, "journal"), jc.segment_bytes, jc.max_bytes, jc.host).start()
        writer = Writer(broker, journal.put if journal else None)
        server = Server(config.server_socket, writer, config.max_frame_bytes)
        await server.start()
        links = [SubscriberLink(s, writer, config.retry_max, config.max_frame_bytes) for s in config.subscribers]
        writing = asyncio.create_task(writer.run(), name="writer")
        linking = [asyncio.create_task(link.run(), name=f"subscriber {link.name}") for link in links]
        log.info(
            "serving on %s: %d topics, %d subscribers, data in %s (sync %s)",
            config.server_socket, len(config.topics), len(config.subscribers), store.path, "on" if config.sync else "off",
        )
        await _until(stop, writing)
        log.info("stopping")
        await server.stop()
        for task in linking:
            task.cancel()
        await asyncio.gather(*linking, return_exceptions=True)
        writer.stop()
        await writing
        await server.close_connections(STOP_GRACE_S)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if journal is not None:
            journal.close()
        store.close()
    log.info("stopped")


async def _until(stop: asyncio.Event, writing: asyncio.Task) -> None:
    """Wait for a stop request; a writer that dies takes the broker down with it."""
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({stopping, writing}, return_when=asyncio.FIRST_COMPLETED)
    if writing.done():
        stopping.cancel()
        writing.result()  # raise what killed it
        raise RuntimeError("the writer stopped unexpectedly")
