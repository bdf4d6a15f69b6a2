"""The customer portal over HTTP: a magic link signs in once, within its time, and the session sees
one application only; another application's ids, a used or expired link, and a session whose
application was deleted get 404 or the sign-in message, and change nothing."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit

from billing.settle import DeadReason, settle
from dashboard_helpers import Dashboard, csrf_token


async def _api(dash, method: str, path: str, key: str, **kwargs):
    async with dash.http.request(method, path, headers={"Authorization": f"Bearer {key}"}, **kwargs) as response:
        assert response.status < 300, await response.text()
        return await response.json()


async def _world(dash):
    """An account with applications a and b, an endpoint and a message each; a portal link for a."""
    account_id, key = await dash.account(balance=100, price=3)
    made = {}
    for uid in ("a", "b"):
        await _api(dash, "POST", "/v1/applications", key, json={"name": f"Customer {uid}", "uid": uid})
        endpoint = await _api(dash, "POST", f"/v1/applications/{uid}/endpoints", key,
                              json={"url": f"https://example.com/{uid}-hooks"})
        message = await _api(dash, "POST", f"/v1/applications/{uid}/messages", key, json={"event_type": "a", "payload": {}})
        made[uid] = (endpoint["id"], message["deliveries"][0]["id"])
    link = await _api(dash, "POST", "/v1/applications/a/portal-links", key)
    return account_id, key, made, link


async def _signed_in(dash, link: dict) -> Dashboard:
    """A new browser that follows the link and presses Continue."""
    browser = Dashboard(dash.base_url, dash.pool)
    target = urlsplit(link["url"])
    html = await browser.page(f"{target.path}?{target.query}")
    assert 'id="portal-sign-in"' in html
    response, _ = await browser.post("/portal/sign-in", {"token": target.query.removeprefix("token=")}, csrf=False)
    assert response.status == 303 and response.headers["Location"] == "/portal/"
    return browser


async def _state(pool) -> tuple:
    rows = await pool.fetch("SELECT id, url, enabled, deleted_at FROM endpoints ORDER BY id")
    deliveries = await pool.fetch("SELECT id, state FROM deliveries ORDER BY id")
    balances = await pool.fetch("SELECT id, balance FROM accounts ORDER BY id")
    return [tuple(r) for r in rows], [tuple(r) for r in deliveries], [tuple(r) for r in balances]


async def test_a_link_signs_in_once_and_the_portal_shows_its_application_only(dash, pool):
    _, key, made, link = await _world(dash)
    assert link["url"].startswith(dash.base_url + "/portal/sign-in?token=")
    token = link["url"].split("token=")[1]
    assert await pool.fetchval("SELECT count(*) FROM portal_links WHERE token_hash = sha256($1::bytea)",
                               token.encode()) == 1  # only its hash is kept
    browser = await _signed_in(dash, link)
    try:
        html = await browser.page("/portal/")
        assert "https://example.com/a-hooks" in html and "https://example.com/b-hooks" not in html
        assert made["a"][1] in html and made["b"][1] not in html
        assert "balance" not in html.lower() and "ledger" not in html.lower()
        again = Dashboard(dash.base_url, dash.pool)
        try:
            response, html = await again.post("/portal/sign-in", {"token": token}, csrf=False)
            assert response.status == 404 and "used already" in html
            response, _ = await again.get("/portal/")
            assert response.status == 401
        finally:
            await again.close()
    finally:
        await browser.close()
    _, other_key = await dash.account(balance=0)
    async with dash.http.post("/v1/applications/a/portal-links", headers={"Authorization": f"Bearer {other_key}"}) as r:
        assert r.status == 404


async def test_the_portal_adds_and_deletes_endpoints_and_replays_a_dead_delivery(dash, pool):
    account_id, _, made, link = await _world(dash)
    browser = await _signed_in(dash, link)
    try:
        await browser.page("/portal/")
        response, _ = await browser.post("/portal/endpoints", {"url": "https://example.com/added", "event_types": "invoice.*"})
        assert response.status == 303
        added = await pool.fetchrow("SELECT id, application_id, event_types FROM endpoints WHERE url = $1",
                                    "https://example.com/added")
        assert str(added["application_id"]) != str(account_id) and added["event_types"] == ["invoice.*"]
        html = await browser.page("/portal/")
        response, html = await browser.post("/portal/endpoints", {"url": "ftp://example.com/x"})
        assert response.status == 422 and "URL" in html

        # Another application's endpoint and delivery: 404, nothing changed.
        before = await _state(pool)
        await browser.page("/portal/")
        for path in (f"/portal/endpoints/{made['b'][0]}/delete", f"/portal/deliveries/{made['b'][1]}/replay",
                     f"/portal/endpoints/{uuid.uuid4()}/delete", "/portal/deliveries/not-an-id/replay"):
            response, _ = await browser.post(path, {})
            assert response.status == 404, path
        # Without the form's token: refused.
        response, _ = await browser.post(f"/portal/endpoints/{added['id']}/delete", {}, csrf=False)
        assert response.status == 403
        assert await _state(pool) == before

        dead = uuid.UUID(made["a"][1])
        owner = await pool.fetchval("SELECT account_id FROM deliveries WHERE id = $1", dead)
        await settle(pool, dead, DeadReason.ENDPOINT_DISABLED, account_id=owner, attempt=0)
        html = await browser.page("/portal/")
        assert "Replay (3 credits)" in html
        balance = await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id)
        response, _ = await browser.post(f"/portal/deliveries/{dead}/replay", {})
        assert response.status == 303
        replayed = await pool.fetchrow("SELECT id, price FROM deliveries WHERE replay_of = $1", dead)
        assert replayed["price"] == 3
        assert await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id) == balance - 3

        await browser.page("/portal/")
        response, _ = await browser.post(f"/portal/endpoints/{added['id']}/delete", {})
        assert response.status == 303
        assert await pool.fetchval("SELECT deleted_at IS NOT NULL FROM endpoints WHERE id = $1", added["id"])
    finally:
        await browser.close()


async def test_an_expired_link_and_a_deleted_application_end_at_sign_in(dash, pool):
    _, key, _, link = await _world(dash)
    expired = await _api(dash, "POST", "/v1/applications/a/portal-links", key)
    token = expired["url"].split("token=")[1]
    await pool.execute("UPDATE portal_links SET created_at = now() - interval '20 minutes',"
                       " expires_at = now() - interval '5 minutes' WHERE token_hash = sha256($1::bytea)", token.encode())
    stranger = Dashboard(dash.base_url, dash.pool)
    try:
        response, html = await stranger.post("/portal/sign-in", {"token": token}, csrf=False)
        assert response.status == 404 and "expired" in html
        assert stranger.cookie("hookledger_portal") is None
    finally:
        await stranger.close()
    browser = await _signed_in(dash, link)
    try:
        await browser.page("/portal/")
        await _api(dash, "DELETE", "/v1/applications/a", key)
        response, html = await browser.get("/portal/")
        assert response.status == 401 and "sign in" in html
    finally:
        await browser.close()
    unused = await _api(dash, "POST", "/v1/applications/b/portal-links", key)
    await _api(dash, "DELETE", "/v1/applications/b", key)
    late = Dashboard(dash.base_url, dash.pool)
    try:
        response, _ = await late.post("/portal/sign-in", {"token": unused["url"].split("token=")[1]}, csrf=False)
        assert response.status == 404
    finally:
        await late.close()


async def test_a_test_event_the_balance_cannot_cover_is_refused_and_writes_nothing(dash, pool):
    """The account pays for a portal's test event: with too little balance, 402, nothing written."""
    account_id, key = await dash.account(balance=3, price=3)
    await _api(dash, "POST", "/v1/applications", key, json={"name": "Customer", "uid": "c"})
    endpoint = await _api(dash, "POST", "/v1/applications/c/endpoints", key, json={"url": "https://example.com/c"})
    await _api(dash, "POST", "/v1/applications/c/messages", key, json={"event_type": "a", "payload": {}})  # balance 0
    browser = await _signed_in(dash, await _api(dash, "POST", "/v1/applications/c/portal-links", key))
    try:
        html = await browser.page("/portal/")
        assert "Send test event (3 credits)" in html
        before = await _state(pool)
        response, html = await browser.post(f"/portal/endpoints/{endpoint['id']}/test", {})
        assert response.status == 402 and "cannot cover" in html
        assert await _state(pool) == before
    finally:
        await browser.close()
