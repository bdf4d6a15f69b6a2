"""Helpers for the ledger-core integration tests: build accounts, endpoints and deliveries on a
real database, and read back the end state (ledger rows by id, balances, delivery rows).

Endpoints have no creation API yet, so they are inserted with SQL. Everything else goes
through the code under test; the few tests that must bypass the app say so where they do.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime

import asyncpg

from billing import accounts, ids, messages
from billing.audit import audit
from delivery.engine import claims

LEASE_MS_LONG = 3_600_000  # no lease in these tests expires by itself; tests expire them on purpose
_order_numbers = iter(range(1, 10**9))


def order_id(account_id: uuid.UUID) -> str:
    """An order id unique across the database (ledger ids are global, accounts are not)."""
    return f"order-{account_id}-{next(_order_numbers)}"


async def make_account(pool: asyncpg.Pool, *, balance: int = 0, price: int = 1, name: str = "acme") -> uuid.UUID:
    account = await accounts.create_account(pool, name, price_per_delivery=price)
    if balance:
        await accounts.top_up(pool, account.id, order_id(account.id), balance)
    return account.id


async def add_endpoint(
    pool: asyncpg.Pool,
    account_id: uuid.UUID,
    *,
    event_types: list[str] | None = None,
    enabled: bool = True,
    deleted: bool = False,
) -> uuid.UUID:
    endpoint_id = ids.new_id()
    await pool.execute(
        "INSERT INTO endpoints (id, account_id, url, event_types, enabled, deleted_at)"
        " VALUES ($1, $2, $3, $4, $5, CASE WHEN $6 THEN now() END)",
        endpoint_id, account_id, f"https://example.com/hooks/{endpoint_id}", event_types, enabled, deleted,
    )
    return endpoint_id


async def create(
    pool: asyncpg.Pool,
    account_id: uuid.UUID,
    *,
    event_type: str = "invoice.paid",
    payload: bytes = b'{"n": 1}',
    key: str | None = None,
    attempts_max: int = 3,
) -> messages.MessageCreated:
    request = messages.MessageRequest(account_id, event_type, payload, key)
    return await messages.create_message(pool, request, attempts_max=attempts_max)


async def one_delivery(pool: asyncpg.Pool, account_id: uuid.UUID, *, attempts_max: int = 3) -> uuid.UUID:
    """Create a message on an account that has exactly one subscribed endpoint; return the delivery id."""
    created = await create(pool, account_id, attempts_max=attempts_max)
    assert len(created.deliveries) == 1, created
    return created.deliveries[0].id


async def claim(pool: asyncpg.Pool, delivery_id: uuid.UUID) -> claims.Claimed:
    account_id = await pool.fetchval("SELECT account_id FROM deliveries WHERE id = $1", delivery_id)
    (claimed,) = await claims.claim_ids(pool, [claims.DeliveryKey(account_id, delivery_id)], lease_ms=LEASE_MS_LONG)
    return claimed


async def expire_lease(pool: asyncpg.Pool, delivery_id: uuid.UUID) -> None:
    """Force a sending lease into the past (what a stalled worker leaves behind)."""
    status = await pool.execute(
        "UPDATE deliveries SET leased_until = now() - interval '1 second' WHERE id = $1 AND state = 'sending'",
        delivery_id,
    )
    assert status == "UPDATE 1", status


async def delivery(pool: asyncpg.Pool, delivery_id: uuid.UUID) -> asyncpg.Record:
    row = await pool.fetchrow(
        "SELECT id, account_id, state, attempt, attempts_max, price, dead_reason, next_attempt_at, leased_until"
        " FROM deliveries WHERE id = $1",
        delivery_id,
    )
    assert row is not None, delivery_id
    return row


async def entries_of(pool: asyncpg.Pool, delivery_id: uuid.UUID) -> dict[str, int]:
    """The delivery's ledger rows: id -> amount."""
    rows = await pool.fetch("SELECT id, amount FROM ledger_entries WHERE delivery_id = $1", delivery_id)
    return {row["id"]: row["amount"] for row in rows}


async def balance(pool: asyncpg.Pool, account_id: uuid.UUID) -> int:
    return await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id)


async def ledger_sum(pool: asyncpg.Pool, account_id: uuid.UUID) -> int:
    return await pool.fetchval(
        "SELECT coalesce(sum(amount), 0)::bigint FROM ledger_entries WHERE account_id = $1", account_id
    )


async def row_counts(pool: asyncpg.Pool) -> dict[str, int]:
    """Rows in every table a refused operation must not touch."""
    tables = ("accounts", "messages", "deliveries", "ledger_entries", "delivery_attempts", "endpoints")
    return {table: await pool.fetchval(f"SELECT count(*) FROM {table}") for table in tables}


async def assert_audit_clean(pool: asyncpg.Pool, account_id: uuid.UUID | None = None) -> None:
    report = await audit(pool, account_id)
    assert report.clean, report.to_json()


async def assert_settled_once(pool: asyncpg.Pool, delivery_id: uuid.UUID, reason: str) -> None:
    """Dead with this reason, exactly one charge and one refund, nothing else."""
    row = await delivery(pool, delivery_id)
    assert (row["state"], row["dead_reason"], row["leased_until"]) == ("dead", reason, None)
    assert await entries_of(pool, delivery_id) == {
        ids.charge_id(delivery_id): -row["price"],
        ids.refund_id(delivery_id): row["price"],
    }


async def insert_raw_delivery(
    pool: asyncpg.Pool,
    account_id: uuid.UUID,
    endpoint_id: uuid.UUID,
    *,
    price: int = 1,
    charge_amount: int | None = -1,
    charge_account_id: uuid.UUID | None = None,
    move_balance: bool = True,
    created_at: datetime | None = None,
) -> uuid.UUID:
    """BYPASSES THE APP: a message, a pending delivery and (optionally) a charge written by raw SQL.

    Used only to build the broken histories that the settle checks and the audit must catch.
    `created_at`: when all three were written (default now), for an incremental audit's scope.
    """
    message_id, delivery_id = ids.new_id(), ids.new_id()
    async with pool.acquire() as connection, connection.transaction():
        await connection.execute(
            "INSERT INTO messages (id, account_id, event_type, payload, created_at)"
            " VALUES ($1, $2, 'raw.sql', '\\x00', coalesce($3, now()))",
            message_id, account_id, created_at,
        )
        await connection.execute(
            "INSERT INTO deliveries (id, account_id, message_id, endpoint_id, price, attempts_max, created_at)"
            " VALUES ($1, $2, $3, $4, $5, 3, coalesce($6, now()))",
            delivery_id, account_id, message_id, endpoint_id, price, created_at,
        )
        if charge_amount is not None:
            charged = charge_account_id or account_id
            await execute_unchecked(
                connection, "ledger_entries",
                "INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount, created_at)"
                " VALUES ($1, $2, $3, 'charge', $4, coalesce($5, now()))",
                ids.charge_id(delivery_id), charged, delivery_id, charge_amount, created_at,
            )
            if move_balance:
                await connection.execute(
                    "UPDATE accounts SET balance = balance + $2 WHERE id = $1", charged, charge_amount
                )
    return delivery_id


async def execute_unchecked(connection: asyncpg.Connection, table: str, statement: str, *arguments) -> None:
    """BYPASSES THE DATABASE'S REFERENCE CHECK of `table` (billing.references) for this one statement,
    inside the caller's transaction: to write a broken history that the audit and settle must catch."""
    assert connection.is_in_transaction(), "the trigger must be off for this statement only"
    await connection.execute(f"ALTER TABLE {table} DISABLE TRIGGER {table}_references")
    await connection.execute(statement, *arguments)
    await connection.execute(f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {table}_references")


async def recreate_trigger(pool: asyncpg.Pool, table: str, name: str, definition: str) -> None:
    """BYPASSES THE MIGRATIONS: trigger `name` on `table` dropped and created again as
    `CREATE TRIGGER <name> <definition>`, ENABLE ALWAYS, in one transaction: its name and its
    enabled state as the migration left them, what it does changed (for the audit's I5 and I8)."""
    async with pool.acquire() as connection, connection.transaction():
        await connection.execute(f"DROP TRIGGER {name} ON {table}")
        await connection.execute(f"CREATE TRIGGER {name} {definition}")
        await connection.execute(f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {name}")


async def until_statements_wait(pool: asyncpg.Pool, query_prefix: str, count: int = 1) -> None:
    """Until `count` statements of this database whose text starts with `query_prefix` wait on a
    lock (pg_stat_activity says so)."""
    for _ in range(500):
        waiting = await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query LIKE $1 || '%'", query_prefix)
        if waiting >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"fewer than {count} statements starting {query_prefix!r} ever waited on a lock")


async def holding_account_lock(pool: asyncpg.Pool, account_id: uuid.UUID, creates: list, *, waiting: str,
                               then: Callable[[asyncpg.Connection], Awaitable] | None = None) -> list:
    """Run `creates` while a transaction holds the account's row lock; once as many statements
    starting with `waiting` wait on it, run `then(holder)` in that transaction and commit. The
    creates' results. This makes an account change between a create's read and its write, or while
    its one statement waits, for certain."""
    async with pool.acquire() as holder:
        transaction = holder.transaction()
        await transaction.start()
        try:
            await holder.execute("SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE", account_id)
            task = asyncio.gather(*creates)
            await until_statements_wait(pool, waiting, count=len(creates))
            if then is not None:
                await then(holder)
        except BaseException:
            await transaction.rollback()
            raise
        await transaction.commit()
    return await task
