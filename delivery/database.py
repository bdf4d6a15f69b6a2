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


def lost_database(error: BaseException) -> bool:
    """Whether the database going away caused this error: it is one of UNAVAILABLE, or one led to
    it (asyncpg's transaction exit on a connection closed mid-query raises InterfaceError instead,
    with the real cause as its context)."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, UNAVAILABLE):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


async def open_pool(settings: Settings, *, run_migrations: bool = False) -> asyncpg.Pool:
    url = services.database_url(settings.database)
    try:
        if run_migrations:
            await migrate.upgrade_async(url)
        return await create_pool(url, size_min=settings.database.pool_size_min,
                                 size_max=settings.database.pool_size_max)
    except (OSError, asyncpg.CannotConnectNowError) as error:
        raise ServerUnreachableError(f"PostgreSQL at {services.server_address(url)} (DATABASE_URL): {error}") from error
