"""The dashboard's endpoint form when the connection breaks at its COMMIT: the page says what the
API says (write-failed when nothing was written, write-outcome-unknown naming the endpoint when it
cannot tell), and the endpoint exists at most once. The breaks are real (commit_cutter.py)."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestServer

from billing.database import create_pool
from commit_cutter import CommitCutter
from dashboard_helpers import Dashboard, dashboard_environment
from delivery.platform import config
from delivery.engine import queue as job_queue
from delivery.platform.web_app import create_app

_FORM = {"url": "https://example.com/x", "event_types": ""}


async def test_the_endpoint_form_at_a_lost_commit(database_url, redis_url, pool):
    cutter = await CommitCutter(database_url).start()
    cut_pool = await create_pool(cutter.url(), size_min=1, size_max=4)
    settings = config.load({**dashboard_environment(database_url, redis_url), "HOOKLEDGER_COMMIT_OUTCOME_WAIT_SECONDS": "1"})
    redis = await job_queue.connect(redis_url)
    server = TestServer(create_app(settings, cut_pool, job_queue.Queue(redis)), host="127.0.0.1")
    await server.start_server()
    dash = Dashboard(str(server.make_url("")).rstrip("/"), pool)
    endpoints = "SELECT count(*) FROM endpoints"
    try:
        _, key = await dash.account()
        await dash.sign_in(key)

        async def submit(mode: str):
            await dash.page("/dashboard/endpoints")
            cutter.arm(mode)
            return await dash.post("/dashboard/endpoints", _FORM)

        response, html = await submit("before")
        assert response.status == 503 and "nothing was written" in html, html[:2000]
        assert await pool.fetchval(endpoints) == 0
        response, html = await submit("hold")
        assert response.status == 503 and "GET /v1/endpoints/" in html, html[:2000]
        cutter.release()  # the held COMMIT goes through: that endpoint exists, once
        for _ in range(200):
            if await pool.fetchval(endpoints) == 1:
                break
            await asyncio.sleep(0.05)
        assert await pool.fetchval(endpoints) == 1
        response, _ = await submit("after")  # written behind the lost answer: the usual redirect
        assert response.status == 303 and await pool.fetchval(endpoints) == 2
        assert cutter.cuts == 3
    finally:
        await dash.close()
        await server.close()
        await redis.aclose()
        await cut_pool.close()
        await cutter.close()
