"""Fixtures shared by every tier: real PostgreSQL and real Redis, one fresh database per test.

The server is DATABASE_URL when set, else an embedded PostgreSQL started for this run. A
template database is migrated once per run; each test gets `CREATE DATABASE ... TEMPLATE`,
dropped afterwards. Redis is REDIS_URL when set, else an embedded redis-server of the run's own; each test
starts on an empty Redis database.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import asyncpg
import pytest

from delivery import migrate, services


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    data_dir = Path(tempfile.mkdtemp(prefix="hookledger-test-")) / "postgres"
    return services.start_embedded_postgres(data_dir, delete_on_exit=True)


async def _admin(server_url: str, *statements: str) -> None:
    connection = await asyncpg.connect(server_url)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


@pytest.fixture(scope="session")
def template_database(postgres_server_url: str) -> str:
    name = f"hookledger_tpl_{os.getpid()}"
    asyncio.run(_admin(postgres_server_url, f"DROP DATABASE IF EXISTS {name}", f"CREATE DATABASE {name}"))
    migrate.upgrade(services.with_database(postgres_server_url, name))
    yield name
    asyncio.run(_admin(postgres_server_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


def _run_alone(coroutine) -> None:
    """Run a coroutine to completion on a fresh event loop in its own thread (safe inside a running loop)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as executor:
        executor.submit(asyncio.run, coroutine).result()


@pytest.fixture(scope="session")
def make_database(postgres_server_url: str, template_database: str):
    """A factory of extra migrated databases, for fixtures wider than one test; all dropped at the end."""
    names: list[str] = []

    def make(prefix: str = "hookledger_x") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        _run_alone(_admin(postgres_server_url, f"CREATE DATABASE {name} TEMPLATE {template_database}"))
        names.append(name)
        return services.with_database(postgres_server_url, name)

    yield make
    for name in names:
        _run_alone(_admin(postgres_server_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture
async def database_url(postgres_server_url: str, template_database: str) -> str:
    """A freshly migrated database of this test's own."""
    name = f"hookledger_t_{uuid.uuid4().hex[:16]}"
    await _admin(postgres_server_url, f"CREATE DATABASE {name} TEMPLATE {template_database}")
    yield services.with_database(postgres_server_url, name)
    await _admin(postgres_server_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
async def pool(database_url: str) -> asyncpg.Pool:
    from billing.database import create_pool

    pool = await create_pool(database_url, size_min=1, size_max=40)
    yield pool
    await pool.close()


@pytest.fixture(scope="session")
def redis_server_url() -> str:
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    return services.start_embedded_redis()


@pytest.fixture
async def redis_url(redis_server_url: str) -> str:
    """The Redis server, emptied for this test."""
    import redis.asyncio as redis_asyncio

    client = redis_asyncio.Redis.from_url(redis_server_url)
    try:
        await client.flushdb()
    finally:
        await client.aclose()
    return redis_server_url


@pytest.fixture
def private_redis():
    """A Redis server of the test's own, to stop and start again mid-test without disturbing the shared one."""
    data_dir = Path(tempfile.mkdtemp(prefix="hl-redis-"))  # short: a unix socket's path has a length limit
    server = services.RedisProcess(data_dir)
    server.start()
    yield server
    server.stop()
    shutil.rmtree(data_dir, ignore_errors=True)
