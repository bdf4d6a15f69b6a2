"""Waiting for the API apps' LISTEN connections (delivery.api.cache_notices): key revocations and
cache notices are heard only once an app listens, and (re)starting to listen empties its caches."""

from __future__ import annotations

import asyncio
import time

LISTENING_WITHIN_SECONDS = 30  # the listeners start with the app, or RELISTEN_DELAY_SECONDS after a loss


async def until_listening(pool, apps: int = 2, not_on: list[int] = ()) -> None:
    """The apps (both, by default) hold their LISTEN (it starts with the app, on a connection of its
    own), on connections other than `not_on`."""
    started = time.monotonic()
    while time.monotonic() - started < LISTENING_WITHIN_SECONDS:
        listeners = await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'"
            " AND NOT (pid = ANY($1::int[]))", list(not_on))
        if listeners >= apps:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{apps} listeners did not start within {LISTENING_WITHIN_SECONDS} s")
