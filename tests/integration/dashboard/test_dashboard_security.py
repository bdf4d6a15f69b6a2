"""Dashboard security over HTTP: sessions, cookies, CSRF, roles, isolation between accounts, headers."""

from __future__ import annotations

import re
import uuid

from billing.messages import MessageRequest, create_message
from dashboard_helpers import OPERATOR_KEY, Dashboard, session_hash
from delivery.dashboard import csrf, pages, session as sessions


async def _sessions(pool) -> int:
    return await pool.fetchval("SELECT count(*) FROM dashboard_sessions")


async def test_sign_in_sets_a_hardened_cookie_and_keeps_only_its_hash(dash, pool):
    """The cookie is HttpOnly, SameSite=Strict, scoped to /dashboard; the table holds its SHA-256, not the token."""
    account_id, key = await dash.account()
    await dash.page("/dashboard/sign-in")
    response, _ = await dash.post("/dashboard/sign-in", {"key": key})
    assert response.status == 303 and response.headers["Location"] == "/dashboard/overview"
    cookie = response.cookies[sessions.COOKIE_NAME]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/dashboard"
    assert not cookie["secure"]  # plain http on loopback
    row = await pool.fetchrow("SELECT token_hash, role, account_id FROM dashboard_sessions")
    assert bytes(row["token_hash"]) == session_hash(cookie.value) and row["token_hash"] != cookie.value.encode()
    assert (row["role"], row["account_id"]) == ("account", account_id)


async def test_cookie_is_secure_when_served_over_https(dash):
    """Behind a TLS-terminating proxy (X-Forwarded-Proto: https) the session cookie is Secure."""
    _, key = await dash.account()
    await dash.page("/dashboard/sign-in")
    response, _ = await dash.post("/dashboard/sign-in", {"key": key}, headers={"X-Forwarded-Proto": "https"})
    assert response.status == 303
    assert response.cookies[sessions.COOKIE_NAME]["secure"]


async def test_a_wrong_key_is_refused(dash, pool):
    """An unknown key (or a revoked one) answers 401 with the sign-in page again, and no session exists."""
    await dash.page("/dashboard/sign-in")
    response, html = await dash.post("/dashboard/sign-in", {"key": "hl_live_" + "x" * 43})
    assert response.status == 401 and "That key is not valid" in html
    assert sessions.COOKIE_NAME not in response.cookies and await _sessions(pool) == 0


async def test_sign_in_needs_the_form_token_of_its_own_page(dash, pool):
    """Login CSRF: a sign-in posted without (or with another) form token is refused before the key is read."""
    _, key = await dash.account()
    response, _ = await dash.post("/dashboard/sign-in", {"key": key}, csrf=False)
    assert response.status == 403
    await dash.page("/dashboard/sign-in")
    response, _ = await dash.post("/dashboard/sign-in", {"key": key, "csrf_token": csrf.new_sign_in_token()})
    assert response.status == 403 and await _sessions(pool) == 0


async def test_a_form_without_the_csrf_token_is_refused_and_writes_nothing(dash, pool):
    """Missing token, a wrong token, or a post from another origin: 403 and no endpoint is created."""
    _, key = await dash.account()
    await dash.sign_in(key)
    await dash.page("/dashboard/endpoints")
    form = {"url": "https://example.com/a", "event_types": ""}
    response, html = await dash.post("/dashboard/endpoints", form, csrf=False)
    assert response.status == 403 and "security token" in html
    response, _ = await dash.post("/dashboard/endpoints", {**form, "csrf_token": "forged"})
    assert response.status == 403
    response, _ = await dash.post("/dashboard/endpoints", form, headers={"Origin": "https://evil.example"})
    assert response.status == 403
    assert await pool.fetchval("SELECT count(*) FROM endpoints") == 0
    response, _ = await dash.post("/dashboard/endpoints", form)
    assert response.status == 303 and await pool.fetchval("SELECT count(*) FROM endpoints") == 1


async def test_the_csrf_token_is_per_session(dash, dashboard_server, pool):
    """Another session's token does not pass: each token is bound to the session it was made for."""
    _, key = await dash.account()
    await dash.sign_in(key)
    other = Dashboard(dashboard_server[0], pool)
    try:
        await other.sign_in(key)
        assert other.last_csrf != dash.last_csrf
        response, _ = await other.post("/dashboard/endpoints", {"url": "https://example.com/b",
                                                                "csrf_token": dash.last_csrf})
        assert response.status == 403
    finally:
        await other.close()


async def test_sign_out_ends_the_session(dash, pool):
    """Signing out deletes the row; the old cookie then leads to the sign-in page and cannot post."""
    _, key = await dash.account()
    await dash.sign_in(key)
    token = dash.cookie(sessions.COOKIE_NAME)
    stale_csrf = dash.last_csrf
    response, _ = await dash.post("/dashboard/sign-out", {})
    assert response.status == 303 and response.headers["Location"] == "/dashboard/sign-in"
    assert await _sessions(pool) == 0
    dash.http.cookie_jar.update_cookies({sessions.COOKIE_NAME: token})
    response, _ = await dash.get("/dashboard/overview")
    assert response.status == 303 and response.headers["Location"] == "/dashboard/sign-in"
    response, _ = await dash.post("/dashboard/endpoints", {"url": "https://example.com/c", "csrf_token": stale_csrf})
    assert response.status == 401


async def test_revoking_the_key_ends_its_sessions(dash, pool):
    """A session remembers the key it signed in with: revoke the key and the session is over."""
    account_id, key = await dash.account()
    await dash.sign_in(key)
    await pool.execute("UPDATE api_keys SET revoked_at = now() WHERE account_id = $1", account_id)
    response, _ = await dash.get("/dashboard/overview")
    assert response.status == 303 and response.headers["Location"] == "/dashboard/sign-in"


async def test_another_accounts_delivery_and_endpoint_are_not_found(dash, pool):
    """An id of another account's delivery or endpoint answers the same 404 page as a made-up id."""
    other_id, other_key = await dash.account(name="other")
    endpoint = await dash.endpoint(other_key)
    created = await create_message(pool, MessageRequest(other_id, "invoice.paid", b"{}"), attempts_max=3)
    theirs = created.deliveries[0].id
    _, key = await dash.account()
    await dash.sign_in(key)
    for path in (f"/dashboard/deliveries/{theirs}", f"/dashboard/deliveries/{uuid.uuid4()}",
                 f"/dashboard/deliveries/{theirs}/replay", f"/dashboard/endpoints/{endpoint['id']}",
                 f"/dashboard/endpoints/{endpoint['id']}/secret/reveal", "/dashboard/deliveries/not-an-id"):
        response, html = await dash.get(path)
        assert response.status == 404, path
        assert "text/html" in response.headers["Content-Type"] and "Not found" in html and str(theirs) not in html
    response, _ = await dash.post(f"/dashboard/endpoints/{endpoint['id']}/secret/reveal", {})
    assert response.status == 404


async def test_each_role_sees_only_its_own_pages(dash):
    """An account cannot open operator pages (403), and the operator has no account pages (403)."""
    _, key = await dash.account()
    await dash.sign_in(key)
    response, _ = await dash.get("/dashboard/operator/dead-letters")
    assert response.status == 403
    await dash.post("/dashboard/sign-out", {})
    await dash.sign_in(OPERATOR_KEY)
    response, _ = await dash.get("/dashboard/overview")
    assert response.status == 403
    response, _ = await dash.get("/dashboard/")
    assert response.status == 303 and response.headers["Location"] == "/dashboard/operator"


async def test_every_page_has_a_strict_policy_and_no_inline_script_or_style(dash):
    """CSP default-src 'self' without unsafe-inline, no framing, no caching; pages hold no inline script or style."""
    _, key = await dash.account()
    await dash.endpoint(key)
    await dash.send(key)
    await dash.sign_in(key)
    for path in ("/dashboard/sign-in", "/dashboard/overview", "/dashboard/endpoints", "/dashboard/deliveries",
                 "/dashboard/ledger", "/dashboard/nowhere"):
        response, html = await dash.get(path)
        assert response.headers["Content-Security-Policy"] == pages.CONTENT_SECURITY_POLICY, path
        assert "unsafe-inline" not in pages.CONTENT_SECURITY_POLICY
        assert response.headers["X-Frame-Options"] == "DENY" and response.headers["Cache-Control"] == "no-store"
        assert not re.search(r"<script(?![^>]*\bsrc=)", html), f"inline script on {path}"
        assert not re.search(r"<style|\sstyle=", html), f"inline style on {path}"
    response, script = await dash.get("/dashboard/static/dashboard.js")
    assert response.status == 200 and "javascript" in response.headers["Content-Type"]


async def test_pages_escape_what_users_typed(dash):
    """Autoescaping: a description with markup shows as text, never as markup."""
    _, key = await dash.account()
    endpoint = await dash.endpoint(key, description='<script>alert("x")</script><img src=x onerror=alert(1)>')
    await dash.sign_in(key)
    html = await dash.page(f"/dashboard/endpoints/{endpoint['id']}")
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in html


async def test_without_a_session_pages_lead_to_sign_in(dash):
    response, _ = await dash.get("/dashboard/ledger")
    assert response.status == 303 and response.headers["Location"] == "/dashboard/sign-in"
    response, _ = await dash.get("/dashboard", allow_redirects=True)
    assert response.status == 200 and str(response.url).endswith("/dashboard/sign-in")
