"""Tasks that wait for the next time something happens: an asyncio.Event's
wait(), without an Event.

What is waited for here (a reply of a connection, a step of the writer)
happens thousands of times a second, and nobody waits for it almost always.
An asyncio.Event costs its Python `set` call every time, and one that must
be cleared or made anew for the next wait costs more. `futures` is empty
while nobody waits: a caller on a hot path tests it before calling `wake`.
"""

from __future__ import annotations

import asyncio
import contextlib


class Waiters:
    """The futures of the tasks waiting for the next `wake`."""

    __slots__ = ("futures",)

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[None]] = []

    async def wait(self) -> None:
        """Return at the next `wake` after this call."""
        future = asyncio.get_running_loop().create_future()
        self.futures.append(future)
        try:
            await future
        finally:  # cancelled: its future must not stay listed
            with contextlib.suppress(ValueError):
                self.futures.remove(future)

    def wake(self) -> None:
        """Every task waiting now returns."""
        if self.futures:
            futures, self.futures = self.futures, []
            for future in futures:
                if not future.done():
                    future.set_result(None)
