"""An answer that reports in after its message was erased keeps no response excerpt.

A worker whose lease expired can still be waiting on a receiver. Meanwhile the sweep ends the
delivery (its last attempt), the message is expunged or erased by retention, and then the answer
arrives and is recorded as a stale attempt (a 2xx: with a reclaim). Its status, time and latency are
recorded as always, but the receiver's text and the custom headers it was sent with are not: the
message's erasure covers its attempts' excerpts and headers whenever they arrive. An answer for a
message still kept keeps both.
"""

from __future__ import annotations

import json
import time

import pytest

from delivery.engine import claims, results
from delivery.operations import retention
from operator_helpers import add_endpoint, assert_audit_clean, claim, create_many, make_account


async def _ended_by_the_sweep(pool, delivery_id) -> None:
    """Claimed on its only attempt, the lease expired, the sweep made it dead (attempts_exhausted)."""
    await claim(pool, [delivery_id])
    await pool.execute("UPDATE deliveries SET leased_until = now() - interval '1 second' WHERE id = $1", delivery_id)
    assert delivery_id in await results.expire_leases(pool, batch_size=10, delay_seconds=lambda attempt: 0.0)
    await claims.settle_exhausted(pool, batch_size=10)
    state = await pool.fetchrow("SELECT state, dead_reason FROM deliveries WHERE id = $1", delivery_id)
    assert tuple(state) == ("dead", "attempts_exhausted")


SENT_HEADERS = {"X-Tenant": "acme", "Authorization": "Bearer gateway-token"}


def _late(delivery_id, account_id, *, success: bool, excerpt: str) -> results.AttemptResult:
    now = time.monotonic()
    return results.AttemptResult(delivery_id, 1, account_id, success, latency_ms=900,
                                 status_code=200 if success else 500, error=None if success else "HTTP 500",
                                 response_excerpt=excerpt, sent_at=now - 0.9, answered_at=now,
                                 sent_headers=json.dumps(SENT_HEADERS))


async def _attempt(pool, delivery_id):
    return await pool.fetchrow("SELECT status_code, latency_ms, stale, response_excerpt, sent_headers"
                               " FROM delivery_attempts WHERE delivery_id = $1 AND attempt = 1", delivery_id)


@pytest.mark.parametrize("success", [True, False], ids=["2xx", "failure"])
@pytest.mark.parametrize("erasure", ["expunge", "retention", "kept"])
async def test_a_late_answer_after_erasure_keeps_no_excerpt(pool, success, erasure):
    account_id = await make_account(pool, balance=1000)
    await pool.execute("UPDATE accounts SET payload_retention_days = 1 WHERE id = $1", account_id)
    endpoint_id = await add_endpoint(pool, account_id)
    (delivery_id,) = await create_many(pool, account_id, endpoint_id, 1, attempts_max=1)
    message_id = await pool.fetchval("SELECT message_id FROM deliveries WHERE id = $1", delivery_id)
    await _ended_by_the_sweep(pool, delivery_id)
    if erasure == "expunge":
        await retention.expunge(pool, account_id, message_id, "test")
    elif erasure == "retention":
        await pool.execute("UPDATE messages SET created_at = now() - interval '2 days' WHERE id = $1", message_id)
        assert (await retention.run_retention(pool)).erased == 1

    summary = await results.record_results(pool, [_late(delivery_id, account_id, success=success,
                                                        excerpt="card 4242 4242 4242 4242")])
    attempt = await _attempt(pool, delivery_id)
    assert (attempt["status_code"], attempt["latency_ms"], attempt["stale"]) == (200 if success else 500, 900, True)
    if erasure == "kept":
        assert attempt["response_excerpt"] == "card 4242 4242 4242 4242"
        assert json.loads(attempt["sent_headers"]) == SENT_HEADERS
    else:
        assert attempt["response_excerpt"] is None and attempt["sent_headers"] is None
        assert await pool.fetchval("SELECT payload FROM messages WHERE id = $1", message_id) is None
    assert summary.reclaimed == ([delivery_id] if success else [])
    await assert_audit_clean(pool)


async def test_migration_0018_goes_down_and_up_on_a_populated_database(pool, database_url):
    """Down to 0017 the late excerpt stays (no trigger); up again it is dropped; the rows survive both ways."""
    from delivery.platform import migrate

    account_id = await make_account(pool, balance=1000)
    endpoint_id = await add_endpoint(pool, account_id)
    first, second = await create_many(pool, account_id, endpoint_id, 2, attempts_max=1)
    for delivery_id in (first, second):
        await _ended_by_the_sweep(pool, delivery_id)
        message_id = await pool.fetchval("SELECT message_id FROM deliveries WHERE id = $1", delivery_id)
        await retention.expunge(pool, account_id, message_id, "test")
    # Not its copies on partitions (HOOKLEDGER_ACCOUNT_PARTITIONS, 0023).
    trigger = ("SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
               " WHERE tgname = 'delivery_attempts_erased_message' AND NOT c.relispartition")
    await migrate.downgrade_async(database_url, "0017")
    assert await pool.fetchval(trigger) == 0
    # Written by hand as the recorder writes a late answer (the recorder of today writes columns 0017 lacks).
    await pool.execute("UPDATE delivery_attempts SET response_excerpt = 'kept without the trigger', stale = true,"
                       " status_code = 200 WHERE delivery_id = $1 AND attempt = 1", first)
    assert (await pool.fetchrow("SELECT response_excerpt FROM delivery_attempts WHERE delivery_id = $1", first))[
        "response_excerpt"] == "kept without the trigger"
    await migrate.upgrade_async(database_url)
    assert await pool.fetchval(trigger) == 1
    await results.record_results(pool, [_late(second, account_id, success=True, excerpt="dropped")])
    assert (await _attempt(pool, second))["response_excerpt"] is None
    assert await pool.fetchval("SELECT count(*) FROM delivery_attempts WHERE account_id = $1", account_id) == 2
    await assert_audit_clean(pool)
