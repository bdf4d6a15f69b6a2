"""A migrated database of a benchmark's own on the server it is given, dropped when the benchmark
ends, on an error too (the throughput benchmarks that start servers against it manage their own)."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator

import asyncpg

from delivery import migrate, services


def server_url_from_environment() -> str:
    """DATABASE_URL, the server the scratch database is made on; exits with a clear line if unset."""
    server_url = os.environ.get("DATABASE_URL")
    if not server_url:
        raise SystemExit("set DATABASE_URL (a server where this may create and drop a database)")
    return server_url


@contextlib.asynccontextmanager
async def scratch_database(server_url: str) -> AsyncIterator[str]:
    """Create `hookledger_bench_<random>`, migrate it and yield its URL; drop it afterwards."""
    name = f"hookledger_bench_{uuid.uuid4().hex[:10]}"
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
