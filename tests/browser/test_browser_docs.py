"""/docs in Chromium: Redoc, served from our own origin under our Content-Security-Policy, renders
the OpenAPI document (every tag, the operations by their summaries), nothing is refused by the CSP
or fetched from another host, and the page links the dashboard, the receiving guide and the document.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from browser_helpers import screenshot


async def test_docs_render_the_document_under_our_csp(platform, browser_page):
    base_url, _, _ = platform
    page = browser_page
    console_errors: list[str] = []
    hosts: set[str] = set()
    page.on("console", lambda message: console_errors.append(message.text) if message.type == "error" else None)
    page.on("requestfinished", lambda request: hosts.add(urlsplit(request.url).netloc))
    not_found: list[str] = []
    page.on("response", lambda response: not_found.append(response.url) if response.status >= 400 else None)

    response = await page.goto(f"{base_url}/docs")
    assert response.status == 200
    assert "script-src 'self'" in response.headers["content-security-policy"]
    await page.locator("h2", has_text="Send a message").first.wait_for(timeout=30_000)
    for tag in ("Messages", "Deliveries", "Endpoints", "Billing", "API keys", "Accounts", "Health"):
        assert await page.locator(f"text={tag}").count(), tag
    assert await page.locator("h2", has_text="List deliveries").count()
    await screenshot(page, "docs")

    # Nothing from another host; blob: (Redoc's search worker) has no host.
    assert hosts - {""} == {urlsplit(base_url).netloc}, hosts
    # Redoc's bundle always asks for its maker's logo from their CDN; our CSP refuses it, and
    # Redoc then leaves the logo out. That refusal is the policy at work; nothing else is refused.
    refused = [text for text in console_errors if "Content Security Policy" in text]
    assert all("https://cdn.redoc.ly/redoc/logo-mini.svg" in text and "blocked" in text for text in refused), refused
    assert not_found == [], not_found
    links = await page.eval_on_selector_all("nav a", "links => links.map(link => link.getAttribute('href'))")
    assert links == ["/dashboard/", "/docs/receiving", "/openapi.json"]
    guide = await page.request.get(f"{base_url}/docs/receiving")
    assert guide.status == 200 and "webhook-id" in await guide.text()
