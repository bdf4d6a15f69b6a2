"""Authentication on every route of the OpenAPI document: 401 without a key or with a wrong one,
403 for the wrong kind of key, and a refused request writes nothing."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid

import pytest
from aiohttp.test_utils import TestClient, TestServer

from billing.database import create_pool
from delivery.api import api_keys, auth
from delivery.api.context import CONTEXT
from delivery.platform.web_app import create_app
from listeners import until_listening
from delivery.api.openapi import ACCOUNT, OPERATIONS, OPERATOR

GUARDED = [op for op in OPERATIONS if op.auth is not None]
REFUSED_WITHIN_SECONDS = 20  # a revoked key must be refused within this (the notice takes milliseconds)


class _Clock:
    """The authenticator's clock (delivery.api.auth reads time.monotonic() for its cache), set by the
    test: cache entries expire when the test moves it, never because a loaded machine was slow."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> _Clock:
    clock = _Clock()
    monkeypatch.setattr(auth, "time", clock)  # the module's `time`, not the event loop's
    return clock


def _path(template: str) -> str:
    return (template.replace("{id}", str(uuid.uuid4())).replace("{order_id}", "order-1")
            .replace("{app}", "customer-1").replace("{name}", "invoice.paid"))


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


async def test_a_revocation_reaches_every_api_process_at_commit(api, settings, pool, queue, clock):
    """Another process (a second app on the same database) had the key cached; it refuses the key as
    soon as the revocation commits, well inside its 30 s cache, whether the revocation came through
    the API or straight from SQL (as an account's closeout revokes its keys). The cache's clock
    stands still, so no entry expires: only the revocation's notice can have dropped the key."""
    other_app = create_app(settings, pool, queue)
    async with TestClient(TestServer(other_app, host="127.0.0.1")) as other:
        await until_listening(pool)  # first: (re)starting to listen empties the cache
        _, headers = await api.account()
        keys = [await (await api.client.post("/v1/api-keys", headers=headers)).json() for _ in range(2)]
        for key in keys:  # cached by the other process
            assert (await other.get("/v1/balance", headers=api.bearer(key["key"]))).status == 200
        assert _cached(other, keys[0]["key"]) and _cached(other, keys[1]["key"])

        assert (await api.client.delete(f"/v1/api-keys/{keys[0]['id']}", headers=headers)).status == 204
        await _until_refused(other, api.bearer(keys[0]["key"]))

        # The listening connections die (a PostgreSQL restart, a proxy timeout): they listen again,
        # on new connections (the ended ones may linger in pg_stat_activity a moment: not counted).
        ended = await pool.fetch("SELECT pg_terminate_backend(pid), pid FROM pg_stat_activity"
                                 " WHERE datname = current_database() AND query LIKE 'LISTEN%'")
        assert len(ended) == 2 and all(row["pg_terminate_backend"] for row in ended)
        await until_listening(pool, not_on=[row["pid"] for row in ended])
        # Listening again emptied the cache: cache the second key anew, so only a notice heard on the
        # new connection can drop it.
        assert (await other.get("/v1/balance", headers=api.bearer(keys[1]["key"]))).status == 200
        assert _cached(other, keys[1]["key"])
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




def _cached(client, key: str) -> bool:
    """Whether the app behind this client holds the key in its cache."""
    return api_keys.key_hash(key) in client.app[CONTEXT].auth._cache


async def _until_refused(client, headers) -> None:
    started = time.monotonic()
    while (await client.get("/v1/balance", headers=headers)).status != 401:
        assert time.monotonic() - started < REFUSED_WITHIN_SECONDS, \
            f"the other process still accepts a revoked key after {REFUSED_WITHIN_SECONDS} s"
        await asyncio.sleep(0.02)


class _Lookups:
    """api_keys.account_of_key as the app calls it, counted per key; the real query runs. Lookups
    of `held` (or of every key, with held_all) wait for `release` after their query answered, with
    `answered` set meanwhile. `asked` counts the requests that reached Authenticator.account: one
    counted there has, before its first pause, either joined a lookup in flight, started one, or
    answered from the cache."""

    def __init__(self, monkeypatch, held: str | None = None, held_all: bool = False) -> None:
        self.count = 0
        self.asked = 0
        self.held = None if held is None else api_keys.key_hash(held)
        self.held_all = held_all
        self.answered, self.release = asyncio.Event(), asyncio.Event()
        self._real = api_keys.account_of_key
        monkeypatch.setattr(api_keys, "account_of_key", self._look_up)
        account = auth.Authenticator.account

        async def asked(authenticator, request):
            self.asked += 1
            return await account(authenticator, request)

        monkeypatch.setattr(auth.Authenticator, "account", asked)

    async def _look_up(self, executor, digest):
        held = self.held_all or digest == self.held
        if held or self.held is None:
            self.count += 1
        account_id = await self._real(executor, digest)
        if held:
            self.answered.set()
            await self.release.wait()
        return account_id

    async def until_asked(self, number: int) -> None:
        for _ in range(2000):
            if self.asked >= number:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{self.asked} requests reached the authenticator, not {number}")


@contextlib.asynccontextmanager
async def _app(settings, pool, queue, ttl_ms: int):
    settings = dataclasses.replace(settings, api=dataclasses.replace(settings.api, auth_cache_ttl_ms=ttl_ms))
    async with TestClient(TestServer(create_app(settings, pool, queue), host="127.0.0.1")) as client:
        yield client


async def _new_key(api) -> tuple[dict, dict]:
    """A second key of a new account, not yet used (so in no cache), and the account's first key."""
    _, headers = await api.account()
    return await (await api.client.post("/v1/api-keys", headers=headers)).json(), headers


@pytest.mark.parametrize("repeat", range(5))
async def test_requests_that_find_a_key_expired_at_once_make_one_lookup(api, settings, pool, queue, monkeypatch,
                                                                        clock, repeat):
    """A hot key's cache entry expires under load: the fifty requests that find it so together
    make one query, not fifty on the pool the group commit writes through; all are answered.

    The lookup is held until all fifty have reached the authenticator, so every one of them found
    the key missing (or expired) with the lookup in flight; the cache's clock moves only when the
    test moves it past the TTL."""
    key, _ = await _new_key(api)
    async with _app(settings, pool, queue, ttl_ms=200) as client:
        await until_listening(pool)
        lookups = _Lookups(monkeypatch, held_all=True)
        headers = api.bearer(key["key"])
        for _ in range(2):  # unknown to the cache, then expired in it
            lookups.count = lookups.asked = 0
            lookups.release.clear()
            requests = [asyncio.create_task(client.get("/v1/balance", headers=headers)) for _ in range(50)]
            await lookups.until_asked(50)
            lookups.release.set()
            responses = await asyncio.gather(*requests)
            assert [response.status for response in responses] == [200] * 50
            assert lookups.count == 1
            clock.now += 0.25  # past the 200 ms TTL
        lookups.release.set()
        wrong = api.bearer("hl_live_not-a-real-key")
        responses = await asyncio.gather(*(client.get("/v1/balance", headers=wrong) for _ in range(20)))
        assert [response.status for response in responses] == [401] * 20


async def test_a_key_revoked_while_it_was_being_looked_up_is_not_cached(api, pool, monkeypatch, clock):
    """The lookup read the key before its revocation committed, and the revocation's notice came
    and went while it was in flight, with nothing cached to drop. The request in flight is
    answered; one that came after the notice, while that lookup was still held, and the next one
    are 401: the lookup's answer was neither shared with them nor cached, to let a revoked key in
    for the rest of the TTL. (A second key, cached, revoked in the same transaction, shows when
    the notices were heard.)"""
    key, headers = await _new_key(api)
    marker = await (await api.client.post("/v1/api-keys", headers=headers)).json()
    await until_listening(pool, 1)
    assert (await api.client.get("/v1/balance", headers=api.bearer(marker["key"]))).status == 200
    lookups = _Lookups(monkeypatch, held=key["key"])
    in_flight = asyncio.create_task(api.client.get("/v1/balance", headers=api.bearer(key["key"])))
    await asyncio.wait_for(lookups.answered.wait(), 10)
    await pool.execute("UPDATE api_keys SET revoked_at = now() WHERE id = ANY($1::uuid[])",
                       [uuid.UUID(key["id"]), uuid.UUID(marker["id"])])
    await _until_refused(api.client, api.bearer(marker["key"]))
    # After the notices, a request must not join the lookup that read the key before them. It is
    # let through only once it reached the authenticator, while that lookup is still held.
    asked = lookups.asked
    after = asyncio.create_task(api.client.get("/v1/balance", headers=api.bearer(key["key"])))
    await lookups.until_asked(asked + 1)
    lookups.release.set()
    assert (await in_flight).status == 200
    assert (await after).status == 401
    assert (await api.client.get("/v1/balance", headers=api.bearer(key["key"]))).status == 401
    assert (await api.client.get("/v1/balance", headers=headers)).status == 200


async def test_a_key_in_use_is_looked_up_again_before_it_expires_not_on_the_request(api, settings, pool, queue,
                                                                                     monkeypatch, clock):
    """In the last quarter of its TTL a key in use is looked up again in the background: the
    request that starts it answers from the cache (here while that lookup is held), and the
    refreshed entry answers past the first one's expiry with no lookup of its own. The cache's
    clock is the test's: 1.6 s and 2.2 s into a 2 s TTL are exactly that, however slow the machine."""
    key, _ = await _new_key(api)
    headers = api.bearer(key["key"])
    async with _app(settings, pool, queue, ttl_ms=2000) as client:
        await until_listening(pool)  # (re)starting to listen empties the cache, and a lookup across it caches nothing
        lookups = _Lookups(monkeypatch, held=key["key"])
        lookups.release.set()
        cached_at = clock.now
        assert (await client.get("/v1/balance", headers=headers)).status == 200
        assert lookups.count == 1
        clock.now = cached_at + 1.4  # not yet in the last quarter: answered from the cache, no lookup
        assert (await client.get("/v1/balance", headers=headers)).status == 200 and lookups.count == 1
        lookups.answered.clear()
        lookups.release.clear()
        clock.now = cached_at + 1.6
        # Held: were this request waiting on the lookup, it would not be answered.
        response = await asyncio.wait_for(client.get("/v1/balance", headers=headers), 10)
        assert response.status == 200 and lookups.count == 2
        await asyncio.wait_for(lookups.answered.wait(), 10)
        lookups.release.set()
        await _until_no_lookup_in_flight(client)
        clock.now = cached_at + 2.2  # past the first entry's expiry, well before the refreshed one's (3.6 s)
        assert (await client.get("/v1/balance", headers=headers)).status == 200
        assert lookups.count == 2
        clock.now = cached_at + 3.7  # past the refreshed entry's expiry too: the request looks the key up
        assert (await client.get("/v1/balance", headers=headers)).status == 200
        assert lookups.count == 3


async def _until_no_lookup_in_flight(client) -> None:
    """The app's background refresh has written its entry (it leaves _lookups when done)."""
    authenticator = client.app[CONTEXT].auth
    for _ in range(1000):
        if not authenticator._lookups:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("a key lookup is still in flight")

