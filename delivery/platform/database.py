"""Open the platform's database: the configured server or an embedded one, migrated on request."""

from __future__ import annotations

import asyncpg

from billing.database import create_pool
from delivery.platform import migrate, services
from delivery.platform.config import Settings
from delivery.errors import ServerUnreachableError, server_address

async def open_pool(settings: Settings, *, run_migrations: bool = False) -> asyncpg.Pool:
    url = services.database_url(settings.database)
    try:
        if run_migrations:
            await migrate.upgrade_async(url)
        return await create_pool(url, size_min=settings.database.pool_size_min,
                                 size_max=settings.database.pool_size_max)
    except (OSError, asyncpg.CannotConnectNowError) as error:
        raise ServerUnreachableError(f"PostgreSQL at {server_address(url)} (DATABASE_URL): {error}") from error
