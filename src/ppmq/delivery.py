"""One task per subscriber: connect to its socket, push batches, read acks back.

PROTOCOL §3 Connections: while the socket is missing or refuses, retry with
exponential backoff from 100 ms capped at RetryMax (with jitter, so that many
subscribers coming back at once do not retry in step), logging only when the
state changes. A batch not written whole goes back to ready; a batch written
stays in flight when the connection breaks later. A slow subscriber only ever
holds its own task and its own window.
"""

from __future__ import annotations

import asyncio
import logging
import random

from .broker import Delivery, Returned, Written
from .config import SubscriberConfig
from .server import ReplyChannel, serve_requests
from .writer import Writer

log = logging.getLogger(__name__)

FIRST_RETRY_S = 0.1


class SubscriberLink:
    """The broker's side of one subscriber's socket."""

    def __init__(self, config: SubscriberConfig, writer: Writer, retry_max_s: float, max_frame_bytes: int) -> None:
        self.config = config
        self.name = config.name
        self.writer = writer
        self.retry_max_s = retry_max_s
        self.max_frame_bytes = max_frame_bytes
        self._queue: asyncio.Queue[Delivery] = asyncio.Queue()
        self.connected = False

    def push(self, delivery: Delivery) -> None:
        """Called by the writer with a committed batch."""
        self._queue.put_nowait(delivery)

    async def run(self) -> None:
        delay = FIRST_RETRY_S
        last_error = None
        while True:
            try:
                reader, out = await asyncio.open_unix_connection(self.config.socket)
            except OSError as exc:
                error = f"{type(exc).__name__}: {exc.strerror or exc}"
                if error != last_error:
                    log.warning("subscriber %s: cannot connect to %s (%s); retrying", self.name, self.config.socket, error)
                    last_error = error
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self.retry_max_s)
                continue
            log.info("subscriber %s: connected to %s", self.name, self.config.socket)
            delay, last_error = FIRST_RETRY_S, None
            self.connected = True
            try:
                await self._serve(reader, out)
            finally:
                self.connected = False
                out.close()
            log.info("subscriber %s: connection lost", self.name)

    async def _serve(self, reader: asyncio.StreamReader, out: asyncio.StreamWriter) -> None:
        """Push batches until the subscriber closes; acks it sends back are served too."""
        channel = ReplyChannel(out, f"subscriber {self.name}")
        acks = asyncio.create_task(serve_requests(reader, channel, self.writer, self.max_frame_bytes))
        self.writer.open(self.name, self)
        batch: asyncio.Task | None = None
        try:
            while not acks.done():
                batch = asyncio.create_task(self._queue.get())
                await asyncio.wait({batch, acks}, return_when=asyncio.FIRST_COMPLETED)
                if not batch.done():
                    break
                if not await self._write(out, batch.result()):
                    break
                if self._queue.empty():
                    self.writer.open(self.name, self)
        finally:
            if batch is not None and not batch.done():
                batch.cancel()
            self.writer.close(self.name)
            self._return_queued()
            acks.cancel()

    async def _write(self, out: asyncio.StreamWriter, delivery: Delivery) -> bool:
        try:
            out.write(delivery.frame)
            await out.drain()
        except (ConnectionError, OSError) as exc:
            log.info("subscriber %s: write failed (%s); batch goes back to ready", self.name, exc)
            self.writer.submit(Returned(self.name, delivery.topic, delivery.msgs))
            return False
        except asyncio.CancelledError:
            self.writer.submit(Returned(self.name, delivery.topic, delivery.msgs))
            raise
        if delivery.auto_ack:
            self.writer.submit(Written(self.name, delivery.topic, delivery.msgs))
        return True

    def _return_queued(self) -> None:
        while not self._queue.empty():
            d = self._queue.get_nowait()
            self.writer.submit(Returned(self.name, d.topic, d.msgs))
