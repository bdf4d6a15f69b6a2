"""A migrated database of a benchmark's own on the server it is given, and a Redis database of
its own, each emptied or dropped when the benchmark ends, on an error too. A benchmark that
starts servers against them stops those servers inside the `async with`, before the drop."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

from billing.distribution import PARTITIONS_MAX, PARTITIONS_VARIABLE
from delivery.platform import migrate, services

ROOT = Path(__file__).resolve().parents[1]


def server_url_from_environment() -> str:
    """DATABASE_URL, the server the scratch database is made on; exits with a clear line if unset."""
    server_url = os.environ.get("DATABASE_URL")
    if not server_url:
        raise SystemExit("set DATABASE_URL (a server where this may create and drop a database)")
    return server_url


# The migrations' option that creates the account-scoped tables hash-partitioned by account_id
# (billing.distribution: 1, or unset, for plain tables; at most PARTITIONS_MAX). A benchmark's
# --partitions sets it per database.


@contextlib.asynccontextmanager
async def scratch_database(server_url: str, prefix: str = "hookledger_bench",
                           partitions: int | None = None) -> AsyncIterator[str]:
    """Create `<prefix>_<random>`, migrate it and yield its URL; drop it afterwards. With
    `partitions`, the migrations run in a process of their own with HOOKLEDGER_ACCOUNT_PARTITIONS
    set to it (unset for 1), whatever this process's environment says; without, as they always did."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(server_url)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
        try:
            database_url = services.with_database(server_url, name)
            if partitions is None:
                await migrate.upgrade_async(database_url)
            else:
                await migrate_with_partitions(database_url, partitions)
            yield database_url
        finally:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    finally:
        await admin.close()


async def migrate_with_partitions(database_url: str, partitions: int) -> None:
    """`hookledger migrate` on that database, in its own process, the option set to `partitions`."""
    environment = {key: value for key, value in os.environ.items() if key != PARTITIONS_VARIABLE}
    environment["DATABASE_URL"] = database_url
    if partitions > 1:
        environment[PARTITIONS_VARIABLE] = str(partitions)
    process = await asyncio.create_subprocess_exec(sys.executable, "-m", "delivery", "migrate", env=environment,
                                                   cwd=ROOT, stdout=subprocess.DEVNULL)
    if await process.wait() != 0:
        raise SystemExit(f"the migrations with {PARTITIONS_VARIABLE}={partitions} failed (exit {process.returncode})")
    layout = await partitioned_tables(database_url)
    # A migration that ignored the option would make every count the same plain schema, and the
    # comparison would say nothing: each partitioned table must have exactly that many partitions.
    if (partitions > 1 and not layout) or any(children != partitions for children in layout.values()):
        raise SystemExit(f"{PARTITIONS_VARIABLE}={partitions} made these partitioned tables (table: partitions):"
                         f" {layout or 'none'}")


async def partitioned_tables(database_url: str) -> dict[str, int]:
    """Each partitioned table of the database and its number of partitions."""
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "SELECT partitioned.partrelid::regclass::text AS name, count(child.inhrelid) AS children"
            " FROM pg_partitioned_table partitioned LEFT JOIN pg_inherits child ON child.inhparent = partitioned.partrelid"
            " GROUP BY partitioned.partrelid ORDER BY 1")
    finally:
        await connection.close()
    return {row["name"]: row["children"] for row in rows}


def partition_counts(text: str) -> list[int]:
    """--partitions: one or more distinct whole numbers of 1 to PARTITIONS_MAX, comma-separated."""
    try:
        values = [int(n) for n in text.split(",")]
    except ValueError:
        values = []
    if not values or len(set(values)) != len(values) or not all(1 <= value <= PARTITIONS_MAX for value in values):
        raise argparse.ArgumentTypeError(
            f"a comma-separated list of distinct whole numbers 1 to {PARTITIONS_MAX}, got {text!r}")
    return values


def add_partitions_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--partitions", type=partition_counts, default=None, metavar="COUNTS",
                        help="run the same load on a fresh database per count (say 1,8), migrated with"
                             f" {PARTITIONS_VARIABLE} set to it (1: unset), and report each beside the first")


def ratio(value: float, first: float) -> float:
    """value / first, NaN where the first is zero or missing (a run that made nothing)."""
    return value / first if first else float("nan")


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


async def run_per_partition_count(counts: list[int], server_url: str, server_redis_url: str, redis_db: int,
                                  run) -> dict[int, object]:
    """`await run(database_url, redis_url)` once per account partition count, in the order given,
    each on a fresh database migrated with that many partitions and a flushed Redis database."""
    results = {}
    for count in counts:
        print(f"-- {count} account partition(s) ({PARTITIONS_VARIABLE}={count if count > 1 else 'unset'})", flush=True)
        async with (scratch_database(server_url, partitions=count) as database_url,
                    scratch_redis(server_redis_url, redis_db) as redis_url):
            results[count] = await run(database_url, redis_url)
    return results


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
