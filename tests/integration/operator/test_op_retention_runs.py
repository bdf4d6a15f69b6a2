"""The retention job's runs on real PostgreSQL: a run goes on batch after batch while payloads are
due and stops when none is; each batch starts where the run's previous one reached in each account,
and a message left behind (its delivery locked elsewhere) is erased by a later run; one run at a
time across workers (pools), by the run's advisory lock."""

from __future__ import annotations

import asyncio
import uuid

from operator_helpers import add_endpoint, assert_audit_clean, create_many, make_account

from billing import accounts
from billing.database import create_pool
from delivery.operations import retention

ROUNDS = 5


async def _due(pool, count: int, *, days_apart: bool = False) -> tuple[uuid.UUID, list[uuid.UUID]]:
    """An account with 1 day's retention and `count` finished messages past it (each with an attempt
    and an excerpt), returned as delivery ids oldest first; days_apart gives each its own created_at."""
    account_id = await make_account(pool, balance=10 * count + 10)
    await accounts.update_settings(pool, account_id, payload_retention_days=1)
    endpoint_id = await add_endpoint(pool, account_id)
    delivery_ids = await create_many(pool, account_id, endpoint_id, count)
    await pool.execute(
        "INSERT INTO delivery_attempts (delivery_id, attempt, account_id, started_at, status_code, response_excerpt)"
        " SELECT id, 1, account_id, now(), 200, 'ok ' || id FROM deliveries WHERE id = ANY($1::uuid[])", delivery_ids)
    await pool.execute("UPDATE deliveries SET state = 'delivered', attempt = 1, finished_at = now()"
                       " WHERE id = ANY($1::uuid[])", delivery_ids)
    for position, delivery_id in enumerate(delivery_ids):
        days = 2 + (count - position if days_apart else 0)
        await pool.execute("UPDATE messages SET created_at = now() - $2 * interval '1 day'"
                           " WHERE id = (SELECT message_id FROM deliveries WHERE id = $1)", delivery_id, days)
    return account_id, delivery_ids


async def _kept(pool, delivery_ids) -> set[uuid.UUID]:
    """The deliveries whose message still has its payload or whose attempts still hold an excerpt."""
    rows = await pool.fetch(
        "SELECT d.id FROM deliveries d JOIN messages m ON m.id = d.message_id WHERE d.id = ANY($1::uuid[])"
        " AND (m.payload IS NOT NULL OR EXISTS (SELECT 1 FROM delivery_attempts a"
        "   WHERE a.delivery_id = d.id AND a.response_excerpt IS NOT NULL))", list(delivery_ids))
    return {row["id"] for row in rows}


async def test_a_run_goes_on_while_payloads_are_due_past_a_held_one_and_stops_when_none_is(pool):
    """43 due, batches of 5, the 12th oldest's delivery locked elsewhere: one run erases the 42 others
    in 9 batches (8 full ones, then one finding less than a batch), leaves the held one, and stops; once
    the lock is gone, the next run erases it; a run with nothing due does one batch and erases nothing."""
    _, delivery_ids = await _due(pool, 43, days_apart=True)
    held = delivery_ids[11]
    async with pool.acquire() as holder, holder.transaction():
        await holder.execute("SELECT 1 FROM deliveries WHERE id = $1 FOR UPDATE", held)
        run = await retention.run_retention(pool, batch_size=5)
    assert (run.batches, run.erased, run.ran_elsewhere) == (9, 42, False)
    assert await _kept(pool, delivery_ids) == {held}
    later = await retention.run_retention(pool, batch_size=5)
    assert (later.batches, later.erased) == (1, 1)
    assert await _kept(pool, delivery_ids) == set() and await retention.backlog(pool) == 0
    idle = await retention.run_retention(pool, batch_size=5)
    assert (idle.batches, idle.erased) == (1, 0)
    await assert_audit_clean(pool)


async def test_a_batch_starts_where_the_run_reached_in_each_account(pool):
    """Messages a day apart: a batch given where the run reached takes only payloads from there on, and
    moves that mark to the newest one it took; a batch with no mark starts at the oldest."""
    account_id, delivery_ids = await _due(pool, 10, days_apart=True)
    created = {row["id"]: row["created_at"] for row in await pool.fetch(
        "SELECT d.id, m.created_at FROM deliveries d JOIN messages m ON m.id = d.message_id"
        " WHERE d.id = ANY($1::uuid[])", delivery_ids)}
    reached = {account_id: created[delivery_ids[5]]}
    assert await retention.erase_batch(pool, batch_size=3, reached=reached) == (3, 3)
    assert reached == {account_id: created[delivery_ids[7]]}
    assert await _kept(pool, delivery_ids) == set(delivery_ids[:5] + delivery_ids[8:])
    fresh: dict = {}
    assert await retention.erase_batch(pool, batch_size=100, reached=fresh) == (7, 7)
    assert fresh == {account_id: created[delivery_ids[9]]}
    assert await _kept(pool, delivery_ids) == set()
    await assert_audit_clean(pool)


async def test_a_run_finding_the_lock_taken_returns_at_once_and_erases_nothing(pool):
    """While the run's advisory lock is held elsewhere (another worker's run), a run returns at once,
    erases nothing and says so; once it is released, a run erases everything due."""
    _, delivery_ids = await _due(pool, 12)
    async with pool.acquire() as other_worker:
        assert await other_worker.fetchval("SELECT pg_try_advisory_lock($1, 0)", retention.RUN_LOCK_NAMESPACE)
        try:
            run = await retention.run_retention(pool, batch_size=5)
        finally:
            await other_worker.execute("SELECT pg_advisory_unlock($1, 0)", retention.RUN_LOCK_NAMESPACE)
    assert (run.batches, run.erased, run.ran_elsewhere) == (0, 0, True)
    assert await _kept(pool, delivery_ids) == set(delivery_ids)
    run = await retention.run_retention(pool, batch_size=5)
    assert (run.erased, run.ran_elsewhere) == (12, False)
    assert await _kept(pool, delivery_ids) == set()


async def _run_lock_granted(pool) -> bool:
    return await pool.fetchval(
        "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::bigint::oid"
        " AND objid = 0 AND objsubid = 2 AND granted", retention.RUN_LOCK_NAMESPACE)


async def test_two_workers_runs_never_overlap(database_url, pool):
    """Two workers (pools of their own) on one database, repeated: while one worker's run is going on,
    the other's run returns at once without erasing; every payload due is erased once, by the first."""
    second_worker = await create_pool(database_url, size_min=1, size_max=4)
    try:
        for _ in range(ROUNDS):
            _, delivery_ids = await _due(pool, 150)
            first = asyncio.create_task(retention.run_retention(pool, batch_size=1))
            while not await _run_lock_granted(second_worker):
                assert not first.done(), "the first run ended before its lock was seen"
                await asyncio.sleep(0.001)
            second = await retention.run_retention(second_worker, batch_size=1)
            assert not first.done()  # still going on when the second worker's run ended
            first_run = await first
            assert (second.batches, second.erased, second.ran_elsewhere) == (0, 0, True)
            assert first_run.erased == 150 and not first_run.ran_elsewhere
            assert await _kept(pool, delivery_ids) == set()
            assert not await _run_lock_granted(pool)
    finally:
        await second_worker.close()
    await assert_audit_clean(pool)
