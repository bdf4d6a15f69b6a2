"""Operator jobs never queue behind deliveries: an account deletion requested while every delivery slot
is busy and hundreds of deliver jobs wait starts within a second (delivery.engine.queue puts it at
the queue's head; the worker keeps slots for operator jobs)."""

from __future__ import annotations

import asyncio

from arq.constants import job_key_prefix

from billing.audit import audit
from billing.messages import MessageRequest, create_messages
from delivery.engine import queue as job_queue
from delivery.operations import deletion
from delivery.platform import config
from engine_helpers import (keys_of, add_account, add_endpoint, fast_environment, ledger_of, running_worker,
                            startup_crons_done, stop_sweeping, wait_for)

BUSY_DELIVERIES = 300  # one deliver job each, 0.8 s per send: 12 s of work for 20 slots


async def _create(pool, account_id, count: int) -> list:
    created = await create_messages(pool, [MessageRequest(account_id, "e", b"{}") for _ in range(count)],
                                    attempts_max=3)
    return [delivery.id for message in created for delivery in message.deliveries]


async def test_a_deletion_starts_within_a_second_behind_a_full_delivery_queue(
        pool, database_url, redis_url, keyring, receiver_factory, arq_queue):
    """Every delivery slot holds a send that takes 0.8 s and 280 deliver jobs wait behind them; then an
    account is deleted. Its first step commits within a second of the request (behind the queue it
    would wait about 12 s), and its live deliveries are refunded once."""
    # A sweep would claim the waiting deliveries in bulk and empty the queue: the startup sweep ends
    # before anything is created, and none runs after it.
    settings = config.load(fast_environment(database_url, redis_url, keyring, HOOKLEDGER_SWEEP_SECONDS="60"))

    async def slow(number):
        await asyncio.sleep(0.8)
        return 200

    receiver = await receiver_factory(slow)
    busy = await add_account(pool, balance=10_000)
    await add_endpoint(pool, busy, receiver, keyring)
    doomed = await add_account(pool, balance=1_000)
    await add_endpoint(pool, doomed, await receiver_factory(), keyring)
    redis = arq_queue.redis
    async with running_worker(settings, pool) as worker:
        await startup_crons_done(worker)
        stop_sweeping(worker)
        busy_deliveries = await _create(pool, busy, BUSY_DELIVERIES)
        doomed_deliveries = await _create(pool, doomed, 5)  # never woken: pending when the deletion comes
        for delivery_id in busy_deliveries:
            await arq_queue.wake(await keys_of(pool, [delivery_id]))
        await wait_for(lambda: asyncio.sleep(0, len(receiver.received) >= settings.worker.jobs_max))
        waiting = await redis.zcard(job_queue.QUEUE_NAME)
        assert waiting > BUSY_DELIVERIES - 3 * settings.worker.jobs_max
        requested = await pool.fetchval("SELECT clock_timestamp()")
        await deletion.start_account_deletion(pool, redis, doomed)
        await wait_for(lambda: pool.fetchval("SELECT status = 'done' FROM account_deletions WHERE account_id = $1",
                                             doomed), timeout_seconds=30)
        first_step = await pool.fetchval(
            "SELECT (report->'steps'->0->>'at')::timestamptz - $2 FROM account_deletions WHERE account_id = $1",
            doomed, requested)
        still_waiting = await redis.zcard(job_queue.QUEUE_NAME)
        assert first_step.total_seconds() < 1.0, first_step
        assert still_waiting > 0  # the deletion did not wait for the queue to drain
        assert not [key async for key in redis.scan_iter(job_key_prefix + job_queue.OPERATOR_JOB_PREFIX + "*")]
    for delivery_id in doomed_deliveries:
        assert await ledger_of(pool, delivery_id) == {"charge": -5, "refund": 5}
    assert (await audit(pool)).clean
