"""The portal inside another site's iframe: the account's portal_frame_ancestors become its CSP
frame-ancestors (none set: 'none' and X-Frame-Options DENY), and its session cookie is then
SameSite=None; Secure; Partitioned so that it is sent inside the iframe (else SameSite=Strict).
The CSRF token, not SameSite, stops a forged POST: without it, or from a foreign Origin, refused."""

from __future__ import annotations

from urllib.parse import urlsplit

from aiohttp import ClientSession, CookieJar

from dashboard_helpers import Dashboard
from test_portal import _api, _state, _world

EMBEDDER = "https://app.customer.example"


def _frame_ancestors(response) -> str:
    policy = response.headers["Content-Security-Policy"]
    return next(part.strip() for part in policy.split(";") if part.strip().startswith("frame-ancestors"))


async def _sign_in(dash, link: dict):
    """A browser that follows the link; it treats the loopback server as secure, as a browser treats
    the https portal, so that a Secure cookie comes back. Returns it and the sign-in's responses."""
    browser = Dashboard(dash.base_url, dash.pool)
    await browser.http.close()
    jar = CookieJar(unsafe=True, treat_as_secure_origin=[dash.base_url])
    browser.http = ClientSession(dash.base_url, cookie_jar=jar)
    target = urlsplit(link["url"])
    page, _ = await browser.get(f"{target.path}?{target.query}")
    signed_in, _ = await browser.post("/portal/sign-in", {"token": target.query.removeprefix("token=")}, csrf=False)
    assert signed_in.status == 303
    return browser, page, signed_in


async def test_without_origins_the_portal_cannot_be_framed_and_its_cookie_is_strict(dash):
    _, _, _, link = await _world(dash)
    browser, page, signed_in = await _sign_in(dash, link)
    try:
        assert _frame_ancestors(page) == "frame-ancestors 'none'" and page.headers["X-Frame-Options"] == "DENY"
        cookie = signed_in.cookies["hookledger_portal"]
        assert cookie["samesite"] == "Strict" and cookie["httponly"] and cookie["path"] == "/portal"
        response, _ = await browser.get("/portal/")
        assert response.status == 200 and _frame_ancestors(response) == "frame-ancestors 'none'"
    finally:
        await browser.close()


async def test_listed_origins_may_frame_the_portal_and_its_cookie_works_in_their_iframe(dash, pool):
    _, key, made, link = await _world(dash)
    await _api(dash, "PATCH", "/v1/account", key,
               json={"portal_frame_ancestors": [EMBEDDER, "https://other.customer.example:8443"]})
    browser, page, signed_in = await _sign_in(dash, link)
    try:
        expected = f"frame-ancestors {EMBEDDER} https://other.customer.example:8443"
        assert _frame_ancestors(page) == expected and "X-Frame-Options" not in page.headers
        assert "default-src 'self'" in page.headers["Content-Security-Policy"]
        cookie = signed_in.cookies["hookledger_portal"]
        assert cookie["samesite"] == "None" and cookie["secure"] and cookie["httponly"]
        assert "Partitioned" in signed_in.headers["Set-Cookie"]
        html = await browser.page("/portal/")
        response, _ = await browser.get("/portal/")
        assert _frame_ancestors(response) == expected and "X-Frame-Options" not in response.headers

        # The cookie now reaches cross-site requests: the form token and the Origin check refuse them.
        before = await _state(pool)
        endpoint_id = made["a"][0]
        response, _ = await browser.post(f"/portal/endpoints/{endpoint_id}/delete", {}, csrf=False)
        assert response.status == 403
        response, _ = await browser.post(f"/portal/endpoints/{endpoint_id}/delete", {"csrf_token": "forged"},
                                         csrf=False)
        assert response.status == 403
        response, _ = await browser.post(f"/portal/endpoints/{endpoint_id}/delete", {},
                                         headers={"Origin": EMBEDDER})
        assert response.status == 403
        assert await _state(pool) == before
        response, _ = await browser.post(f"/portal/endpoints/{endpoint_id}/enabled", {"enabled": "false"})
        assert response.status == 303  # the portal's own form, inside the iframe, posts with its own origin
        assert await pool.fetchval("SELECT enabled FROM endpoints WHERE id = $1::uuid", endpoint_id) is False

        # A spent link's refusal is shown in the same iframe; a token that is no link frames nothing;
        # another account's origins never frame this one's pages.
        _, other_key = await dash.account(balance=0)
        await _api(dash, "PATCH", "/v1/account", other_key, json={"portal_frame_ancestors": ["https://evil.example"]})
        token = urlsplit(link["url"]).query.removeprefix("token=")
        async with dash.http.post("/portal/sign-in", data={"token": token}) as spent:
            assert spent.status == 404 and "used already" in await spent.text()
            assert _frame_ancestors(spent) == expected
        async with dash.http.get("/portal/sign-in?token=not-a-link") as unknown:
            assert _frame_ancestors(unknown) == "frame-ancestors 'none'" and unknown.headers["X-Frame-Options"] == "DENY"
        assert "evil" not in html

        await browser.page("/portal/")
        response, _ = await browser.post("/portal/sign-out", {})
        assert response.status == 303
        cleared = response.headers["Set-Cookie"]
        assert "Max-Age=0" in cleared and "Partitioned" in cleared and "SameSite=None" in cleared
        response, _ = await browser.get("/portal/")
        assert response.status == 401
    finally:
        await browser.close()
