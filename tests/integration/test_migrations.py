"""The migrations and the declared tables agree, and the migrations run both ways."""

from __future__ import annotations

import asyncpg
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import pool as sa_pool
from sqlalchemy.ext.asyncio import create_async_engine

from billing.tables import metadata
from delivery import migrate


async def _differences(database_url: str) -> list:
    engine = create_async_engine(
        "postgresql+asyncpg://", async_creator=lambda: asyncpg.connect(database_url), poolclass=sa_pool.NullPool
    )
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(
                lambda sync: compare_metadata(MigrationContext.configure(sync, opts={"compare_type": True}), metadata)
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
