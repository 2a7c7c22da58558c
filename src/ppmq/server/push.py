"""One task per subscriber: connect to its socket, push batches, read acks back.

The broker connects only while it holds something for the subscriber (ready,
or in flight and unacknowledged), so that a socket-activated subscriber that
exits when idle is started again by systemd only when there is work for it.

PROTOCOL §3 Connections: while the socket is missing or refuses, retry with
exponential backoff from 100 ms capped at RetryMax (with jitter, so that many
subscribers coming back at once do not retry in step), logging only when the
state changes; a subscriber that accepts and drops every connection is backed
off the same way. A batch not written whole goes back to ready; a batch written
stays in flight when the connection breaks later. Written means handed to the
kernel in full: bytes still in the broker's own buffer die with the connection
or the process, so a batch counts as written only once that buffer is empty.
A slow subscriber only ever holds its own task and its own window. With
CheckOwner, a socket owned by someone else (see access) is refused like a
missing one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections import deque
from typing import Protocol

from ppmq.config import SubscriberConfig
from ppmq.core.access import Peer, Policy
from ppmq.core.ops import Delivery, Unwritten, Written
from ppmq.server.connection import Connection, ReplyChannel
from ppmq.server.group_commit import Outlet
from ppmq.server.requests import Requests, Writer
from ppmq.sockets import peer_credentials

log = logging.getLogger("ppmq.delivery")

FIRST_RETRY_S = 0.1
STABLE_S = 1.0  # a connection that lasted this long resets the backoff


class LinkWriter(Writer, Protocol):
    """The writer as a subscriber's link sees it: GroupCommit, or for one lane
    of a subscriber with Connections > 1, that lane's feed (parallel_push.py)."""

    async def wanted(self, subscriber: str) -> None:
        """Return once there is something for subscriber."""
        ...

    def open(self, subscriber: str, outlet: Outlet) -> None:
        """The link is idle: it may be given a batch."""
        ...

    def close(self, subscriber: str) -> None:
        """The link can take no batch."""
        ...


class SubscriberLink:
    """The broker's side of one subscriber's socket."""

    def __init__(
        self,
        config: SubscriberConfig,
        writer: LinkWriter,
        retry_max_s: float,
        max_frame_bytes: int,
        *,
        read_timeout_s: float = 0.0,
        policy: Policy | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.writer = writer
        self.retry_max_s = retry_max_s
        self.max_frame_bytes = max_frame_bytes
        self.read_timeout_s = read_timeout_s
        self.policy = policy
        self._batches: deque[Delivery] = deque()  # committed, not yet written
        self._sending: Delivery | None = None  # written in part by push: _serve waits for the rest
        self._out: Connection | None = None  # the connection, while _serve serves it
        # _serve waits on it for a batch or the end of acks; None again once woken
        self._waiter: asyncio.Future[None] | None = None
        self.connected = False

    @property
    def serving(self) -> bool:
        """A connection is up and batches pushed now go out on it."""
        return self._out is not None

    def follow(self, config: SubscriberConfig, retry_max_s: float, max_frame_bytes: int, read_timeout_s: float) -> None:
        """A reload's new settings; the connection, if any, stays."""
        self.config, self.retry_max_s, self.max_frame_bytes, self.read_timeout_s = config, retry_max_s, max_frame_bytes, read_timeout_s

    def push(self, delivery: Delivery) -> bool:
        """Called by the writer with a batch of a step, just before its commit;
        True if the link may be given another batch at once.

        A connection with nothing queued or unsent takes it at once: a batch
        the kernel takes whole is written without waking the delivery task,
        whose wake-up would cost the event loop more than the write does. The
        task waits only for what the kernel did not take, as for any batch.
        """
        out = self._out
        # Queued unless idle: the delivery task waits for a batch, and none is
        # queued or in the buffer. Tested in the `if` itself, so that the type
        # checker knows in the `else` that there is a connection.
        if out is None or self._waiter is None or self._batches or self._sending is not None or out.unsent() or out.is_closing():
            self._batches.append(delivery)
        else:
            out.write(delivery.frame)
            if not out.unsent() and not out.is_closing():
                if delivery.auto_ack:
                    self._written(delivery)
                return True
            self._sending = delivery
        self._wake()
        return False

    def stopping(self) -> None:
        """Its task is about to be cancelled: a batch pushed from now on is queued,
        not written, and given back as the task ends, as before it connected."""
        self._waiter = None

    def _wake(self, *_: object) -> None:
        """End the delivery task's wait, if it waits and nobody ended it yet."""
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():  # cancelled: the task is being cancelled
                waiter.set_result(None)

    async def run(self) -> None:
        delay = FIRST_RETRY_S
        last_error = None
        while True:
            await self.writer.wanted(self.name)
            try:
                out, peer = await self._connect()
            except OSError as exc:
                error = f"{type(exc).__name__}: {exc.strerror or exc}"
                if error != last_error:
                    log.warning("subscriber %s: cannot connect to %s (%s); retrying", self.name, self.config.socket, error)
                    last_error = error
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self.retry_max_s)
                continue
            if last_error is not None or delay == FIRST_RETRY_S:
                log.info("subscriber %s: connected to %s", self.name, self.config.socket)
            last_error = None
            started = time.monotonic()
            self.connected = True
            try:
                await self._serve(out, peer)
            finally:
                self.connected = False
                out.close()
            if time.monotonic() - started >= STABLE_S:
                log.info("subscriber %s: connection lost", self.name)
                delay = FIRST_RETRY_S
            else:  # dropped at once: do not hammer it
                if delay == FIRST_RETRY_S:
                    log.warning("subscriber %s: connection dropped at once; backing off", self.name)
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, self.retry_max_s)

    async def _connect(self) -> tuple[Connection, Peer]:
        """Connect; with CheckOwner, only to a socket of an allowed owner. A batch
        counts as written only once the kernel has all of it, so the connection's
        drain() waits for an empty buffer (Connection.flush_before_drain): acks
        read on it do not wait for that, as their reply channel waits only while
        more than MAX_UNSENT_BYTES are unsent (connection.ReplyChannel)."""
        path = self.config.socket
        assert path is not None, "a subscriber that is pushed to has a Socket (config._check_delivery)"
        check = self.policy.check_owner if self.policy is not None and self.config.owner_checked else None
        if check is not None:
            check(self.config, os.stat(path).st_uid, "the socket's owner")
        _, out = await asyncio.get_running_loop().create_unix_connection(Connection, path)
        out.flush_before_drain()
        peer = Peer(*peer_credentials(out.get_extra_info("socket")))
        if check is not None:
            try:  # the listener itself: a path swapped after the stat is caught here
                check(self.config, peer.uid, "the listening process")
            except OSError:
                out.close()
                raise
        return out, peer

    async def _serve(self, out: Connection, peer: Peer) -> None:
        """Push batches until the subscriber closes; acks it sends back are served too."""
        channel = ReplyChannel(out, f"subscriber {self.name} ({peer})")
        authorize = self.policy.guard(peer, channel.peer, own=self.name) if self.policy is not None else None
        acks = asyncio.create_task(Requests(out, channel, self.writer, self.max_frame_bytes, None, self.read_timeout_s, authorize).serve())
        acks.add_done_callback(self._wake)
        self._out = out
        self.writer.open(self.name, self)
        try:
            while not acks.done():
                if self._sending is not None:
                    delivery, self._sending = self._sending, None
                    written = await self._write(out, delivery, started=True)
                elif self._batches:
                    written = await self._write(out, self._batches.popleft())
                else:
                    await self._next_batch()
                    continue
                if not written:
                    break
                if not self._batches:
                    self.writer.open(self.name, self)
        finally:
            self._out = None
            self.writer.close(self.name)
            self._give_back_queued()
            acks.cancel()

    async def _next_batch(self) -> None:
        """Until a batch is pushed or the subscriber's side of the connection ends.
        A bare future that push() resolves: a task and asyncio.wait for every
        batch would cost the event loop more than writing the batch does."""
        self._waiter = waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    async def _write(self, out: Connection, delivery: Delivery, started: bool = False) -> bool:
        """Write one batch (`started`: push wrote it, in part) and wait until the
        kernel has all of it (see _connect): only then may it count
        as written, and only then does the next batch go into the buffer. Cut
        off by a broken connection or by shutdown, it goes back to ready and is
        not counted as delivered."""
        try:
            if not started:
                out.write(delivery.frame)
            await out.drain()
        except (ConnectionError, OSError) as exc:
            log.info("subscriber %s: write failed (%s); batch goes back to ready", self.name, exc)
            self._give_back(delivery)
            return False
        except asyncio.CancelledError:
            self._give_back(delivery)
            raise
        self._written(delivery)
        return True

    def _written(self, delivery: Delivery) -> None:
        """The kernel has all of the batch: it is delivered (and, with AckRequired
        false, acknowledged by that alone)."""
        if delivery.auto_ack:
            self.writer.submit(Written(self.name, delivery.topic, delivery.msgs))

    def _give_back_queued(self) -> None:
        if self._sending is not None:  # not written whole
            self._give_back(self._sending)
            self._sending = None
        while self._batches:
            self._give_back(self._batches.popleft())

    def _give_back(self, delivery: Delivery) -> None:
        self.writer.submit(Unwritten(self.name, delivery.topic, delivery.msgs))
