"""Fixtures for the signing integration tests: real aiohttp receivers on loopback, a client, stores."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from signing.dedupe import MemoryDedupeStore, RedisDedupeStore
from signing.dedupe_postgres import PostgresDedupe, create_receipts_table

RECEIVER_PATH = "/webhooks"


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Callable[[web.Request], Awaitable[web.StreamResponse]]], Awaitable[str]]]:
    """Starts a handler (or a whole app) on 127.0.0.1 on a free port; returns its URL."""
    runners: list[web.AppRunner] = []

    async def start(handler_or_app) -> str:
        if isinstance(handler_or_app, web.Application):
            app = handler_or_app
        else:
            app = web.Application()
            app.router.add_post(RECEIVER_PATH, handler_or_app)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}{RECEIVER_PATH}"

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100)) as session:
        yield session


@pytest.fixture
async def redis_client(redis_url: str):
    import redis.asyncio as redis_asyncio

    client = redis_asyncio.Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture(params=["memory", "redis", "postgres"])
def dedupe_backend(request):
    """Which store, with the server it needs; only that server's fixture is set up.

    A synchronous fixture, because pytest-asyncio cannot set up an async fixture from inside
    another async fixture's `getfixturevalue`.
    """
    if request.param == "memory":
        return ("memory", None)
    if request.param == "redis":
        return ("redis", request.getfixturevalue("redis_client"))
    return ("postgres", request.getfixturevalue("pool"))


@pytest.fixture
async def dedupe(dedupe_backend):
    """Each of the three stores, on real Redis and real PostgreSQL, as the receiver uses it."""
    kind, server = dedupe_backend
    if kind == "memory":
        return MemoryDedupeStore()
    if kind == "redis":
        return RedisDedupeStore(server)
    async with server.acquire() as connection:
        await create_receipts_table(connection)
        # Stands for the receiver's own data: written in the claim's transaction, so it must
        # hold exactly one row per webhook id however many copies arrive.
        await connection.execute("CREATE TABLE processed_events (webhook_id text NOT NULL)")
    return PostgresDedupe(server)
