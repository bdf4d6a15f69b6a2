"""A deletion stopped by the database going away is resumed by the sweep, not left failed.

Before, any error marked the deletion failed, which only an operator starts again, while the
account stayed closing with its balance not closed out: a restart of PostgreSQL during a deletion
needed a human. Now such a stop leaves the row running, which the sweep resumes like a lost job.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from delivery.store import connection_loss
from delivery.operations import deletion
from engine_helpers import wait_for
from operator_helpers import add_endpoint, assert_audit_clean, balance_and_ledger, create_many, make_account


async def test_a_deletion_whose_connection_was_terminated_stays_running_and_finishes_when_run_again(pool, database_url):
    account_id = await make_account(pool, balance=500)
    endpoint_id = await add_endpoint(pool, account_id)
    await create_many(pool, account_id, endpoint_id, 20)
    blocker = await asyncpg.connect(database_url)
    try:
        # Hold the account row (not its key: the deletion row references it), so the first step,
        # which updates the account, waits on its lock, where we end its backend.
        transaction = blocker.transaction()
        await transaction.start()
        await blocker.execute("SELECT 1 FROM accounts WHERE id = $1 FOR NO KEY UPDATE", account_id)
        job = asyncio.create_task(deletion.run_deletion(pool, account_id))
        waiting = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        # Asked on connections of their own: inside the blocker's transaction the activity view is a snapshot.
        await wait_for(lambda: pool.fetchval(waiting))
        await pool.execute(f"SELECT pg_terminate_backend(pid) FROM ({waiting}) w")
        with pytest.raises(Exception) as raised:
            await job
        assert connection_loss.lost_database(raised.value)
        await transaction.rollback()
    finally:
        await blocker.close()
    state = await deletion.read_deletion(pool, account_id)
    assert state.status == "running"
    # What the sweep's resume_stale finds once the row has waited long enough.
    await pool.execute("UPDATE account_deletions SET updated_at = now() - interval '1 hour' WHERE account_id = $1",
                       account_id)
    stale = await pool.fetch(deletion._STALE, deletion.STALE_AFTER_SECONDS, deletion.RESUMED_PER_SWEEP_MAX)
    assert [row["account_id"] for row in stale] == [account_id]

    assert (await deletion.run_deletion(pool, account_id)).status == "done"
    assert await balance_and_ledger(pool, account_id) == (0, 0, "deleted")
    await assert_audit_clean(pool)
