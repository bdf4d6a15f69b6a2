"""Helpers for the dashboard tests (HTTP level here, and the browser tests in tests/browser).

The real API app (with the dashboard mounted) on a loopback port in the test's event loop, on
the test's own PostgreSQL database and an emptied Redis. Accounts and top-ups are made through
the API itself with the operator key; pages are driven with a cookie-keeping client.
"""

from __future__ import annotations

import hashlib
import re
import uuid

import pytest
from aiohttp import ClientSession, CookieJar
from aiohttp.test_utils import TestServer

from delivery.platform import config
from delivery.engine import queue as job_queue
from delivery.platform.web_app import create_app
from signing import Keyring, format_keyring, generate_at_rest_key

OPERATOR_KEY = "op_dashboard_test_" + "d" * 32
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def dashboard_environment(database_url: str, redis_url: str, keyring: Keyring | None = None) -> dict[str, str]:
    keyring = keyring or Keyring({"k1": generate_at_rest_key()}, "k1")
    return {
        "DATABASE_URL": database_url, "REDIS_URL": redis_url, "HOOKLEDGER_DEV": "1",
        "HOOKLEDGER_ATTEMPTS_MAX": "3", "HOOKLEDGER_OPERATOR_KEY": OPERATOR_KEY,
        "HOOKLEDGER_SECRET_KEYS": format_keyring(keyring),
    }


def csrf_token(html: str) -> str:
    found = _CSRF.search(html)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


def session_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Dashboard:
    """A browser-like client: keeps cookies, follows no redirects unless asked, reads CSRF tokens."""

    def __init__(self, base_url: str, pool) -> None:
        self.base_url = base_url
        self.pool = pool
        self.http = ClientSession(base_url, cookie_jar=CookieJar(unsafe=True))
        self.operator = {"Authorization": f"Bearer {OPERATOR_KEY}"}

    async def close(self) -> None:
        await self.http.close()

    async def account(self, *, balance: int = 100, price: int = 2, name: str = "acme") -> tuple[uuid.UUID, str]:
        """A new account through the API, topped up; returns its id and API key."""
        async with self.http.post("/v1/accounts", json={"name": name, "price_per_delivery": price},
                                  headers=self.operator) as response:
            assert response.status == 201, await response.text()
            body = await response.json()
        account_id = uuid.UUID(body["account"]["id"])
        if balance:
            async with self.http.post(f"/v1/accounts/{account_id}/topups", headers=self.operator,
                                      json={"order_id": f"o-{uuid.uuid4().hex}", "amount": balance}) as response:
                assert response.status == 201, await response.text()
        return account_id, body["api_key"]["key"]

    async def endpoint(self, key: str, url: str = "https://example.com/hooks", **fields) -> dict:
        async with self.http.post("/v1/endpoints", json={"url": url, **fields},
                                  headers={"Authorization": f"Bearer {key}"}) as response:
            assert response.status == 201, await response.text()
            return await response.json()

    async def send(self, key: str, event_type: str = "invoice.paid") -> dict:
        async with self.http.post("/v1/messages", json={"event_type": event_type, "payload": {"n": 1}},
                                  headers={"Authorization": f"Bearer {key}"}) as response:
            assert response.status == 202, await response.text()
            return await response.json()

    async def get(self, path: str, **kwargs):
        response = await self.http.get(path, allow_redirects=kwargs.pop("allow_redirects", False), **kwargs)
        return response, await response.text()

    async def post(self, path: str, data: dict, *, csrf: bool = True, **kwargs):
        """POST a form; with csrf=True the token comes from the last page that had one."""
        form = dict(data)
        if csrf:
            form.setdefault("csrf_token", self.last_csrf)
        response = await self.http.post(path, data=form, allow_redirects=kwargs.pop("allow_redirects", False), **kwargs)
        return response, await response.text()

    async def page(self, path: str) -> str:
        """GET a page that must answer 200; remembers its CSRF token for the next post."""
        response, html = await self.get(path)
        assert response.status == 200, f"{path}: {response.status} {html[:500]}"
        if 'name="csrf_token"' in html:
            self.last_csrf = csrf_token(html)
        return html

    async def sign_in(self, key: str) -> None:
        await self.page("/dashboard/sign-in")
        response, html = await self.post("/dashboard/sign-in", {"key": key})
        assert response.status == 303, html[:500]
        await self.page(response.headers["Location"])

    def cookie(self, name: str) -> str | None:
        for cookie in self.http.cookie_jar:
            if cookie.key == name:
                return cookie.value
        return None


@pytest.fixture
async def dashboard_server(database_url, redis_url, pool):
    """The API app with its dashboard on a loopback port; yields (base_url, settings)."""
    settings = config.load(dashboard_environment(database_url, redis_url))
    redis = await job_queue.connect(redis_url)
    server = TestServer(create_app(settings, pool, job_queue.Queue(redis)), host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/"), settings
    finally:
        await server.close()
        await redis.aclose()


@pytest.fixture
async def dash(dashboard_server, pool):
    client = Dashboard(dashboard_server[0], pool)
    yield client
    await client.close()
