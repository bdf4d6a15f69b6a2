"""A keyed create whose first attempt is still running on the server when the SDK's retry count is
spent: the SDK asks again with the key until that attempt's own answer comes (raising 409
idempotency-key-in-use without the key it had generated would leave the caller's only move, calling
again, to make a second endpoint once the create happened). Served as `hookledger api` serves
(web.AppRunner: a handler is not cancelled when its client times out), unlike the TestServer."""

from __future__ import annotations

import asyncio

from aiohttp import web

from delivery.engine import queue as job_queue
from delivery.platform.web_app import create_app
from delivery.client import AsyncClient
from delivery.platform.run import free_port


async def test_a_create_held_past_the_retries_returns_the_one_endpoint_made(api_settings, redis_url, pool, account):
    created, key = account
    redis = await job_queue.connect(redis_url)
    runner = web.AppRunner(create_app(api_settings, pool, job_queue.Queue(redis)), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    blocker = await pool.acquire()
    try:
        holding = blocker.transaction()
        await holding.start()
        # Something holds the account row a while (a slow batch, a deletion step): the create waits on it.
        await blocker.execute("SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE", created.account.id)
        asyncio.get_running_loop().call_later(3.0, lambda: asyncio.ensure_future(holding.rollback()))
        async with AsyncClient(f"http://127.0.0.1:{port}", key, timeout=0.5) as sdk:  # default: 2 retries
            endpoint = await sdk.endpoints.create("https://example.com/once")
        rows = await pool.fetch("SELECT id FROM endpoints WHERE account_id = $1", created.account.id)
        assert [row["id"] for row in rows] == [endpoint.id]
    finally:
        await pool.release(blocker)
        await runner.cleanup()
        await redis.aclose()
