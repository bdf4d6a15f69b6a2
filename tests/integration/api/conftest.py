"""Fixtures for the API tests: the real app on loopback (aiohttp TestServer), real PostgreSQL and
Redis, an operator key, and a harness that makes accounts, endpoints and counts rows."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from billing.database import create_pool
from billing.message_direct import DIRECT_WRITE
from billing.message_plan import GATED_WRITE, GATED_WRITE_REPLAYS
from delivery.platform import config
from delivery.engine import queue as job_queue
from delivery.platform.web_app import create_app
from signing import format_keyring, generate_at_rest_key
from signing.at_rest import Keyring

from commit_cutter import CommitCutter

OPERATOR_KEY = "op_test_" + "x" * 40


def api_settings(database_url: str, redis_url: str, **api_changes) -> config.Settings:
    settings = config.load({"DATABASE_URL": database_url, "REDIS_URL": redis_url, "HOOKLEDGER_ATTEMPTS_MAX": "3"})
    keyring = format_keyring(Keyring({"k1": generate_at_rest_key()}, "k1"))
    api = dataclasses.replace(
        settings.api, operator_key=OPERATOR_KEY, dev_mode=True, **api_changes
    )
    return dataclasses.replace(settings, api=api, secret_keyring=keyring)


class Harness:
    """The client plus shortcuts; every shortcut goes through the API itself."""

    def __init__(self, client: TestClient, pool: asyncpg.Pool, settings: config.Settings) -> None:
        self.client = client
        self.pool = pool
        self.settings = settings
        self.operator = {"Authorization": f"Bearer {OPERATOR_KEY}"}

    @staticmethod
    def bearer(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    async def account(self, *, balance: int = 0, price: int = 1, name: str = "acme") -> tuple[uuid.UUID, dict]:
        """A new account (topped up when balance > 0); returns its id and its auth headers."""
        response = await self.client.post("/v1/accounts", json={"name": name, "price_per_delivery": price},
                                          headers=self.operator)
        assert response.status == 201, await response.text()
        body = await response.json()
        account_id = uuid.UUID(body["account"]["id"])
        if balance:
            response = await self.client.post(
                f"/v1/accounts/{account_id}/topups", json={"order_id": f"o-{uuid.uuid4().hex}", "amount": balance},
                headers=self.operator,
            )
            assert response.status == 201, await response.text()
        return account_id, self.bearer(body["api_key"]["key"])

    async def endpoint(self, headers: dict, **fields) -> dict:
        fields.setdefault("url", "https://example.com/hooks")
        response = await self.client.post("/v1/endpoints", json=fields, headers=headers)
        assert response.status == 201, await response.text()
        return await response.json()

    async def send(self, headers: dict, event_type: str = "invoice.paid", payload=None, key: str | None = None):
        extra = {"Idempotency-Key": key} if key else {}
        return await self.client.post(
            "/v1/messages", json={"event_type": event_type, "payload": payload if payload is not None else {"n": 1}},
            headers={**headers, **extra},
        )

    async def counts(self) -> dict[str, int]:
        """Rows in every table a request could write."""
        tables = ("accounts", "api_keys", "endpoints", "messages", "deliveries", "ledger_entries")
        row = await self.pool.fetchrow("SELECT " + ", ".join(f"(SELECT count(*) FROM {t}) AS {t}" for t in tables))
        return dict(row)

    async def snapshot(self) -> tuple:
        """Counts plus every mutable column that a refused request must leave alone."""
        accounts = await self.pool.fetch("SELECT id, status, balance, name FROM accounts ORDER BY id")
        endpoints = await self.pool.fetch(
            "SELECT id, url, description, event_types, enabled, timeout_ms, secret, deleted_at, previous_secret,"
            " signing_key_type, headers, rate_limit_per_second FROM endpoints ORDER BY id"
        )
        keys = await self.pool.fetch("SELECT id, revoked_at FROM api_keys ORDER BY id")
        return await self.counts(), [tuple(r) for r in accounts], [tuple(r) for r in endpoints], [tuple(r) for r in keys]


@pytest.fixture
async def queue(redis_url):
    redis = await job_queue.connect(redis_url)
    yield job_queue.Queue(redis)
    await redis.aclose()


@pytest.fixture
def settings(database_url, redis_url) -> config.Settings:
    return api_settings(database_url, redis_url)


@pytest.fixture
async def client(settings, pool, queue):
    app = create_app(settings, pool, queue)
    async with TestClient(TestServer(app, host="127.0.0.1")) as test_client:
        yield test_client


@pytest.fixture
def api(client, pool, settings) -> Harness:
    return Harness(client, pool, settings)


@pytest.fixture
async def cutter(database_url):
    """A proxy to this test's database that breaks a connection at its COMMIT or at a create's
    autocommit write (commit_cutter.py), when armed."""
    cutter = await CommitCutter(database_url, statements=(DIRECT_WRITE, GATED_WRITE, GATED_WRITE_REPLAYS)).start()
    yield cutter
    await cutter.close()


@pytest.fixture
async def cut_pool(cutter):
    """A pool whose connections run through the cutter."""
    pool = await create_pool(cutter.url(), size_min=1, size_max=4)
    yield pool
    try:  # a failed test may leave a coalescer holding connections, which close() would wait for
        await asyncio.wait_for(pool.close(), 5)
    except asyncio.TimeoutError:
        pool.terminate()
