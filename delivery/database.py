"""Open the platform's database: the configured server or an embedded one, migrated on request."""

from __future__ import annotations

import asyncpg

from billing.database import create_pool
from delivery import migrate, services
from delivery.config import Settings
from delivery.errors import ServerUnreachableError

# PostgreSQL not there: restarting, refusing connections, gone mid-query, or out of connections.
# What the API answers with a 503 and the worker's jobs log in one line; the work is retried.
# FileNotFoundError: a unix-socket server (the embedded one) whose socket file is gone while it
# restarts; connecting then fails with that, not with a ConnectionError (69 500s in a chaos run).
UNAVAILABLE = (asyncpg.PostgresConnectionError, asyncpg.CannotConnectNowError, asyncpg.AdminShutdownError,
               asyncpg.CrashShutdownError, asyncpg.TooManyConnectionsError, ConnectionError, FileNotFoundError)


async def open_pool(settings: Settings, *, run_migrations: bool = False) -> asyncpg.Pool:
    url = services.database_url(settings.database)
    try:
        if run_migrations:
            await migrate.upgrade_async(url)
        return await create_pool(url, size_min=settings.database.pool_size_min,
                                 size_max=settings.database.pool_size_max)
    except (OSError, asyncpg.CannotConnectNowError) as error:
        raise ServerUnreachableError(f"PostgreSQL at {services.server_address(url)} (DATABASE_URL): {error}") from error
