"""Which driver errors mean PostgreSQL went away, for the API's 503 and the worker's one-line logs."""

from __future__ import annotations

import asyncpg

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
