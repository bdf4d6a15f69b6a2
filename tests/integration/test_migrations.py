"""The migrations and the declared tables agree, and the migrations run both ways."""

from __future__ import annotations

import uuid

import asyncpg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import pool as sa_pool
from sqlalchemy.ext.asyncio import create_async_engine

from billing.distribution import is_partition_name
from billing.tables import metadata
from delivery.platform import migrate


# The partitions of the distributed tables (HOOKLEDGER_ACCOUNT_PARTITIONS, migration 0023) are not
# declared: each is its table's copy, and so are the copies of a foreign key (one for each
# partition of the table it references) that PostgreSQL keeps beside the declared one.
def _declared(item, name, kind, reflected, compared_to) -> bool:
    if kind == "foreign_key_constraint":
        return not is_partition_name(item.referred_table.name)
    return not (kind == "table" and is_partition_name(name))


_OPTIONS = {"compare_type": True, "include_object": _declared,
            "include_name": lambda name, kind, parents: not (kind == "table" and is_partition_name(name))}


async def _differences(database_url: str) -> list:
    engine = create_async_engine(
        "postgresql+asyncpg://", async_creator=lambda: asyncpg.connect(database_url), poolclass=sa_pool.NullPool
    )
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(
                lambda sync: compare_metadata(MigrationContext.configure(sync, opts=_OPTIONS), metadata)
            )
    finally:
        await engine.dispose()


async def _tables(database_url: str) -> set[str]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {row["tablename"] for row in rows}
    finally:
        await connection.close()


async def test_upgrade_head_matches_the_declared_tables(database_url: str) -> None:
    """`alembic upgrade head` (the template) yields exactly the tables billing.tables declares."""
    assert await _differences(database_url) == []
    assert set(metadata.tables) <= await _tables(database_url)


async def test_downgrade_base_then_upgrade_again(database_url: str) -> None:
    """Downgrading to base drops every table (and the trigger function); upgrading restores them."""
    await migrate.downgrade_async(database_url)
    assert await _tables(database_url) <= {"alembic_version"}
    await migrate.upgrade_async(database_url)
    assert await _differences(database_url) == []


async def test_0010_marks_the_keyed_replays_made_before_it(database_url: str) -> None:
    """Upgrading from 0009 marks each delivery of a message keyed replay:<id> as a replay of <id>,
    when <id> is a delivery of the message's own account; a key naming another account's
    delivery, no delivery, or no uuid at all, and an unkeyed message, leave replay_of NULL."""
    await migrate.downgrade_async(database_url, "0009")
    connection = await asyncpg.connect(database_url)
    try:
        own, other = uuid.uuid4(), uuid.uuid4()
        for account_id in (own, other):
            await connection.execute("INSERT INTO accounts (id, name) VALUES ($1, 'a')", account_id)
            await connection.execute("INSERT INTO endpoints (id, account_id, url) VALUES ($1, $1, 'https://example.com')",
                                     account_id)  # the endpoint's id is its account's: one each
        dead = uuid.uuid4()
        keys = {"dead": (own, None), "replay": (own, f"replay:{dead}"), "elsewhere": (other, f"replay:{dead}"),
                "missing": (own, f"replay:{uuid.uuid4()}"), "malformed": (own, "replay:not-a-uuid"), "plain": (own, None)}
        made = {}
        for name, (account_id, key) in keys.items():
            message_id = delivery_id = dead if name == "dead" else uuid.uuid4()
            await connection.execute("INSERT INTO messages (id, account_id, event_type, payload, idempotency_key)"
                                     " VALUES ($1, $2, 't', '{}', $3)", message_id, account_id, key)
            await connection.execute("INSERT INTO deliveries (id, account_id, message_id, endpoint_id, price, attempts_max)"
                                     " VALUES ($1, $2, $1, $2, 1, 3)", delivery_id, account_id)
            made[name] = delivery_id
        await connection.execute("UPDATE deliveries SET state = 'dead', dead_reason = 'out_of_retries',"
                                 " finished_at = now() WHERE id = $1", dead)
    finally:
        await connection.close()
    await migrate.upgrade_async(database_url)
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch("SELECT id, replay_of FROM deliveries")
    finally:
        await connection.close()
    replay_of = {row["id"]: row["replay_of"] for row in rows}
    assert {name: replay_of[delivery_id] for name, delivery_id in made.items()} == {
        "dead": None, "replay": dead, "elsewhere": None, "missing": None, "malformed": None, "plain": None}
    assert await _differences(database_url) == []


async def test_0014_rate_limit_upgrades_and_downgrades_on_a_populated_database(database_url: str) -> None:
    """From 0013, an endpoint with its rows upgrades with no rate limit (NULL), takes one in 1..10,000
    and refuses 0; downgrading to 0013 drops the column and keeps the endpoint, its message and delivery."""
    await migrate.downgrade_async(database_url, "0013")
    connection = await asyncpg.connect(database_url)
    try:
        account_id = uuid.uuid4()
        await connection.execute("INSERT INTO accounts (id, name) VALUES ($1, 'a')", account_id)
        await connection.execute("INSERT INTO endpoints (id, account_id, url) VALUES ($1, $1, 'https://example.com')",
                                 account_id)
        await connection.execute("INSERT INTO messages (id, account_id, event_type, payload) VALUES ($1, $1, 't', '{}')",
                                 account_id)
        await connection.execute("INSERT INTO deliveries (id, account_id, message_id, endpoint_id, price, attempts_max)"
                                 " VALUES ($1, $1, $1, $1, 1, 3)", account_id)
        await migrate.upgrade_async(database_url)
        assert await connection.fetchval("SELECT rate_limit_per_second FROM endpoints WHERE id = $1", account_id) is None
        await connection.execute("UPDATE endpoints SET rate_limit_per_second = 10000 WHERE id = $1", account_id)
        with pytest.raises(asyncpg.CheckViolationError):
            await connection.execute("UPDATE endpoints SET rate_limit_per_second = 0 WHERE id = $1", account_id)
        await migrate.downgrade_async(database_url, "0013")
        columns = await connection.fetch("SELECT column_name FROM information_schema.columns WHERE table_name = 'endpoints'")
        assert "rate_limit_per_second" not in {row["column_name"] for row in columns}
        assert await connection.fetchval("SELECT count(*) FROM deliveries d JOIN endpoints e ON e.id = d.endpoint_id"
                                         " WHERE d.id = $1", account_id) == 1
        await migrate.upgrade_async(database_url)
    finally:
        await connection.close()
