"""PostgreSQL goes away under a running worker: each job and sweep that meets the outage says so in
one line, none is counted failed, no traceback reaches the log, and every 2xx is kept.

The worker's pool reaches PostgreSQL through a switch (database_switch): switched off, its open
connections are cut mid-statement and new ones refused, as while PostgreSQL restarts.
"""

from __future__ import annotations

import asyncio
import logging

from billing.audit import audit
from billing.database import create_pool
from billing.messages import MessageRequest, create_messages
from delivery.platform import config
from database_switch import DatabaseSwitch
from engine_helpers import keys_of, add_account, add_endpoint, all_finished, fast_environment, running_worker, states, wait_for

OUTAGE_SECONDS = 2.5  # more than two sweeps (HOOKLEDGER_SWEEP_SECONDS=1) and many polls


async def _create(pool, account_id, count: int) -> list:
    created = await create_messages(pool, [MessageRequest(account_id, "e", b"{}") for _ in range(count)],
                                    attempts_max=3)
    return [delivery.id for message in created for delivery in message.deliveries]


async def test_a_database_outage_under_a_running_worker_logs_one_line_per_job_and_loses_no_2xx(
        pool, database_url, redis_url, keyring, receiver_factory, arq_queue, caplog):
    """Deliveries are on the wire when PostgreSQL goes away; more are created (on the test's own
    connection) and woken during the outage, so deliver jobs and sweeps start while it is away. Once
    it is back, every delivery ends delivered, the audit is clean, arq counts no job failed, and the
    log holds no traceback: only one-line warnings."""
    caplog.set_level(logging.INFO)
    switch = await DatabaseSwitch(database_url).start()
    settings = config.load(fast_environment(switch.url(), redis_url, keyring))
    worker_pool = await create_pool(switch.url(), size_min=1, size_max=10)

    async def answer(number):
        await asyncio.sleep(0.2)
        return 200

    receiver = await receiver_factory(answer)
    account_id = await add_account(pool, balance=10_000)
    await add_endpoint(pool, account_id, receiver, keyring)
    try:
        async with running_worker(settings, worker_pool) as worker:
            before = await _create(pool, account_id, 20)
            await arq_queue.wake(await keys_of(pool, before))
            await wait_for(lambda: asyncio.sleep(0, len(receiver.received) >= 5))
            await switch.off()
            during = await _create(pool, account_id, 10)
            for delivery_id in during:  # one job each
                await arq_queue.wake(await keys_of(pool, [delivery_id]))
            await asyncio.sleep(OUTAGE_SECONDS)
            await switch.on()
            await wait_for(lambda: all_finished(pool, before + during), timeout_seconds=30)
            assert worker.jobs_failed == 0
            records = list(caplog.records)  # the shutdown below cancels what runs: not the outage's doing
    finally:
        await worker_pool.close()
        await switch.close()
    found = await states(pool, before + during)
    assert {row["state"] for row in found.values()} == {"delivered"}
    assert (await audit(pool)).clean
    unavailable = [record for record in records if "PostgreSQL is unavailable" in record.getMessage()]
    assert unavailable, "the outage was not met"
    assert any("a deliver job stopped" in record.getMessage() for record in unavailable)
    with_traceback = [record for record in records if record.exc_info or "Traceback" in record.getMessage()]
    assert not with_traceback, [record.getMessage() for record in with_traceback]
    assert all("\n" not in record.getMessage() for record in records if record.levelno >= logging.WARNING)
