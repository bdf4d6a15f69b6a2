"""Room for sends, reserved before deliveries are claimed: the engine's backpressure on the sender.

The sender refuses a send past `sends_pending_max` (SenderOverloadedError), and a refusal after a
claim strands the batch: its deliveries stay leased until the lease expires, and the sends
already submitted go out again on the retry. So the engine takes room for a whole batch here
before it claims, and waits while there is none; nothing is leased while it waits.

Waiters are served first come, first served, so a batch that needs much room is not passed over
for ever by smaller ones. A waiter cancelled (a job stopped at shutdown) leaves the line and
holds nothing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib


class SendBudget:
    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError("a send budget needs room for at least one send")
        self.total = total
        self._free = total
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @property
    def free(self) -> int:
        return self._free

    async def take(self, count: int) -> int:
        """Wait until `count` sends fit, then hold them; returns count (give it back with give)."""
        if not 0 <= count <= self.total:
            raise ValueError(f"cannot hold {count} sends in a budget of {self.total}")
        if not self._waiters and count <= self._free:
            self._free -= count
            return count
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((count, waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give(count)  # granted in the same turn as the cancel: hand the room on
            else:
                with contextlib.suppress(ValueError):  # _serve may have dropped it already
                    self._waiters.remove((count, waiter))
                self._serve()  # a large request at the head may have held back smaller ones
            raise
        return count

    def give(self, count: int) -> None:
        """Hand back room taken earlier (all of it, or the part a claim did not use)."""
        if count < 0 or self._free + count > self.total:
            raise ValueError(f"cannot give back {count} sends: {self._free} of {self.total} are free")
        self._free += count
        self._serve()

    def _serve(self) -> None:
        while self._waiters and (self._waiters[0][1].done() or self._waiters[0][0] <= self._free):
            count, waiter = self._waiters.popleft()
            if waiter.done():
                continue  # cancelled, its task not yet resumed: it holds nothing
            self._free -= count
            waiter.set_result(None)
