"""Fixtures for the SDK integration tests: the real API app on a loopback port (aiohttp TestServer
in the test's event loop), on this test's own PostgreSQL database and an emptied Redis.

The async client runs in the test's loop beside the server; the blocking client runs in a thread
(`asyncio.to_thread`) so the loop stays free to answer it.
"""

from __future__ import annotations

import dataclasses

import pytest
from aiohttp.test_utils import TestServer

from delivery.platform import config
from delivery.engine import queue as job_queue
from delivery.platform.web_app import create_app
from delivery.client import AsyncClient
from signing import Keyring, format_keyring, generate_at_rest_key

OPERATOR_KEY = "op_sdk_test_" + "k" * 32


def _settings(database_url: str, redis_url: str) -> config.Settings:
    settings = config.load({"DATABASE_URL": database_url, "REDIS_URL": redis_url})
    api = dataclasses.replace(settings.api, operator_key=OPERATOR_KEY, dev_mode=True)
    return dataclasses.replace(settings, api=api,
                               secret_keyring=format_keyring(Keyring({"k1": generate_at_rest_key()}, "k1")))


@pytest.fixture
def api_settings(database_url, redis_url) -> config.Settings:
    """The API's settings for these tests (a fixture, not an import: two conftest modules collide
    in sys.modules when tests/unit/sdk and this directory run in one pytest call)."""
    return _settings(database_url, redis_url)


@pytest.fixture
async def base_url(api_settings, redis_url, pool):
    redis = await job_queue.connect(redis_url)
    server = TestServer(create_app(api_settings, pool, job_queue.Queue(redis)), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()
        await redis.aclose()


@pytest.fixture
def operator_key() -> str:
    return OPERATOR_KEY


@pytest.fixture
async def operator(base_url):
    async with AsyncClient(base_url, OPERATOR_KEY, retries=0) as client:
        yield client


@pytest.fixture
async def account(operator):
    """A new account with 100 credits at 2 per delivery: (its AccountCreated, its API key)."""
    created = await operator.accounts.create("acme", price_per_delivery=2)
    await operator.accounts.top_up(created.account.id, "order-1", 100)
    return created, created.api_key.key


@pytest.fixture
async def sdk(base_url, account):
    async with AsyncClient(base_url, account[1], retries=0) as client:
        yield client
