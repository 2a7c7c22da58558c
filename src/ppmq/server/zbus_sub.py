"""zbus `sub` (PROTOCOL §11): one WebSocket connection's subscription to a
channel, served as pushed messages while it has window credit.

A `sub` gives the subscription `window` credit: a task takes up to that many
messages from the channel (the mq's Pull subscriber) through `TakeWaits`,
exactly as a ServerSocket connection's TAKE does, and pushes each as
`{"headers": {"mq", "channel", "id": KEY, "window": CREDIT_LEFT}, "body": PAYLOAD}`.
Each push spends one credit; a later `sub` for the same mq and channel (zbus
clients send one when half their window is spent) sets the credit anew.

Nothing is taken while nothing is ready: the task's TAKE waits as long as a
TAKE may (`MAX_WAIT_S`), on the event loop, and is sent again when that wait
runs out or a new `sub` interrupts it. The connection is the taker: when it
closes, the task is cancelled and `TakeWaits.gone` gives back what it holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import msgspec

from ppmq.protocol import messages as p
from ppmq.server.take_waits import TakeWaits, longest_take

log = logging.getLogger("ppmq.zbus")


class Taken(msgspec.Struct, rename="pascal"):
    """What a zbus message needs of a taken one."""

    key: str
    payload: msgspec.Raw


_taken = msgspec.json.Decoder(Taken)


def taken_of(reply: p.Reply) -> list[Taken]:
    """The messages a TAKE's reply carries."""
    return [_taken.decode(raw) for raw in reply.body["Messages"]]


class Subscription:
    """One connection's `sub` to one mq and channel: a task that pushes while
    there is credit. `push` writes one taken message with the credit left
    after it, and returns once it is written; a TAKE the broker refuses
    (access, a channel a reload took away) ends the subscription, logged."""

    def __init__(
        self,
        takes: TakeWaits,
        taker: int,
        mq: str,
        channel: str,
        check: Callable[[p.Request], None],
        push: Callable[[list[Taken], int], Awaitable[None]],
        where: str,
    ) -> None:
        self.takes = takes
        self.taker = taker
        self.mq = mq
        self.channel = channel
        self.check = check
        self.push = push
        self.where = where
        self.credit = 0
        self._task: asyncio.Task | None = None
        self._changed = asyncio.Event()  # the credit changed: the task looks again
        self._interrupt: asyncio.Future[bytes] | None = None  # ends the waiting TAKE

    def refresh(self, window: int) -> None:
        """A `sub`: from now on `window` messages may be pushed."""
        self.credit = window
        self._changed.set()
        if self._interrupt is not None and not self._interrupt.done():
            self._interrupt.set_result(b"")
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"{self.where} sub {self.mq}/{self.channel}")

    async def close(self) -> None:
        """The connection is done: stop taking (what it holds is given back by
        the connection's `TakeWaits.gone`, sent after this)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        try:
            while not self.takes.stopped:
                self._changed.clear()
                if self.credit <= 0:
                    await self._changed.wait()
                    continue
                reply = await self._take(self.credit)
                if reply.status != 200:
                    log.warning("%s: zbus sub to %s/%s refused (%d): %s", self.where, self.mq, self.channel, reply.status, reply.error)
                    return
                messages = taken_of(reply)
                if messages:
                    self.credit -= len(messages)
                    await self.push(messages, self.credit)
        except (ConnectionError, OSError) as exc:
            log.debug("%s: connection error while pushing: %s", self.where, exc)

    async def _take(self, count: int) -> p.Reply:
        self._interrupt = asyncio.get_running_loop().create_future()
        request = longest_take(self.mq, self.channel, count)
        return await self.takes.take(self.taker, request, self.check, self._interrupt)
