"""Alembic environment: runs migrations over asyncpg, the only PostgreSQL driver we ship.

The URL comes from `config.attributes["database_url"]` (set by delivery.platform.migrate) or the
DATABASE_URL environment variable when alembic is run by hand.
"""

from __future__ import annotations

import asyncio
import os

import asyncpg
from alembic import context
from sqlalchemy import pool
from sqlalchemy.ext.asyncio import create_async_engine

from billing.tables import metadata

target_metadata = metadata


def _database_url() -> str:
    url = context.config.attributes.get("database_url") or os.environ.get("DATABASE_URL")
    if not url:
        raise RuntimeError("no database URL: set DATABASE_URL or use `hookledger migrate`")
    return url


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    url = _database_url()
    engine = create_async_engine(
        "postgresql+asyncpg://", async_creator=lambda: asyncpg.connect(url), poolclass=pool.NullPool
    )
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (SQL script) mode is not supported; run against a database")
asyncio.run(_run_async())
