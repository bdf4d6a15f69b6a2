"""PostgreSQL unreachable: every route that needs it answers 503 problem+json with Retry-After (a
retry is the right move), not an unhandled 500 with a traceback in the log."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from delivery.platform.web_app import create_app
from delivery.platform.run import free_port  # nothing listens there once it is returned


@pytest.mark.parametrize("where", ["tcp", "unix"])
async def test_routes_answer_503_while_the_database_is_unreachable(api, queue, caplog, tmp_path, where):
    # A pool that has not connected yet (min_size 0), to a port where nothing listens, or to a
    # socket directory without a socket (a unix-socket server restarting: FileNotFoundError).
    url = (f"postgresql://postgres@127.0.0.1:{free_port()}/test" if where == "tcp"
           else f"postgresql://postgres@/test?host={tmp_path}")
    dead = await asyncpg.create_pool(url, min_size=0, max_size=2)
    try:
        async with TestClient(TestServer(create_app(api.settings, dead, queue), host="127.0.0.1")) as client:
            calls = [
                ("GET", "/v1/deliveries", {"Authorization": "Bearer hl_live_whatever_key_0123456789"}, None),
                ("POST", "/v1/messages", {"Authorization": "Bearer hl_live_whatever_key_0123456789"},
                 {"event_type": "t", "payload": 1}),
                ("GET", "/v1/dead-deliveries", api.operator, None),
                ("POST", "/v1/accounts", api.operator, {"name": "x", "price_per_delivery": 1}),
            ]
            for method, path, headers, body in calls:
                response = await client.request(method, path, headers=headers, json=body)
                assert response.status == 503, (path, response.status, await response.text())
                assert response.headers["Content-Type"].startswith("application/problem+json")
                assert response.headers["Retry-After"] == "1"
                problem = await response.json()
                assert problem["type"].endswith("database-unavailable") and problem["status"] == 503
                # A write may have been cut off at its COMMIT: the detail says so, and for a read it does not.
                assert ("may have completed" in problem["detail"]) is (method == "POST"), problem["detail"]
            page = await client.get("/dashboard/", cookies={"hookledger_session": "s" * 43})
            assert page.status == 503 and page.headers["Retry-After"] == "1"
            assert "the database is unavailable" in await page.text()
            ready = await client.get("/readyz")
            assert ready.status == 503 and (await ready.json())["postgres"] is False
    finally:
        await dead.close()
    assert "unhandled" not in caplog.text


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize("route", ["endpoint", "rotate"])
async def test_a_backend_ended_mid_write_is_503_not_500(api, route, keyed):
    """The request's backend ended while it waits on a row lock: the write's transaction (for a
    keyed create, a savepoint of the key's) exits with asyncpg's InterfaceError, the loss as its
    context. That is the database going away, answered 503 with Retry-After as any other loss;
    it was an unhandled 500 for a rotation and for every keyed create (found in review)."""
    account_id, headers = await api.account()
    endpoint = await api.endpoint(headers)
    blocker = await api.pool.acquire()
    try:
        async with blocker.transaction():
            if route == "rotate":
                await blocker.execute("SELECT 1 FROM endpoints WHERE id = $1 FOR UPDATE", uuid.UUID(endpoint["id"]))
                path, body = f"/v1/endpoints/{endpoint['id']}/secret/rotate", None
            else:
                await blocker.execute("SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE", account_id)
                path, body = "/v1/endpoints", {"url": "https://example.com/k"}
            sent = {**headers, **({"Idempotency-Key": f"kill-{route}"} if keyed else {})}
            answer = asyncio.ensure_future(api.client.post(path, json=body, headers=sent))
            waiting = None
            for _ in range(250):
                waiting = await api.pool.fetchval(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
                    " AND pid <> $1", blocker.get_server_pid())
                if waiting is not None:
                    break
                await asyncio.sleep(0.02)
            assert waiting is not None, "the request never waited on the lock"
            await api.pool.execute("SELECT pg_terminate_backend($1)", waiting)
            response = await answer
    finally:
        await api.pool.release(blocker)
    problem = await response.json()
    assert (response.status, problem["type"].rsplit("/", 1)[-1]) == (503, "database-unavailable"), problem
    assert response.headers["Retry-After"] == "1"
