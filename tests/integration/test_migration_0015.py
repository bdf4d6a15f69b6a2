"""Migration 0015 (operational events) runs both ways on a database that holds their rows: the
downgrade drops the tables, the columns and every trigger and function it made (a top-up then
writes no event and fails on nothing), and the upgrade brings them back as billing.tables declares."""

from __future__ import annotations

import uuid

import asyncpg

from billing import accounts
from billing.database import create_pool
from delivery.platform import migrate
from delivery.store import operational as store
from signing import Keyring, generate_at_rest_key, generate_secret

# Partitions (HOOKLEDGER_ACCOUNT_PARTITIONS, 0023) and the triggers on them are their tables' copies: not counted.
_OURS = ("SELECT (SELECT count(*) FROM pg_proc WHERE proname LIKE 'operational%')"
         " + (SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid"
         "    WHERE tgname LIKE 'operational%' AND NOT c.relispartition)"
         " + (SELECT count(*) FROM pg_class WHERE relname LIKE 'operational%' AND relkind IN ('r', 'p')"
         "    AND NOT relispartition AND relnamespace = 'public'::regnamespace)"
         " + (SELECT count(*) FROM information_schema.columns WHERE table_name = 'accounts'"
         "    AND column_name IN ('low_balance_threshold', 'low_balance_armed', 'balance_exhausted_armed'))")


async def test_0015_down_and_up_on_a_populated_database(database_url: str) -> None:
    pool = await create_pool(database_url, size_min=1, size_max=2)
    try:
        account = await accounts.create_account(pool, "migrating", price_per_delivery=1)
        keyring = Keyring({"k1": generate_at_rest_key()}, "k1")
        await store.create_endpoint(pool, account.id, "https://ops.example.com/h", secret=generate_secret(),
                                    keyring=keyring, event_types=None, description="", enabled=True)
        await accounts.update_settings(pool, account.id, set_threshold=True, low_balance_threshold=5)
        await accounts.top_up(pool, account.id, "first", 10)
        assert await pool.fetchval("SELECT count(*) FROM operational_events") == 1
        assert await pool.fetchval(_OURS) == 6 + 5 + 3 + 3  # functions, triggers, tables, account columns
    finally:
        await pool.close()
    await migrate.downgrade_async(database_url, "0013")
    connection = await asyncpg.connect(database_url)
    try:
        assert await connection.fetchval(_OURS) == 0
        # A top-up's writes, as SQL: billing.accounts.top_up names the keys of 0022, which 0013 lacks.
        async with connection.transaction():
            await connection.execute("INSERT INTO ledger_entries (id, account_id, kind, amount)"
                                     " VALUES ($1, $2, 'topup', 5)", f"topup:after-{uuid.uuid4()}", account.id)
            await connection.execute("UPDATE accounts SET balance = balance + 5 WHERE id = $1", account.id)
    finally:
        await connection.close()
    await migrate.upgrade_async(database_url)
    pool = await create_pool(database_url, size_min=1, size_max=2)
    try:
        assert await pool.fetchval("SELECT low_balance_threshold IS NULL AND low_balance_armed FROM accounts"
                                   " WHERE id = $1", account.id)
        await accounts.top_up(pool, account.id, "again", 10)
        assert await pool.fetchval("SELECT count(*) FROM operational_events WHERE type = 'topup.applied'") == 1
    finally:
        await pool.close()
