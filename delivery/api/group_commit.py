"""Group commit: coalesce concurrent creates into few transactions (the ingest hot path).

One transaction per request serializes a hot account on its balance row and pays a commit per
message. Instead, while a create transaction is in flight, arriving requests wait in a queue;
the next transaction takes them all (at most `batch_max`) through
`billing.messages.create_messages`, which locks the accounts in id order (in its one write
statement, or in its locked fallback) and refuses each request on its own (one request's
insufficient balance fails that request alone). Each request
awaits its own future, and every future is resolved: a batch whose transaction fails (a database
error) fails exactly its own requests, with `BatchFailed`.

When a batch's write answers and no other batch is in flight, the next batch starts before that
batch's requests get their answers (`_send_next_early`): PostgreSQL writes the next batch while
this process answers the last, rather than the two taking turns.

Up to `concurrency` transactions run at once, but a batch beside a running one starts only when
the waiting requests are worth `parallel_waiting_min` deliveries (each weighs the deliveries per
message of the last batch that made any), or when the youngest running batch has run
`stall_seconds` (stuck on a row lock, a slow disk). One transaction at a time carries bigger
batches, and every statement has a fixed cost (about 370 µs of PostgreSQL's CPU: for one hot
account its CPU per message fell from 40 µs at batches of 35 to 32 at 140,
measured by batch size); two transactions on one hot account only wait on each other's row lock. Starting
the second at once makes batches half the size and ingest up to 7 points slower; at
fan-out 1 a threshold of 80 gained 3 to 6 points over 48, while fan-out 4, whose messages weigh
4 each, starts its second batch at 20 waiting requests (README, Performance).

With more than one shard (HOOKLEDGER_ACCOUNT_SHARDS: the partition count, or the Citus shard
count), a transaction carries the accounts of one shard only (billing.shards.shard_of), so that
a distributed engine runs it on that shard alone rather than as a transaction across nodes: the
waiting requests queue per shard, and each batch takes the requests of the shard whose oldest
request has waited longest. The concurrency bounds the transactions in flight as before.

A batch whose connection broke while its write or COMMIT was in flight may have been written. The batch
then asks the database (`billing.messages.resolve_outcome`): written, its requests get their
results as usual; not written, `BatchFailed`; no answer within `outcome_wait_seconds`,
`BatchOutcomeUnknown`. So `BatchFailed` always means nothing was written.

Idempotency keys: a key whose request is still in flight in this process answers 409
(`KeyInProgress`), as Stripe does. Across processes there is no shared in-flight set; there
the key's unique index fails the later unlocked write (it writes nothing), the account row lock
serializes the locked retry behind the first, and that finds the first one's message and
returns it as a replay (or a 422 for another body), which is also correct.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg

from billing.errors import BillingError
from billing.messages import (
    OUTCOME_WAIT_SECONDS,
    CreateOutcomeUnknown,
    MessageCreated,
    MessageRequest,
    create_messages,
    resolve_outcome,
)
from billing.shards import shard_of
from delivery import event_loop, metrics, tracing

logger = logging.getLogger(__name__)

WAKE_IDS_PENDING_MAX = 100_000  # delivery ids waiting for a wake-up; past this they are left to the sweeper
WAKE_INTERVAL_SECONDS = 0.01  # at most ~100 wake-up calls a second; each carries every id that waited
WAKE_RETRY_SECONDS = 1.0  # between wake-up calls while they fail (Redis down)
BATCH_MAX = 500  # requests in one transaction at most (of BATCH_MAX_LIMIT)
BATCH_MAX_LIMIT = 1000
CONCURRENCY = 2  # transactions in flight at once at most (of CONCURRENCY_LIMIT)
CONCURRENCY_LIMIT = 32
QUEUE_MAX = 10_000  # requests waiting at most; past this, Overloaded (503)
PARALLEL_WAITING_MIN = 80  # deliveries' worth of requests waiting before a batch starts beside a running one...
STALL_SECONDS = 0.05  # ...or how long the youngest running batch has run (0: at once, as before)
# The group commit's statements run on their generic plans. PostgreSQL plans a prepared statement
# anew at each execution while its custom plans look cheaper than the generic one, and a batch of
# one always does (its arrays hold one element where the generic plan assumes ten); from four
# requests on it chose the generic plan anyway. With one request in flight (what every create is
# at low load) that planning was half of PostgreSQL's CPU a message: 974 against 516 µs at 1,000
# accounts, and the API made 517 against 785 messages/s (`scripts/bench_ingest.py --concurrency 1`
# with and without it). Set on each connection the group
# commit takes from the pool; the pool's reset (RESET ALL) takes it off when one goes back.
GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"


class Overloaded(Exception):
    """Too many create requests are waiting; try again shortly."""


class KeyInProgress(Exception):
    """A request with this idempotency key is still being processed."""


class BatchFailed(Exception):
    """The transaction carrying this request failed; nothing of it was written."""


class BatchOutcomeUnknown(Exception):
    """The connection broke while this request's transaction was committing, and the database could
    not be asked in time whether it took effect: it may have been written."""


class ShuttingDown(Exception):
    """The server is shutting down and takes no new creates."""


Waker = Callable[[list[tuple[uuid.UUID, uuid.UUID]]], Awaitable[None]]  # (account_id, delivery_id) each
_Key = tuple[uuid.UUID, str]
_Item = tuple[MessageRequest, asyncio.Future, _Key | None]


class _Waiting:
    """The requests waiting for a batch, in arrival order; with more than one shard, one queue per
    shard, and a batch takes from the shard whose oldest request arrived first."""

    def __init__(self, shards: int, shard_hash: str) -> None:
        self._shards = shards
        self._shard_hash = shard_hash
        self._queues: dict[int, collections.deque[tuple[int, _Item]]] = {}
        self._count = 0
        self._arrivals = 0  # arrival order, across the shards

    def __len__(self) -> int:
        return self._count

    def append(self, item: _Item) -> None:
        shard = 0 if self._shards == 1 else shard_of(item[0].account_id, self._shards, self._shard_hash)
        self._queues.setdefault(shard, collections.deque()).append((self._arrivals, item))
        self._arrivals += 1
        self._count += 1

    def take(self, count_max: int) -> list[_Item]:
        """Up to count_max requests of one shard, oldest first."""
        shard = min(self._queues, key=lambda key: self._queues[key][0][0])
        queue = self._queues[shard]
        batch = [queue.popleft()[1] for _ in range(min(count_max, len(queue)))]
        if not queue:
            del self._queues[shard]
        self._count -= len(batch)
        return batch


class Coalescer:
    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        attempts_max: int,
        batch_max: int = BATCH_MAX,
        concurrency: int = CONCURRENCY,
        queue_max: int = QUEUE_MAX,
        wake: Waker | None = None,
        outcome_wait_seconds: float = OUTCOME_WAIT_SECONDS,
        parallel_waiting_min: int = PARALLEL_WAITING_MIN,
        stall_seconds: float = STALL_SECONDS,
        account_shards: int = 1,
        account_shard_hash: str = "postgres",
    ) -> None:
        assert 1 <= batch_max <= BATCH_MAX_LIMIT and 1 <= concurrency <= CONCURRENCY_LIMIT and queue_max >= 1
        assert parallel_waiting_min >= 1 and stall_seconds >= 0 and account_shards >= 1
        self._pool = pool
        self._attempts_max = attempts_max
        self._batch_max = batch_max
        self._concurrency = concurrency
        self._queue_max = queue_max
        self._wake = wake
        self._outcome_wait_seconds = outcome_wait_seconds
        # A batch beside running ones starts only once this many requests wait, or once the
        # youngest running batch has run `stall_seconds` (stuck on a lock, a slow disk).
        self._parallel_waiting_min = parallel_waiting_min
        self._stall_seconds = stall_seconds
        # Deliveries per new message in the last batch that made any: what a waiting request weighs.
        self._fan_out = 1.0
        self._started: dict[asyncio.Task, float] = {}  # running batch -> when it started (loop time)
        self._stall_timer: asyncio.TimerHandle | None = None
        self._waiting = _Waiting(account_shards, account_shard_hash)
        self._keys_in_flight: set[_Key] = set()
        self._batches: set[asyncio.Task] = set()
        # Each running batch keeps its connection for the next batch: acquiring from the pool
        # costs a reset round trip per release, which at thousands of batches a second shows.
        self._connections: list[asyncpg.Connection] = []
        # Wake-ups are group-committed too: one Redis call in flight, later ids wait and go together.
        self._wake_ids: list[tuple[uuid.UUID, uuid.UUID]] = []
        self._wake_task: asyncio.Task | None = None
        self._wake_down_since: float | None = None  # since when wake-ups fail or are backed up
        self._wake_left = 0  # deliveries left to the sweeper since then
        self._closed = False
        self._running_loop = event_loop.RunningLoop()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def submit(self, request: MessageRequest) -> MessageCreated | BillingError:
        """Create one message in the next group transaction; its own result or refusal.

        Raises Overloaded, KeyInProgress, ShuttingDown before queueing, BatchFailed or
        BatchOutcomeUnknown after.
        """
        if self._closed:
            raise ShuttingDown()
        if len(self._waiting) >= self._queue_max:
            raise Overloaded()
        key = None if request.idempotency_key is None else (request.account_id, request.idempotency_key)
        if key is not None:
            if key in self._keys_in_flight:
                raise KeyInProgress()
            self._keys_in_flight.add(key)
        future: asyncio.Future = self._running_loop().create_future()
        self._waiting.append((request, future, key))
        self._start_batches()
        # A handler cancelled here (its client gone) cancels only this future: the request stays
        # in its batch, and its key stays in flight until the batch is done (_run releases it), so
        # a client that disconnects and retries at once gets a 409 while that batch commits.
        return await future

    def _start_batches(self) -> None:
        loop = self._running_loop()
        while self._waiting and len(self._batches) < self._concurrency:
            if (self._batches and len(self._waiting) * self._fan_out < self._parallel_waiting_min
                    and not self._closed):
                youngest = max(self._started.values())
                if loop.time() < youngest + self._stall_seconds:
                    if self._stall_timer is None:
                        self._stall_timer = loop.call_at(youngest + self._stall_seconds, self._stall_check)
                    return
            batch = self._waiting.take(self._batch_max)
            task = loop.create_task(self._run(batch))
            self._batches.add(task)
            self._started[task] = loop.time()
            task.add_done_callback(self._batch_done)

    def _stall_check(self) -> None:
        self._stall_timer = None
        self._start_batches()

    def _batch_done(self, task: asyncio.Task) -> None:
        """A batch's slot is free once it is done (or once it answered, _send_next_early): the next may start."""
        self._batches.discard(task)
        self._started.pop(task, None)
        self._start_batches()

    async def _run(self, batch: list[_Item]) -> None:
        metrics.GROUP_COMMIT_BATCH.observe(len(batch))
        started = time.perf_counter()
        try:
            if tracing.ENABLED:
                with tracing.batch_span([request.trace_context for request, _, _ in batch]):
                    await self._run_batch(batch)
            else:
                await self._run_batch(batch)
        finally:
            metrics.GROUP_COMMIT_SECONDS.observe(time.perf_counter() - started)

    async def _run_batch(self, batch: list[_Item]) -> None:
        connection = None
        try:
            connection = await self._kept_connection() or await self._acquire()
            requests = [request for request, _, _ in batch]
            try:
                results = await create_messages(connection, requests, attempts_max=self._attempts_max)
            except CreateOutcomeUnknown as unknown:
                await self._release(connection)
                connection = None
                # The keys stay in flight meanwhile: a retry with one gets 409 until this is known.
                results = await self._resolve(unknown)
        except BaseException as error:
            failure = BatchOutcomeUnknown if isinstance(error, BatchOutcomeUnknown) else BatchFailed
            if not isinstance(error, (BatchFailed, BatchOutcomeUnknown)):
                logger.error("group commit of %d requests failed: %r", len(batch), error)
            for _, future, _ in batch:
                if not future.done():
                    future.set_exception(failure())
            self._release_keys(batch)
            if connection is not None:
                # A connection that just failed goes back to the pool, which resets or discards it.
                await self._release(connection)
            if not isinstance(error, Exception):
                raise
            return
        if connection is not None:
            self._connections.append(connection)
        self._send_next_early()
        created: list[tuple[uuid.UUID, uuid.UUID]] = []
        fresh = charged = 0
        for (request, future, _), result in zip(batch, results, strict=True):
            if isinstance(result, MessageCreated) and not result.replayed:
                fresh += 1
                charged += result.total_charged
                created.extend((request.account_id, delivery.id) for delivery in result.deliveries)
            if not future.done():
                future.set_result(result)
        self._release_keys(batch)
        if fresh:
            metrics.MESSAGES_CREATED.inc(fresh)
            metrics.CREDITS_CHARGED.inc(charged)
            self._fan_out = max(len(created) / fresh, 1.0)
        if created and self._wake is not None:
            self._wake_later(created)

    def _send_next_early(self) -> None:
        """When the batch whose write just answered was the only one in flight, start the next
        before answering this one's requests: the next batch's task runs before their handlers
        (the loop runs callbacks in order), so its statement is on its way to PostgreSQL while
        this process builds and writes those answers, instead of after them.

        Only when alone: beside another running batch, the next one waits for its threshold or
        the stall as ever (an early second batch beside a running one on one hot account made
        10 points less at 256 in flight). Measured with `scripts/bench_ingest.py` with and without
        it: beside wrk at 96 in flight, 49.5% → 66.8% of the trivial handler at 1,000
        accounts and 69.5% → 76.4% for one hot account, PostgreSQL's CPU a message unchanged; at
        256 within noise or better; beside the aiohttp load generator, which spends a core of the
        two on the load, 5 to 6 points less at 96 and 2 to 6 more at 256."""
        current = asyncio.current_task()
        if self._batches == {current}:
            self._batch_done(current)  # its done callback, run again when it ends, then finds it gone

    async def _resolve(self, unknown: CreateOutcomeUnknown) -> list:
        """The results of a batch whose COMMIT answer was lost, if the database says it was written."""
        logger.warning("lost the connection while committing %d new messages (%r); asking the database whether "
                       "they were written", len(unknown.message_ids), unknown.__cause__)
        try:
            results = await resolve_outcome(self._pool, unknown, wait_seconds=self._outcome_wait_seconds)
        except CreateOutcomeUnknown:
            metrics.COMMIT_OUTCOMES.labels("unknown").inc()
            logger.error("could not tell within %g s whether %d new messages were written; their requests answer "
                         "503 write-outcome-unknown", self._outcome_wait_seconds, len(unknown.message_ids))
            raise BatchOutcomeUnknown() from None
        if results is None:
            metrics.COMMIT_OUTCOMES.labels("not_written").inc()
            logger.warning("the %d new messages were not written; their requests answer 503 write-failed",
                           len(unknown.message_ids))
            raise BatchFailed()
        metrics.COMMIT_OUTCOMES.labels("written").inc()
        logger.warning("the %d new messages were written; their requests answer as usual", len(unknown.message_ids))
        return results

    async def _kept_connection(self) -> asyncpg.Connection | None:
        """A connection a finished batch kept, unless the server ended it meanwhile (a restart, an
        idle timeout): asyncpg then hands it back to the pool and detaches it, and a batch on it
        would fail every request in it."""
        while self._connections:
            connection = self._connections.pop()
            try:
                closed = connection.is_closed()
            except asyncpg.InterfaceError:  # detached: already "released back to the pool"
                continue
            if not closed:
                return connection
            await self._release(connection)
        return None

    async def _acquire(self) -> asyncpg.Connection:
        """A connection from the pool, set to plan the group commit's statements generically."""
        connection = await self._pool.acquire()
        try:
            await connection.execute(GENERIC_PLANS)
        except BaseException:
            await self._release(connection)
            raise
        return connection

    def _release_keys(self, batch: list[_Item]) -> None:
        for _, _, key in batch:
            if key is not None:
                self._keys_in_flight.discard(key)

    async def _release(self, connection: asyncpg.Connection) -> None:
        try:
            await self._pool.release(connection)
        except Exception as error:
            logger.warning("releasing a group-commit connection failed: %r", error)

    def _wake_later(self, delivery_ids: list[tuple[uuid.UUID, uuid.UUID]]) -> None:
        """Wake workers after commit, off the hot path. Lost wake-ups cost a sweep interval, never a delivery."""
        if len(self._wake_ids) + len(delivery_ids) > WAKE_IDS_PENDING_MAX:
            self._wake_left += len(delivery_ids)
            if self._wake_down_since is None:
                self._wake_down_since = time.monotonic()
                logger.warning("wake-ups backed up; new deliveries are left to the sweeper until they drain")
            return
        self._wake_ids.extend(delivery_ids)
        if self._wake_task is None:
            self._wake_task = asyncio.create_task(self._wake_pending())

    async def _wake_pending(self) -> None:
        """Send the waiting ids, one call at a time. While Redis fails, one warning, then one try per
        WAKE_RETRY_SECONDS (the ids of a failed try are left to the sweeper), and one line when it
        answers again: not a warning per call, a hundred a second under load."""
        try:
            while self._wake_ids:
                delivery_ids, self._wake_ids = self._wake_ids, []
                pause = WAKE_INTERVAL_SECONDS
                try:
                    await self._wake(delivery_ids)
                except Exception as error:  # Redis down must not fail a committed create.
                    self._wake_left += len(delivery_ids)
                    pause = WAKE_RETRY_SECONDS
                    if self._wake_down_since is None:
                        self._wake_down_since = time.monotonic()
                        logger.warning("could not wake workers (%r); new deliveries are left to the sweeper, "
                                       "trying again every %g s", error, WAKE_RETRY_SECONDS)
                else:
                    if self._wake_down_since is not None:
                        logger.warning("waking workers again after %.1f s; %d deliveries were left to the sweeper",
                                       time.monotonic() - self._wake_down_since, self._wake_left)
                        self._wake_down_since, self._wake_left = None, 0
                if not self._closed:
                    await asyncio.sleep(pause)
        finally:
            self._wake_task = None

    async def close(self) -> None:
        """Refuse new creates, finish the batches in flight and the pending wake-ups, return the connections."""
        self._closed = True
        while True:
            self._start_batches()
            # A finished batch leaves self._batches only when its done callback runs, on a later
            # turn of the loop. Wait on the unfinished ones: gathering finished tasks completes at
            # once on Python 3.12+ (no turn of the loop), and this loop would then never end.
            running = [task for task in self._batches if not task.done()]
            if running:
                await asyncio.wait(running)
            elif self._waiting:
                await asyncio.sleep(0)  # let the finished batches' callbacks free their slots
            else:
                break
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        if self._wake_task is not None:
            await asyncio.gather(self._wake_task, return_exceptions=True)
        while self._connections:
            await self._release(self._connections.pop())
