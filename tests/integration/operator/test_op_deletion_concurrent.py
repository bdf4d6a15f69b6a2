"""Two deletion jobs for one account at once: one does the work, the other sees it running; one refund each.

"At once" is made certain, not left to scheduling: the job that takes the account's advisory lock
waits at a gate, before its first step, until the other job has come and gone. Had the other job
taken the lock too, both would wait at the gate and the test would fail on its timeout.
"""

from __future__ import annotations

import asyncio

from delivery.operations import deletion
from delivery.engine import queue as job_queue
from engine_helpers import running_worker, wait_for
from operator_helpers import (add_endpoint, assert_audit_clean, balance_and_ledger, claim, create_many, make_account,
                              refunds_per_delivery)

OVERLAP_SECONDS_MAX = 60  # for both jobs to reach the gate and end, on a loaded machine


class _Gate:
    """Holds the job that took the lock (deletion._run_locked) until a job has returned `running`;
    records every job's outcome (deletion.run_deletion) and how many got past the lock."""

    def __init__(self, monkeypatch) -> None:
        self.locked = 0
        self.outcomes: list[deletion.DeletionState] = []
        self.other_returned = asyncio.Event()
        run_locked, run_deletion = deletion._run_locked, deletion.run_deletion

        async def gated(pool, account_id):
            self.locked += 1
            await self.other_returned.wait()
            return await run_locked(pool, account_id)

        async def recorded(pool, account_id):
            state = await run_deletion(pool, account_id)
            self.outcomes.append(state)
            if state.status == "running":
                self.other_returned.set()
            return state

        monkeypatch.setattr(deletion, "_run_locked", gated)
        monkeypatch.setattr(deletion, "run_deletion", recorded)

    def reset(self) -> None:
        self.locked = 0
        self.outcomes.clear()
        self.other_returned.clear()


async def test_two_jobs_in_process(pool, monkeypatch):
    """run_deletion twice concurrently (many rounds): while one holds the deletion, the other returns
    `running` at once; every step recorded by one job only, refunds once."""
    gate = _Gate(monkeypatch)
    for _ in range(5):
        gate.reset()
        account_id = await make_account(pool, balance=5000)
        endpoint_id = await add_endpoint(pool, account_id)
        live = await create_many(pool, account_id, endpoint_id, 300)
        await claim(pool, live[:50])
        first, second = await asyncio.wait_for(asyncio.gather(deletion.run_deletion(pool, account_id),
                                                              deletion.run_deletion(pool, account_id)),
                                               OVERLAP_SECONDS_MAX)
        assert sorted([first.status, second.status]) == ["done", "running"] and gate.locked == 1
        waited = first if first.status == "running" else second
        assert waited.report == {"note": "another job is running this deletion"}
        state = await deletion.read_deletion(pool, account_id)
        assert state.status == "done"
        assert [entry["step"] for entry in state.report["steps"]] == list(deletion.STEPS)
        assert state.report["refunded"] == 300
        assert await refunds_per_delivery(pool, account_id) == {"dead:1": 300}
        assert await balance_and_ledger(pool, account_id) == (0, 0, "deleted")
    await assert_audit_clean(pool)


async def test_two_jobs_on_the_worker(pool, settings, redis_url, monkeypatch):
    """Two `hookledger accounts delete` requests enqueue two arq jobs; the worker runs both at once
    (the second returns `running` while the first holds the deletion); the deletion shares one row,
    its steps run once, every live delivery is refunded once."""
    gate = _Gate(monkeypatch)
    account_id = await make_account(pool, balance=5000)
    endpoint_id = await add_endpoint(pool, account_id)
    await create_many(pool, account_id, endpoint_id, 200)
    redis = await job_queue.connect(redis_url)
    try:
        first = await deletion.start_account_deletion(pool, redis, account_id)
        second = await deletion.start_account_deletion(pool, redis, account_id)
        assert first == second
        async with running_worker(settings, pool):
            # Both jobs have ended: the one that waited at the gate for the other, and the other.
            await wait_for(lambda: asyncio.sleep(0, len(gate.outcomes) == 2), timeout_seconds=OVERLAP_SECONDS_MAX)
    finally:
        await redis.aclose()
    assert sorted(state.status for state in gate.outcomes) == ["done", "running"] and gate.locked == 1
    state = await deletion.read_deletion(pool, account_id)
    assert state.status == "done"
    assert [entry["step"] for entry in state.report["steps"]] == list(deletion.STEPS)
    assert await refunds_per_delivery(pool, account_id) == {"dead:1": 200}
    assert await balance_and_ledger(pool, account_id) == (0, 0, "deleted")
    await assert_audit_clean(pool)


async def test_a_deletion_whose_job_redis_lost_is_finished_by_the_sweep(pool, settings, redis_url):
    """The deletion is recorded and its job enqueued, then Redis loses every key before any worker ran
    it: the worker's sweep finds the stale `running` row, enqueues the job again, and it finishes.
    (FLUSHDB of this test's own Redis database: FLUSHALL would empty every database on the server.)"""
    import redis.asyncio as redis_asyncio

    account_id = await make_account(pool, balance=500)
    endpoint_id = await add_endpoint(pool, account_id)
    await create_many(pool, account_id, endpoint_id, 20)
    arq_redis = await job_queue.connect(redis_url)
    client = redis_asyncio.Redis.from_url(redis_url)
    try:
        await deletion.start_account_deletion(pool, arq_redis, account_id)
        await client.flushdb()
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
