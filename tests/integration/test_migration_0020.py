"""Migration 0020 (operational endpoint health, the wake-up notice, balance.exhausted armed by a
message) runs both ways on a database that holds operational endpoints and events: the downgrade
removes the columns and the notice trigger and restores the trigger that armed balance.exhausted
on any debit, keeping every row; the upgrade brings the head back as billing.tables declares."""

from __future__ import annotations

import asyncpg

from billing import accounts
from billing.database import create_pool
from delivery.platform import migrate
from delivery.store import operational as store
from signing import Keyring, generate_at_rest_key, generate_secret

_SHAPE = (
    "SELECT (SELECT count(*) FROM information_schema.columns WHERE table_name = 'operational_endpoints'"
    "   AND column_name IN ('disabled_reason', 'failing_since', 'last_failure_at', 'failure_count')) AS columns,"
    # Not the copies on partitions (HOOKLEDGER_ACCOUNT_PARTITIONS, 0023).
    " (SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
    "   WHERE tgname = 'operational_event_written' AND NOT c.relispartition) AS notice,"
    " (SELECT count(*) FROM pg_trigger WHERE tgname = 'operational_balance_exhausted_rearm') AS rearm"
)


async def _shape(connection) -> tuple[int, int, int]:
    return tuple(await connection.fetchrow(_SHAPE))


async def test_0020_down_and_up_on_a_populated_database(database_url: str) -> None:
    keyring = Keyring({"k1": generate_at_rest_key()}, "k1")
    pool = await create_pool(database_url, size_min=1, size_max=2)
    try:
        account = await accounts.create_account(pool, "migrating", price_per_delivery=1)
        endpoint = await store.create_endpoint(pool, account.id, "https://ops.example.com/h", secret=generate_secret(),
                                               keyring=keyring, event_types=None, description="", enabled=True)
        await pool.execute("UPDATE operational_endpoints SET enabled = false, disabled_reason = 'gone',"
                           " failing_since = now(), last_failure_at = now(), failure_count = 2 WHERE id = $1",
                           endpoint.id)
        await accounts.top_up(pool, account.id, "first", 10)
        assert await _shape(pool) == (4, 1, 0)
    finally:
        await pool.close()
    await migrate.downgrade_async(database_url, "0019")
    connection = await asyncpg.connect(database_url)
    try:
        assert await _shape(connection) == (0, 0, 1)
        assert await connection.fetchval("SELECT count(*) FROM operational_endpoints") == 1
        assert await connection.fetchval("SELECT count(*) FROM operational_events") == 1
        await connection.execute("UPDATE accounts SET balance_exhausted_armed = false WHERE id = $1", account.id)
        await accounts.reverse_top_up(connection, account.id, "first")  # a debit arms it, as before 0020
        assert await connection.fetchval("SELECT balance_exhausted_armed FROM accounts WHERE id = $1", account.id)
    finally:
        await connection.close()
    await migrate.upgrade_async(database_url)
    pool = await create_pool(database_url, size_min=1, size_max=2)
    try:
        assert await _shape(pool) == (4, 1, 0)
        row = await pool.fetchrow("SELECT disabled_reason, failure_count FROM operational_endpoints WHERE id = $1",
                                  endpoint.id)
        assert tuple(row) == (None, 0)
        await pool.execute("UPDATE accounts SET balance_exhausted_armed = false WHERE id = $1", account.id)
        await accounts.top_up(pool, account.id, "second", 10)
        await accounts.reverse_top_up(pool, account.id, "second")
        assert not await pool.fetchval("SELECT balance_exhausted_armed FROM accounts WHERE id = $1", account.id)
    finally:
        await pool.close()
