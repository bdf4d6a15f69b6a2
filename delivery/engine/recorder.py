"""Record each send's result as soon as it lands; results that land together share one fenced write.

A claim's sends end at different times: a receiver that answers in 2 ms and one that times out
after 15 s may share a batch. Each result is handed to the Recorder the moment its answer (or
error) is in. A write takes every result waiting (at most results.RESULT_BATCH_MAX), and while
it runs the next results gather for the write after it (a small group waits LINGER_SECONDS for
more); WRITES_MAX writes run at once. So a result waits a few milliseconds, never for the
slowest send of its batch, and a worker that dies
or loses PostgreSQL loses at most the results of the last few milliseconds, not a whole batch.

A write that fails because PostgreSQL is unavailable (restarting, its connections cut) is tried
again, after RETRY_SECONDS_MIN growing to RETRY_SECONDS_MAX, for as long as the lease of a
result's delivery lasts: results.record_results is fenced by attempt, so a write run twice (say
its COMMIT went through but the answer was lost) changes nothing the first did not. A result
whose lease ended unwritten is dropped with one line: the sweep expires the lease and the
delivery is tried again, as when a worker dies. An outage is logged once when it begins and once
when writes go through again. Any other error (a bug) drops the write's results with its
traceback; their leases expire too.

After each write the engine's `after_write` runs (metrics, endpoints that answered 410 or keep
failing, wake-ups for retries), then each result's Batch learns its outcome. The job that
claimed a batch waits for `Batch.done`: its send budget and its arq job are held until the last
of its results is written. A job cancelled at shutdown leaves its results here; `close` writes
what is held before the worker exits.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import NamedTuple

import asyncpg

from delivery.engine.results import RESULT_BATCH_MAX, AttemptResult, RecordSummary, record_results
from delivery.store import connection_loss

logger = logging.getLogger(__name__)

WRITES_MAX = 2  # writes in flight at once: one gathers results while the other waits on PostgreSQL
# A write of fewer than GROUP_EAGER results first waits LINGER_SECONDS for more to land: at a few
# thousand results a second, a write per result or two cost PostgreSQL half again as much CPU per
# delivery as the batched write did; a few milliseconds of gathering make the groups tens.
GROUP_EAGER = 100
LINGER_SECONDS = 0.005
RETRY_SECONDS_MIN = 0.05
RETRY_SECONDS_MAX = 1.0
CLOSE_SECONDS_MAX = 10.0  # how long close() may take to write what is held (the exit deadline is longer)
_OUTCOMES = ("delivered", "retrying", "settled", "stale", "reclaimed", "released")


def database_lost(error: BaseException) -> bool:
    """Whether a write failed because PostgreSQL went away, not because of what it wrote.

    connection_loss.lost_database, and asyncpg's own errors on a connection that broke under it:
    InterfaceError ("connection is closed", a transaction ended by the loss) and
    InternalClientError (the protocol's state after a read was cut off mid-answer)."""
    return connection_loss.lost_database(error) or isinstance(
        error, (asyncpg.InterfaceError, asyncpg.InternalClientError))


class Batch:
    """The results of one claim: `done` resolves once every one of them is written or given up."""

    __slots__ = ("left", "sent", "summary", "done")

    def __init__(self, count: int) -> None:
        self.left = count
        self.sent = 0  # results written that were sent (not claims given back)
        self.summary = RecordSummary()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if count == 0:
            self.done.set_result(None)

    def landed(self) -> None:
        """One result is written, or will never be (its lease ended, or its send was cancelled)."""
        self.left -= 1
        if self.left == 0 and not self.done.done():  # done already: the waiting job was cancelled
            self.done.set_result(None)


class Pending(NamedTuple):
    """A result waiting for its write (a NamedTuple: one per send on the hot path)."""

    result: AttemptResult
    batch: Batch
    endpoint_id: uuid.UUID
    gone: bool  # the endpoint answered 410
    lease_ends_at: float  # time.monotonic() when the delivery's lease ends: the last moment to write it


# After a write, on the writer's connection: a writer uses no other, so a small pool cannot deadlock.
AfterWrite = Callable[[list[Pending], RecordSummary, asyncpg.Connection], Awaitable[None]]


class Recorder:
    def __init__(self, pool: asyncpg.Pool, after_write: AfterWrite, *, writes_max: int = WRITES_MAX,
                 record: Callable[..., Awaitable[RecordSummary]] = record_results) -> None:
        if not 1 <= writes_max <= 16:
            raise ValueError("writes_max must be 1..16")
        self._pool = pool
        self._after_write = after_write
        # A writer holds a connection while results keep coming: leave one for the claims.
        self._writes_max = max(1, min(writes_max, pool.get_max_size() - 1))
        self._record = record
        self._waiting: collections.deque[Pending] = collections.deque()
        self._writers: set[asyncio.Task] = set()
        self._unavailable_since: float | None = None
        self._in_writes = 0  # results taken by a write that has not ended
        self.written = 0
        self.dropped = 0

    @property
    def held(self) -> int:
        """Results waiting for a write or in one."""
        return len(self._waiting) + self._in_writes

    def add(self, pending: Pending) -> None:
        self._waiting.append(pending)
        if len(self._writers) < self._writes_max:
            writer = asyncio.get_running_loop().create_task(self._write_while_waiting())
            self._writers.add(writer)
            writer.add_done_callback(self._writers.discard)

    async def close(self, seconds_max: float = CLOSE_SECONDS_MAX) -> None:
        """Write what is held (within seconds_max and the leases), then stop."""
        deadline = time.monotonic() + seconds_max
        while self._writers and time.monotonic() < deadline:
            await asyncio.wait(set(self._writers), timeout=max(0.0, deadline - time.monotonic()))
        if self._writers or self._waiting:
            logger.warning("stopping with %d results unwritten; their leases expire and they are tried again",
                           self.held)
            for writer in list(self._writers):
                writer.cancel()
            await asyncio.gather(*self._writers, return_exceptions=True)
            self._give_up(list(self._waiting))
            self._waiting.clear()

    async def _write_while_waiting(self) -> None:
        """Write groups of waiting results on one connection, held while results keep coming (a
        connection given back to the pool costs a reset, one more round trip, each time)."""
        delay = RETRY_SECONDS_MIN
        group: list[Pending] = []
        try:
            while group or self._waiting:
                try:
                    async with self._pool.acquire() as connection:
                        while group or self._waiting:
                            if not group:
                                if len(self._waiting) < GROUP_EAGER:
                                    await asyncio.sleep(LINGER_SECONDS)
                                group = self._take()
                                if not group:  # the other writer took them meanwhile
                                    continue
                                self._in_writes += len(group)
                            summary = await self._record(self._pool, [pending.result for pending in group],
                                                         connection=connection)
                            self._in_writes -= len(group)
                            written, group, delay = group, [], RETRY_SECONDS_MIN
                            await self._written(written, summary, connection)
                except Exception as error:  # noqa: BLE001 - sorted here: a lost database is retried
                    lost = database_lost(error)
                    if lost:
                        kept = self._within_leases(group, error)
                    else:
                        logger.exception("could not record %d results; their leases expire and they are tried again",
                                         len(group))
                        self._give_up(group)
                        kept = []
                    self._in_writes -= len(group) - len(kept)
                    group = kept
                    if lost:  # on a new connection, after a pause
                        await asyncio.sleep(delay)
                        delay = min(2 * delay, RETRY_SECONDS_MAX)
        except asyncio.CancelledError:
            self._in_writes -= len(group)
            self._give_up(group)
            raise

    async def _written(self, group: list[Pending], summary: RecordSummary, connection: asyncpg.Connection) -> None:
        if self._unavailable_since is not None:
            logger.warning("recording results again: PostgreSQL answers after %.1f s",
                           time.monotonic() - self._unavailable_since)
            self._unavailable_since = None
        self.written += len(group)
        try:
            await self._after_write(group, summary, connection)
        except Exception as error:  # noqa: BLE001 - the results are written; what follows is a hint
            if database_lost(error):
                logger.warning("after recording %d results: PostgreSQL is unavailable (%r)", len(group), error)
            else:
                logger.exception("after recording %d results", len(group))
        self._distribute(group, summary)

    def _take(self) -> list[Pending]:
        """Up to RESULT_BATCH_MAX waiting results, one per delivery (a second result of a delivery
        already taken, a later attempt's, waits for the next write)."""
        group: list[Pending] = []
        taken: set[uuid.UUID] = set()
        skipped: list[Pending] = []
        waiting = self._waiting
        while waiting and len(group) < RESULT_BATCH_MAX:
            pending = waiting.popleft()
            delivery_id = pending.result.delivery_id
            if delivery_id in taken:
                skipped.append(pending)
                continue
            taken.add(delivery_id)
            group.append(pending)
        waiting.extendleft(reversed(skipped))
        return group

    def _within_leases(self, group: list[Pending], error: BaseException) -> list[Pending]:
        """The results still worth writing after a failed write; the rest are given up, in one line."""
        now = time.monotonic()
        if self._unavailable_since is None:
            self._unavailable_since = now
            logger.warning("recording results: PostgreSQL is unavailable (%r); trying again until their leases end",
                           error)
        kept = [pending for pending in group if pending.lease_ends_at > now]
        if len(kept) < len(group):
            self._give_up([pending for pending in group if pending.lease_ends_at <= now])
            logger.warning("%d results were not recorded within their leases; they are tried again",
                           len(group) - len(kept))
        return kept

    def _give_up(self, group: list[Pending]) -> None:
        self.dropped += len(group)
        for pending in group:
            pending.batch.landed()

    @staticmethod
    def _distribute(group: list[Pending], summary: RecordSummary) -> None:
        """Each result's outcome to its batch's summary, then the batch learns it landed."""
        if len(group) == 1:
            pending = group[0]
            for outcome in _OUTCOMES:
                if getattr(summary, outcome):
                    getattr(pending.batch.summary, outcome).extend(getattr(summary, outcome))
        else:
            batch_of = {pending.result.delivery_id: pending.batch for pending in group}
            for outcome in _OUTCOMES:
                for delivery_id in getattr(summary, outcome):
                    getattr(batch_of[delivery_id].summary, outcome).append(delivery_id)
        for pending in group:
            if not pending.result.released:
                pending.batch.sent += 1
            pending.batch.landed()
