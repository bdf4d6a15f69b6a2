"""Two deletion jobs for one account at once: one does the work, the other sees it running; one refund each."""

from __future__ import annotations

import asyncio

from delivery.operations import deletion
from delivery.engine import queue as job_queue
from engine_helpers import running_worker, wait_for
from operator_helpers import (add_endpoint, assert_audit_clean, balance_and_ledger, claim, create_many, make_account,
                              refunds_per_delivery)


async def test_two_jobs_in_process(pool):
    """run_deletion twice concurrently (many rounds): every step recorded by one job only, refunds once."""
    for _ in range(5):
        account_id = await make_account(pool, balance=5000)
        endpoint_id = await add_endpoint(pool, account_id)
        live = await create_many(pool, account_id, endpoint_id, 300)
        await claim(pool, live[:50])
        first, second = await asyncio.gather(deletion.run_deletion(pool, account_id),
                                             deletion.run_deletion(pool, account_id))
        assert {first.status, second.status} <= {"done", "running"} and "done" in {first.status, second.status}
        state = await deletion.read_deletion(pool, account_id)
        assert state.status == "done"
        assert [entry["step"] for entry in state.report["steps"]] == list(deletion.STEPS)
        assert state.report["refunded"] == 300
        assert await refunds_per_delivery(pool, account_id) == {"dead:1": 300}
        assert await balance_and_ledger(pool, account_id) == (0, 0, "deleted")
    await assert_audit_clean(pool)


async def test_two_jobs_on_the_worker(pool, settings, redis_url):
    """Two `hookledger accounts delete` requests enqueue two arq jobs; the worker runs both at once;
    the deletion shares one row, its steps run once, every live delivery is refunded once."""
    account_id = await make_account(pool, balance=5000)
    endpoint_id = await add_endpoint(pool, account_id)
    await create_many(pool, account_id, endpoint_id, 200)
    redis = await job_queue.connect(redis_url)
    try:
        first = await deletion.start_account_deletion(pool, redis, account_id)
        second = await deletion.start_account_deletion(pool, redis, account_id)
        assert first == second
        async with running_worker(settings, pool):
            await wait_for(lambda: pool.fetchval(
                "SELECT status = 'done' FROM account_deletions WHERE account_id = $1", account_id))
            await asyncio.sleep(0.5)  # let the second job finish too
    finally:
        await redis.aclose()
    state = await deletion.read_deletion(pool, account_id)
    assert [entry["step"] for entry in state.report["steps"]] == list(deletion.STEPS)
    assert await refunds_per_delivery(pool, account_id) == {"dead:1": 200}
    assert await balance_and_ledger(pool, account_id) == (0, 0, "deleted")
    await assert_audit_clean(pool)


async def test_a_deletion_whose_job_redis_lost_is_finished_by_the_sweep(pool, settings, redis_url):
    """The deletion is recorded and its job enqueued, then Redis loses every key before any worker ran
    it: the worker's sweep finds the stale `running` row, enqueues the job again, and it finishes."""
    import redis.asyncio as redis_asyncio

    account_id = await make_account(pool, balance=500)
    endpoint_id = await add_endpoint(pool, account_id)
    await create_many(pool, account_id, endpoint_id, 20)
    arq_redis = await job_queue.connect(redis_url)
    client = redis_asyncio.Redis.from_url(redis_url)
    try:
        await deletion.start_account_deletion(pool, arq_redis, account_id)
        await client.flushall()
        # As if a minute had passed without the job advancing the row.
        await pool.execute("UPDATE account_deletions SET updated_at = now() - interval '2 minutes'"
                           " WHERE account_id = $1", account_id)
        async with running_worker(settings, pool):
            await wait_for(lambda: pool.fetchval(
                "SELECT status = 'done' FROM account_deletions WHERE account_id = $1", account_id), timeout_seconds=30)
    finally:
        await arq_redis.aclose()
        await client.aclose()
    assert await refunds_per_delivery(pool, account_id) == {"dead:1": 20}
    assert await balance_and_ledger(pool, account_id) == (0, 0, "deleted")
    await assert_audit_clean(pool)
