"""Fixtures shared by every tier: real PostgreSQL and real Redis, one fresh database per test.

The server is DATABASE_URL when set, else an embedded PostgreSQL started for this run. A
template database is migrated once per run; each test gets `CREATE DATABASE ... TEMPLATE`,
dropped afterwards. The copies are made a test or two ahead and dropped behind, on threads of
their own (DatabaseSupply), so no test waits for either. Redis is REDIS_URL when set, else an
embedded redis-server of the run's own; each test starts on an empty Redis database.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import asyncpg
import pytest

from delivery.platform import migrate, services


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


class DatabaseSupply:
    """Copies of the template, made ahead of the tests that take them and dropped behind them.

    A copy made a test early is the same database as one made at the test's start (nothing
    writes to the template), and a copy given back is dropped WITH (FORCE) as before, just not
    waited for. Each CREATE DATABASE or DROP DATABASE costs 50-200 ms here, mostly the server
    flushing WAL; made on threads of their own, that time overlaps the tests instead of adding
    to them.
    """

    AHEAD = 2  # copies made ahead of the one in use: enough to keep up with a run of quick tests
    # Drops run on this many threads. Each DROP DATABASE waits for a checkpoint of the whole server,
    # which a loaded machine, or others' work on a shared server, stretches to seconds (half a
    # minute seen); drops that wait together share one checkpoint.
    DROPPERS = 4

    def __init__(self, server_url: str, template: str) -> None:
        self._server_url = server_url
        self._template = template
        self._creator = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hookledger-db-create")
        self._dropper = concurrent.futures.ThreadPoolExecutor(self.DROPPERS, thread_name_prefix="hookledger-db-drop")
        self._ready: collections.deque[concurrent.futures.Future[str]] = collections.deque()
        self._drops: list[concurrent.futures.Future[None]] = []

    def _create(self) -> str:
        name = f"hookledger_t_{uuid.uuid4().hex[:16]}"
        asyncio.run(_admin(self._server_url, f"CREATE DATABASE {name} TEMPLATE {self._template}"))
        return name

    def _drop(self, name: str) -> None:
        asyncio.run(_admin(self._server_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))

    async def take(self) -> str:
        """The name of a fresh copy of the template, of the caller's own."""
        while len(self._ready) <= self.AHEAD:
            self._ready.append(self._creator.submit(self._create))
        return await asyncio.wrap_future(self._ready.popleft())

    def give_back(self, name: str) -> None:
        """Drop a copy taken before (on a dropper thread; finish() waits for it)."""
        self._drops.append(self._dropper.submit(self._drop, name))

    def close(self) -> None:
        """Make no more copies, and drop the ones made and not taken."""
        self._creator.shutdown(wait=True)
        for future in self._ready:
            if future.exception() is None:
                self.give_back(future.result())
        self._ready.clear()

    def finish(self, seconds_max: float) -> None:
        """Wait until every drop is done, and raise the first drop that failed (or a TimeoutError
        naming how many were still running after seconds_max)."""
        _, running = concurrent.futures.wait(self._drops, timeout=seconds_max)
        if running:
            raise TimeoutError(f"{len(running)} test databases were still being dropped after {seconds_max} s")
        self._dropper.shutdown(wait=True)
        for future in self._drops:
            future.result()


# The drops still running once the last test has ended are waited for in pytest_sessionfinish: they
# are the run's cleanup, not the last test's, whose timeout they overran when a loaded server fell
# behind. A drop that hangs still fails the run, after DROPS_SECONDS_MAX.
DROPS_SECONDS_MAX = 1800
_closed_supplies: list[DatabaseSupply] = []


@pytest.fixture(scope="session")
def database_supply(postgres_server_url: str, template_database: str):
    supply = DatabaseSupply(postgres_server_url, template_database)
    yield supply
    supply.close()
    _closed_supplies.append(supply)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    while _closed_supplies:
        try:
            _closed_supplies.pop().finish(DROPS_SECONDS_MAX)
        except Exception as error:  # noqa: BLE001 - reported, and the run fails
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            message = f"dropping the tests' databases failed: {error!r}"
            if reporter is not None:
                reporter.write_line(message, red=True)
            else:
                print(message)


@pytest.fixture
async def database_url(postgres_server_url: str, database_supply: DatabaseSupply) -> str:
    """A freshly migrated database of this test's own."""
    name = await database_supply.take()
    yield services.with_database(postgres_server_url, name)
    database_supply.give_back(name)


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
