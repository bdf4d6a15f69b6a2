"""Authentication on every route of the OpenAPI document: 401 without a key or with a wrong one,
403 for the wrong kind of key, and a refused request writes nothing."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from aiohttp.test_utils import TestClient, TestServer

from billing.database import create_pool
from delivery.api.app import create_app
from delivery.api.openapi import ACCOUNT, OPERATIONS, OPERATOR

GUARDED = [op for op in OPERATIONS if op.auth is not None]


def _path(template: str) -> str:
    return template.replace("{id}", str(uuid.uuid4())).replace("{order_id}", "order-1")


@pytest.mark.parametrize("op", GUARDED, ids=lambda op: f"{op.method.upper()} {op.path}")
async def test_missing_wrong_and_misplaced_keys_are_refused(api, op):
    """No key or a wrong key: 401 problem+json with a Bearer challenge; the other kind of key: 403; nothing written."""
    _, account_headers = await api.account(balance=5)
    before = await api.snapshot()
    path = _path(op.path)
    cases = [
        ({}, 401),
        ({"Authorization": "Bearer hl_live_not-a-real-key"}, 401),
        ({"Authorization": "Basic Zm9vOmJhcg=="}, 401),
        (account_headers if op.auth == OPERATOR else api.operator, 403),
    ]
    for headers, status in cases:
        response = await api.client.request(op.method, path, json={}, headers=headers)
        assert response.status == status, (headers, await response.text())
        assert response.content_type == "application/problem+json"
        problem = await response.json()
        assert problem["status"] == status and problem["type"].startswith("https://") and problem["detail"]
        if status == 401:
            assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert await api.snapshot() == before


async def test_a_revoked_key_is_refused_at_once(api):
    """Revoking a key through the API drops it from this process's cache: the next request is 401."""
    _, headers = await api.account()
    created = await (await api.client.post("/v1/api-keys", headers=headers)).json()
    second = api.bearer(created["key"])
    assert (await api.client.get("/v1/balance", headers=second)).status == 200
    assert (await api.client.delete(f"/v1/api-keys/{created['id']}", headers=headers)).status == 204
    assert (await api.client.get("/v1/balance", headers=second)).status == 401
    assert (await api.client.get("/v1/balance", headers=headers)).status == 200


async def test_an_account_that_revoked_its_last_key_gets_a_new_one_from_the_operator(api):
    """An account can revoke every key it has (then everything is 401); the operator's route makes
    it a new one, shown once; another or a missing account is 404; a deleted one is 409."""
    account_id, headers = await api.account()
    (only,) = (await (await api.client.get("/v1/api-keys", headers=headers)).json())["data"]
    assert (await api.client.delete(f"/v1/api-keys/{only['id']}", headers=headers)).status == 204
    assert (await api.client.get("/v1/balance", headers=headers)).status == 401
    created = await api.client.post(f"/v1/accounts/{account_id}/api-keys", headers=api.operator)
    assert created.status == 201
    key = await created.json()
    fresh = api.bearer(key["key"])
    assert (await api.client.get("/v1/balance", headers=fresh)).status == 200
    listed = (await (await api.client.get("/v1/api-keys", headers=fresh)).json())["data"]
    assert [k["id"] for k in listed if k["revoked_at"] is None] == [key["id"]] and "key" not in listed[0]
    missing = await api.client.post(f"/v1/accounts/{uuid.uuid4()}/api-keys", headers=api.operator)
    assert missing.status == 404
    await api.pool.execute("UPDATE accounts SET status = 'closing' WHERE id = $1", account_id)
    before = await api.snapshot()
    closing = await api.client.post(f"/v1/accounts/{account_id}/api-keys", headers=api.operator)
    assert closing.status == 409 and (await closing.json())["type"].endswith("account-not-active")
    assert await api.snapshot() == before


def test_every_account_and_operator_route_is_covered():
    """The table above is the OpenAPI document's own list, so a new route cannot skip these checks."""
    assert {op.auth for op in GUARDED} == {ACCOUNT, OPERATOR}
    assert len(GUARDED) >= 20


async def test_a_revocation_reaches_every_api_process_at_commit(api, settings, pool, queue):
    """Another process (a second app on the same database) had the key cached; it refuses the key as
    soon as the revocation commits, well inside its 30 s cache, whether the revocation came through
    the API or straight from SQL (as an account's closeout revokes its keys)."""
    other_app = create_app(settings, pool, queue)
    async with TestClient(TestServer(other_app, host="127.0.0.1")) as other:
        _, headers = await api.account()
        keys = [await (await api.client.post("/v1/api-keys", headers=headers)).json() for _ in range(2)]
        for key in keys:  # cached by the other process
            assert (await other.get("/v1/balance", headers=api.bearer(key["key"]))).status == 200
        await _until_listening(pool)

        assert (await api.client.delete(f"/v1/api-keys/{keys[0]['id']}", headers=headers)).status == 204
        await _until_refused(other, api.bearer(keys[0]["key"]))

        # The listening connections die (a PostgreSQL restart, a proxy timeout): they listen again.
        await pool.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                           " WHERE datname = current_database() AND query LIKE 'LISTEN%'")
        await asyncio.sleep(0.1)
        await _until_listening(pool)
        await pool.execute("UPDATE api_keys SET revoked_at = now() WHERE id = $1", uuid.UUID(keys[1]["id"]))
        await _until_refused(other, api.bearer(keys[1]["key"]))
        assert (await other.get("/v1/balance", headers=headers)).status == 200  # the account's first key still works


async def test_a_pool_too_small_to_spare_a_connection_does_not_listen(settings, database_url, queue):
    """The listener would hold one of too few connections; the app serves without it (TTL-bounded)."""
    small = await create_pool(database_url, size_min=1, size_max=settings.api.group_commit_concurrency + 1)
    try:
        async with TestClient(TestServer(create_app(settings, small, queue), host="127.0.0.1")) as client:
            assert (await client.get("/healthz")).status == 200
            await asyncio.sleep(0.2)
            assert await small.fetchval("SELECT count(*) FROM pg_stat_activity"
                                        " WHERE datname = current_database() AND query LIKE 'LISTEN%'") == 0
    finally:
        await small.close()


async def _until_listening(pool) -> None:
    """Both apps hold their LISTEN (it starts with the app, on a connection of their own)."""
    for _ in range(200):
        listeners = await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'")
        if listeners >= 2:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the revocation listeners did not start")


async def _until_refused(client, headers) -> None:
    started = time.monotonic()
    while (await client.get("/v1/balance", headers=headers)).status != 401:
        assert time.monotonic() - started < 5, "the other process still accepts a revoked key after 5 s"
        await asyncio.sleep(0.02)
