"""Operator jobs never queue behind deliveries: an account deletion requested while every delivery slot
is held by a send and hundreds of deliver jobs wait runs to the end while those sends are still held
(delivery.engine.queue puts its job at the queue's head, where a worker with no free delivery slot
still looks; the worker keeps slots for operator jobs)."""

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

BUSY_MESSAGES = 150  # to two endpoints, one deliver job per delivery: 20 held in the slots, 280 queued
BUSY_ENDPOINTS = 2  # a sender runs 16 sends of one endpoint at once: two take all 20 slots' sends
SEND_TIMEOUT_MS = 30_000  # longer than the wait for the deletion: no held send ends on its own


async def _create(pool, account_id, count: int) -> list:
    created = await create_messages(pool, [MessageRequest(account_id, "e", b"{}") for _ in range(count)],
                                    attempts_max=3)
    return [delivery.id for message in created for delivery in message.deliveries]


async def _operator_jobs_gone(redis) -> bool:
    return not [key async for key in redis.scan_iter(job_key_prefix + job_queue.OPERATOR_JOB_PREFIX + "*")]


async def test_a_deletion_runs_while_every_delivery_slot_is_held_and_the_queue_is_full(
        pool, database_url, redis_url, keyring, receiver_factory, arq_queue):
    """Every delivery slot holds a send its receiver does not answer until the test says so, and 280
    deliver jobs wait behind them; then an account is deleted. The deletion finishes while every
    send is still held (so it took no delivery slot and did not wait for one to free), and its
    live deliveries are refunded once.

    Fails if the operator job lands behind the waiting deliveries (a worker with every delivery slot
    taken reads only the queue's head) or if it needs a delivery slot: either way it cannot start
    until the held sends are let go, which is after the wait for the deletion has failed."""
    # A sweep would claim the waiting deliveries in bulk and empty the queue: the startup sweep ends
    # before anything is created, and none runs after it.
    settings = config.load(fast_environment(
        database_url, redis_url, keyring, HOOKLEDGER_SWEEP_SECONDS="60", HOOKLEDGER_SEND_TIMEOUT_MS=str(SEND_TIMEOUT_MS),
        HOOKLEDGER_SEND_TIMEOUT_MS_MAX=str(SEND_TIMEOUT_MS), HOOKLEDGER_LEASE_MS=str(2 * SEND_TIMEOUT_MS)))
    let_go = asyncio.Event()

    async def held(number):
        await let_go.wait()
        return 200

    receiver = await receiver_factory(held)
    busy = await add_account(pool, balance=10_000)
    for _ in range(BUSY_ENDPOINTS):
        await add_endpoint(pool, busy, receiver, keyring, timeout_ms=SEND_TIMEOUT_MS)
    doomed = await add_account(pool, balance=1_000)
    await add_endpoint(pool, doomed, await receiver_factory(), keyring)
    redis = arq_queue.redis
    async with running_worker(settings, pool) as worker:
        await startup_crons_done(worker)
        stop_sweeping(worker)
        busy_deliveries = await _create(pool, busy, BUSY_MESSAGES)
        doomed_deliveries = await _create(pool, doomed, 5)  # never woken: pending when the deletion comes
        try:
            for delivery_id in busy_deliveries:
                await arq_queue.wake(await keys_of(pool, [delivery_id]))
            await wait_for(lambda: asyncio.sleep(0, len(receiver.received) >= settings.worker.jobs_max))
            assert await redis.zcard(job_queue.QUEUE_NAME) > len(busy_deliveries) - 3 * settings.worker.jobs_max
            await deletion.start_account_deletion(pool, redis, doomed)
            await wait_for(lambda: pool.fetchval(
                "SELECT status = 'done' FROM account_deletions WHERE account_id = $1", doomed))
            # The job itself ends after the deletion's last commit: arq then removes its key.
            await wait_for(lambda: _operator_jobs_gone(redis))
            # No held send ended and no other began: the deletion ran beside them, in a slot of its own.
            assert len(receiver.received) == settings.worker.jobs_max
        finally:
            let_go.set()
    for delivery_id in doomed_deliveries:
        assert await ledger_of(pool, delivery_id) == {"charge": -5, "refund": 5}
    assert (await audit(pool)).clean
