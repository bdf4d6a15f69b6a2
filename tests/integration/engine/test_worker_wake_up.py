"""A job due now wakes the worker at once (delivery.engine.queue.WAKE_CHANNEL): a woken delivery does
not wait for the worker's next timed read of the queue, and an idle worker reads it only at
HOOKLEDGER_WORKER_POLL_MS, not every few milliseconds."""

from __future__ import annotations

import asyncio
import time

from billing.messages import MessageRequest, create_message
from delivery.platform import config
from engine_helpers import add_account, add_endpoint, fast_environment, keys_of, running_worker, startup_crons_done, wait_for

POLL_MS = 1000  # a timed read every second (the most the setting allows): what a woken delivery must not wait for


async def test_a_woken_delivery_is_sent_without_waiting_for_the_next_read_and_an_idle_worker_reads_seldom(
        pool, database_url, redis_url, keyring, receiver_factory, arq_queue):
    """Five deliveries woken one at a time each arrive within 0.3 s of their wake-up (a generous
    bound: a few milliseconds is usual; waiting for the timed read would take half a second on average);
    while nothing is due, the worker reads the queue about once per POLL_MS."""
    settings = config.load(fast_environment(database_url, redis_url, keyring, HOOKLEDGER_WORKER_POLL_MS=str(POLL_MS),
                                            HOOKLEDGER_SWEEP_SECONDS="60"))
    arrived: list[float] = []

    def answer(number):
        arrived.append(time.monotonic())
        return 200

    receiver = await receiver_factory(answer)
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring)
    async with running_worker(settings, pool) as worker:
        await startup_crons_done(worker)
        reads = 0
        read = worker._poll_iteration

        async def counted() -> None:
            nonlocal reads
            reads += 1
            await read()

        worker._poll_iteration = counted
        await asyncio.sleep(3 * POLL_MS / 1000)
        idle_reads = reads
        for number in range(5):
            created = await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=3)
            woken = time.monotonic()
            await arq_queue.wake(await keys_of(pool, [created.deliveries[0].id]))
            await wait_for(lambda: asyncio.sleep(0, len(arrived) > number), timeout_seconds=10)
            assert arrived[number] - woken < 0.3, arrived[number] - woken
    # Three intervals idle: about three reads (one more for a job of the sweep's), never hundreds.
    assert idle_reads <= 6, idle_reads
