"""The customer portal inside another site's iframe, in Chromium: the account lists the embedding
origin, its customer signs in with the link inside the iframe and, the session cookie being
SameSite=None; Secure; Partitioned, stays signed in there and can use the portal's forms. An origin
the account does not list gets no portal: the browser refuses to frame it.

The embedding page is served from http://localhost (another site than the portal's
http://127.0.0.1; Chromium treats both as secure contexts, so a Secure cookie is kept). The API
accepts only https origins, so the list is written to the database here."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import TestServer

from browser_helpers import screenshot


async def _api(api, method: str, path: str, key: str, **kwargs) -> dict:
    async with api.http.request(method, path, headers={"Authorization": f"Bearer {key}"}, **kwargs) as response:
        assert response.status < 300, await response.text()
        return await response.json()


async def _embedder(src: str) -> TestServer:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text=f'<!doctype html><title>Customer app</title><h1>Customer app</h1>'
                                 f'<iframe id="portal" src="{src}" width="1000" height="700"></iframe>',
                            content_type="text/html")
    app = web.Application()
    app.router.add_get("/", page)
    server = TestServer(app, host="localhost")
    await server.start_server()
    return server


async def test_a_listed_origin_embeds_the_portal_and_the_session_works_in_its_iframe(platform, browser_page, pool):
    _, _, api = platform
    page = browser_page
    account_id, key = await api.account(balance=100, price=2, name="App Co")
    await _api(api, "POST", "/v1/applications", key, json={"name": "Globex", "uid": "globex"})
    await _api(api, "POST", "/v1/applications/globex/endpoints", key, json={"url": "https://example.com/globex"})
    link = await _api(api, "POST", "/v1/applications/globex/portal-links", key)
    embedder = await _embedder(link["url"])
    try:
        origin = str(embedder.make_url("")).rstrip("/")
        await pool.execute("UPDATE accounts SET portal_frame_ancestors = $2 WHERE id = $1", account_id, [origin])
        await page.goto(origin + "/")
        portal = page.frame_locator("#portal")
        await portal.locator("#portal-sign-in button").click()
        await portal.locator("#endpoints").wait_for()
        assert "https://example.com/globex" in await portal.locator("#endpoints").inner_text()
        await portal.locator("#endpoints a").first.click()
        await portal.locator("#toggle-enabled button").click()
        await portal.locator("#endpoint-state").wait_for()
        assert "disabled" in await portal.locator("#endpoint-state").inner_text()
        assert await pool.fetchval("SELECT enabled FROM endpoints WHERE url = 'https://example.com/globex'") is False
        await screenshot(page, "64-portal-in-an-iframe")
    finally:
        await embedder.close()

    # Not listed: the browser refuses to show the portal in the frame (nothing is signed in).
    other_link = await _api(api, "POST", "/v1/applications/globex/portal-links", key)
    embedder = await _embedder(other_link["url"])
    try:
        await pool.execute("UPDATE accounts SET portal_frame_ancestors = '{}' WHERE id = $1", account_id)
        async with page.expect_response(lambda response: "/portal/sign-in" in response.url) as answered:
            await page.goto(str(embedder.make_url("")).rstrip("/") + "/")
        assert (await answered.value).status == 200  # the portal answered; the browser would not show it
        frames = [frame for frame in page.frames if frame != page.main_frame]
        for _ in range(100):
            if frames[0].url.startswith("chrome-error://"):
                break
            await page.wait_for_timeout(100)
        assert frames[0].url.startswith("chrome-error://"), frames[0].url
    finally:
        await embedder.close()
