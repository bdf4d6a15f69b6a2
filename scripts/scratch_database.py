"""A migrated database of a benchmark's own on the server it is given, and a Redis database of
its own, each emptied or dropped when the benchmark ends, on an error too. A benchmark that
starts servers against them stops those servers inside the `async with`, before the drop."""

from __future__ import annotations

import argparse
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

from delivery.platform import migrate, services


def server_url_from_environment() -> str:
    """DATABASE_URL, the server the scratch database is made on; exits with a clear line if unset."""
    server_url = os.environ.get("DATABASE_URL")
    if not server_url:
        raise SystemExit("set DATABASE_URL (a server where this may create and drop a database)")
    return server_url


@contextlib.asynccontextmanager
async def scratch_database(server_url: str, prefix: str = "hookledger_bench") -> AsyncIterator[str]:
    """Create `<prefix>_<random>`, migrate it and yield its URL; drop it afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(server_url)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
        try:
            database_url = services.with_database(server_url, name)
            await migrate.upgrade_async(database_url)
            yield database_url
        finally:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


@contextlib.asynccontextmanager
async def scratch_redis(url: str, database: int) -> AsyncIterator[str]:
    """Database `database` of the Redis server at `url`, emptied before and after: a benchmark's
    jobs must not outlive it (where no worker runs, the API's wake-up jobs would stay queued)."""
    redis_url = dedicated_redis(url, database)
    await flush_redis(redis_url)
    try:
        yield redis_url
    finally:
        await flush_redis(redis_url)


def add_redis_db_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-db", type=int, default=15,
                        help="a Redis database number of the bench's own, emptied before and after (default: 15)")


def dedicated_redis(url: str, database: int) -> str:
    """The same Redis server, database `database` (redis:// and rediss:// name it in the path,
    unix:// in `db=`, beside the URL's other parameters)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        query = [(key, value) for key, value in parse_qsl(parts.query) if key != "db"] + [("db", str(database))]
        return urlunsplit(parts._replace(query=urlencode(query)))
    return urlunsplit(parts._replace(path=f"/{database}"))


async def flush_redis(redis_url: str) -> None:
    """Empty that Redis database (a benchmark's own: its jobs must not outlive it)."""
    import redis.asyncio as redis_asyncio

    client = redis_asyncio.Redis.from_url(redis_url)
    try:
        await client.flushdb()
    finally:
        await client.aclose()
