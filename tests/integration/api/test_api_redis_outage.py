"""The API while Redis is down: what it accepts is committed and answered as usual (the wake-ups are
hints, and the worker sweeps from PostgreSQL); /readyz says Redis is unreachable; once Redis is back,
new messages wake the workers through it again."""

from __future__ import annotations

import asyncio
import logging
import re

from aiohttp.test_utils import TestClient, TestServer

from delivery.engine import queue as job_queue
from delivery.platform.web_app import create_app


async def test_messages_and_deletions_are_accepted_while_redis_is_down(api, pool, private_redis, caplog):
    """(Wake-ups failing against a Redis that never answers are in test_api_messages; this one stops
    and starts a real server, and covers the account deletion, whose job could not be enqueued.)

    The outage is one warning, not one per wake-up call, and its end is one line with the count of
    deliveries left to the sweeper."""
    caplog.set_level(logging.WARNING, logger="delivery.api.group_commit")
    settings = api.settings
    redis = await job_queue.connect(private_redis.url)
    try:
        async with TestClient(TestServer(create_app(settings, pool, job_queue.Queue(redis)), host="127.0.0.1")) as client:
            api = type(api)(client, pool, settings)  # the harness, on the app whose Redis is private_redis
            _, headers = await api.account(balance=100)
            await api.endpoint(headers)
            doomed, _ = await api.account(balance=10)

            private_redis.stop()
            response = await api.send(headers)
            assert response.status == 202, await response.text()
            message_id = (await response.json())["id"]
            assert await pool.fetchval("SELECT count(*) FROM deliveries WHERE message_id = $1 AND state = 'pending'",
                                       message_id) == 1
            for _ in range(30):  # thirty wake-ups' worth over 1.5 s
                assert (await api.send(headers)).status == 202
                await asyncio.sleep(0.05)
            response = await client.delete(f"/v1/accounts/{doomed}", headers=api.operator)
            assert response.status == 202, await response.text()
            assert (await response.json())["status"] == "running"
            ready = await client.get("/readyz")
            assert ready.status == 503 and (await ready.json())["redis"] is False

            private_redis.start()
            ready = await client.get("/readyz")
            assert ready.status == 200, await ready.text()
            assert (await api.send(headers)).status == 202
            for _ in range(250):  # after the commit, off the request's path, within the 1 s retry pause
                if await redis.zcard(job_queue.QUEUE_NAME):
                    break
                await asyncio.sleep(0.02)
            assert await redis.zcard(job_queue.QUEUE_NAME) == 1
    finally:
        await redis.aclose()
    warnings = [record.getMessage() for record in caplog.records if record.name == "delivery.api.group_commit"]
    assert len(warnings) == 2 and warnings[0].startswith("could not wake workers"), warnings
    assert warnings[1].startswith("waking workers again"), warnings
    left = int(re.search(r"(\d+) deliveries were left to the sweeper", warnings[1]).group(1))
    assert 1 <= left <= 31  # those whose wake-up call failed; the rest went out once Redis answered
