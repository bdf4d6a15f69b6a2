"""Connection pools. Every billing operation takes a pool or connection and runs its own transaction."""

from __future__ import annotations

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
