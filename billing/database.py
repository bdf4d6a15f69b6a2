"""Connection pools. Every billing operation takes a pool or connection and runs its own transaction."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg


async def create_pool(database_url: str, *, size_min: int = 2, size_max: int = 10) -> asyncpg.Pool:
    return await asyncpg.create_pool(
        database_url,
        min_size=size_min,
        max_size=size_max,
        # Statements are prepared per connection and reused: most of our traffic is the same
        # few statements, so this saves a parse and plan on every call.
        statement_cache_size=256,
        server_settings={"application_name": "hookledger"},
    )


Executor = asyncpg.Pool | asyncpg.Connection


@contextlib.asynccontextmanager
async def transaction(executor: Executor) -> AsyncIterator[asyncpg.Connection]:
    """One transaction on a connection from the pool, or on the given connection.

    On a connection already inside a transaction this is a savepoint, so an operation called
    from a caller's transaction still rolls back alone when it raises.
    """
    if isinstance(executor, asyncpg.Pool):
        async with executor.acquire() as connection, connection.transaction():
            yield connection
    else:
        async with executor.transaction():
            yield executor
