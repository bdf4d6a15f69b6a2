"""The PostgreSQL dedupe store on a real server: exactly-once across connections, DDL, cleanup,
and through the receiver: an aborted transaction is never answered 2xx, and a copy of a webhook
being processed is answered 409 at once instead of holding a connection while it waits."""

from __future__ import annotations

import asyncio
import json
import time

import asyncpg
import pytest

from signing import errors, generate_secret, webhook_handler, webhook_headers
from signing.dedupe_postgres import (
    PostgresDedupe,
    PostgresDedupeStore,
    create_receipts_table,
    delete_old_receipts,
    receipts_table_ddl,
)

CONCURRENT_CONNECTIONS = 30


async def test_concurrent_claims_on_separate_connections_succeed_exactly_once(pool):
    """30 transactions on 30 connections claim one id at once: exactly one gets "first time"."""
    async with pool.acquire() as connection:
        await create_receipts_table(connection)
    started = asyncio.Barrier(CONCURRENT_CONNECTIONS)

    async def claim_in_own_transaction() -> bool:
        async with pool.acquire() as connection, connection.transaction():
            await started.wait()
            first = await PostgresDedupeStore(connection).claim("evt_race")
            # Hold the transaction open a moment, as a handler would, so others must wait on it.
            await asyncio.sleep(0.02)
            return first

    results = await asyncio.gather(*(claim_in_own_transaction() for _ in range(CONCURRENT_CONNECTIONS)))
    assert results.count(True) == 1


async def test_a_rolled_back_claim_lets_the_waiting_copy_through(pool):
    """If the first transaction rolls back, the copy blocked behind it claims the id. The first rolls
    back only once PostgreSQL shows the second waiting on its lock, so the second was blocked."""
    async with pool.acquire() as connection:
        await create_receipts_table(connection)
    first_claimed = asyncio.Event()

    async def failing_first() -> None:
        with pytest.raises(RuntimeError):
            async with pool.acquire() as connection, connection.transaction():
                assert await PostgresDedupeStore(connection).claim("evt_rollback")
                first_claimed.set()
                await _until_a_backend_waits_on_a_lock(pool)
                raise RuntimeError("handler failed")

    async def waiting_second() -> bool:
        await first_claimed.wait()
        async with pool.acquire() as connection, connection.transaction():
            return await PostgresDedupeStore(connection).claim("evt_rollback")

    _, second = await asyncio.gather(failing_first(), waiting_second())
    assert second is True


async def _until_a_backend_waits_on_a_lock(pool, seconds: float = 30) -> None:
    async with asyncio.timeout(seconds):
        while not await pool.fetchval("SELECT count(*) > 0 FROM pg_stat_activity"
                                      " WHERE datname = current_database() AND wait_event_type = 'Lock'"):
            await asyncio.sleep(0.01)


async def test_claiming_outside_a_transaction_is_refused(pool):
    """Outside a transaction the claim would commit before the work: that is refused, loudly."""
    async with pool.acquire() as connection:
        await create_receipts_table(connection)
        with pytest.raises(errors.NotInTransactionError):
            await PostgresDedupeStore(connection).claim("evt_no_transaction")


async def test_release_and_is_complete_within_the_transaction(pool):
    """`release` deletes the receipt in the caller's transaction; `is_complete` sees committed ones."""
    async with pool.acquire() as connection:
        await create_receipts_table(connection)
        store = PostgresDedupeStore(connection)
        async with connection.transaction():
            assert await store.claim("evt_release")
            await store.release("evt_release")
        async with connection.transaction():
            assert await store.claim("evt_release")
        assert await store.is_complete("evt_release")


async def test_ddl_is_idempotent_and_a_chosen_schema_qualified_table_works(pool):
    """The DDL can run at every start, and a receiver may choose its table name and schema."""
    async with pool.acquire() as connection:
        await connection.execute("CREATE SCHEMA receiver")
        for _ in range(2):
            await create_receipts_table(connection, "receiver.hook_ids")
        async with connection.transaction():
            assert await PostgresDedupeStore(connection, table="receiver.hook_ids").claim("evt_schema")
        comment = await connection.fetchval("SELECT obj_description('receiver.hook_ids'::regclass)")
    assert "processed" in comment


@pytest.mark.parametrize(
    "table", ["", "Receipts", "a;drop table x", 'a"b', "a.b.c", "x" * 41, "1receipts", None]
)
def test_table_names_that_are_not_plain_identifiers_are_refused(table):
    """Only lowercase identifiers (optionally schema.table) reach SQL; everything else is refused."""
    with pytest.raises(errors.InvalidTableNameError):
        receipts_table_ddl(table)


async def test_cleanup_deletes_only_old_receipts_in_bounded_batches(pool):
    """Old receipts are deleted, at most `rows_max` per call; recent ones stay."""
    async with pool.acquire() as connection:
        await create_receipts_table(connection)
        await connection.execute(
            "INSERT INTO webhook_receipts (webhook_id, received_at)"
            " SELECT 'old_' || n, now() - interval '8 days' FROM generate_series(1, 5) AS n"
        )
        await connection.execute("INSERT INTO webhook_receipts (webhook_id) VALUES ('recent')")
        week_seconds = 7 * 24 * 3600
        assert await delete_old_receipts(connection, older_than_seconds=week_seconds, rows_max=3) == 3
        assert await delete_old_receipts(connection, older_than_seconds=week_seconds, rows_max=3) == 2
        assert await delete_old_receipts(connection, older_than_seconds=week_seconds) == 0
        assert await connection.fetchval("SELECT array_agg(webhook_id) FROM webhook_receipts") == ["recent"]


SECRET = generate_secret()
BODY = json.dumps({"type": "customer.created", "email": "a@example.com"}).encode()


async def deliver(http, url: str, webhook_id: str) -> tuple[int, dict, str | None]:
    headers = webhook_headers(webhook_id, int(time.time()), BODY, [SECRET])
    async with http.post(url, data=BODY, headers=headers) as response:
        return response.status, await response.json(content_type=None), response.headers.get("Retry-After")


@pytest.fixture
async def tables(pool):
    async with pool.acquire() as connection:
        await create_receipts_table(connection)
        await connection.execute("CREATE TABLE customers (email text PRIMARY KEY)")
        await connection.execute("CREATE TABLE processed_events (webhook_id text NOT NULL)")
        await connection.execute("INSERT INTO customers VALUES ('a@example.com')")
    return pool


@pytest.mark.parametrize("savepoint", [False, True], ids=["caught in the transaction", "caught in a savepoint"])
async def test_a_handler_that_catches_its_own_sql_error_is_not_answered_2xx_unless_in_a_savepoint(
    serve, http, tables, savepoint
):
    """A handler's "insert; on UniqueViolation it exists already" aborts the transaction, and
    asyncpg's COMMIT would then roll back without raising: the webhook is answered 500 (retried)
    with nothing kept, never 2xx. Run in a savepoint, as documented, the same handler commits."""
    calls = []

    async def on_webhook(event):
        calls.append(event.id)
        await event.connection.execute("INSERT INTO processed_events VALUES ($1)", event.id)
        try:
            if savepoint:
                async with event.connection.transaction():
                    await event.connection.execute("INSERT INTO customers VALUES ('a@example.com')")
            else:
                await event.connection.execute("INSERT INTO customers VALUES ('a@example.com')")
        except asyncpg.UniqueViolationError:
            pass

    url = await serve(webhook_handler(on_webhook, keys=SECRET, dedupe=PostgresDedupe(tables)))
    statuses = [(await deliver(http, url, "evt_customer"))[0] for _ in range(2)]
    kept = await tables.fetchval("SELECT count(*) FROM processed_events")
    receipts = await tables.fetchval("SELECT count(*) FROM webhook_receipts")
    if savepoint:
        assert (statuses, len(calls), kept, receipts) == ([200, 200], 1, 1, 1)
    else:
        assert (statuses, len(calls), kept, receipts) == ([500, 500], 2, 0, 0)


async def test_copies_of_a_webhook_being_processed_are_answered_409_without_waiting(serve, http, database_url):
    """With a pool of 3, a slow webhook and 6 copies of it: each copy is answered 409 with
    Retry-After at once (no copy holds a connection waiting on the first's row lock), another
    webhook is processed meanwhile, and once the first has committed a copy is a 200 duplicate."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=3)
    started, finish = asyncio.Event(), asyncio.Event()
    try:
        async with pool.acquire() as connection:
            await create_receipts_table(connection)
        calls = []

        async def on_webhook(event):
            calls.append(event.id)
            if event.id == "evt_slow":
                started.set()
                await finish.wait()

        url = await serve(webhook_handler(on_webhook, keys=SECRET, dedupe=PostgresDedupe(pool)))
        slow = asyncio.create_task(deliver(http, url, "evt_slow"))
        await started.wait()
        copies = await asyncio.wait_for(asyncio.gather(*(deliver(http, url, "evt_slow") for _ in range(6))), 5)
        other = await asyncio.wait_for(deliver(http, url, "evt_other"), 5)
        finish.set()
        assert (await slow)[0] == 200
        assert [(status, retry_after) for status, _body, retry_after in copies] == [(409, "5")] * 6
        assert other[0] == 200
        status, body, _retry_after = await deliver(http, url, "evt_slow")
        assert (status, body) == (200, {"id": "evt_slow", "duplicate": True})
        assert calls == ["evt_slow", "evt_other"]
    finally:
        finish.set()
        await pool.close()
