"""A form refused shows every error at once, each saying in words what is allowed (no regular expression)."""

from __future__ import annotations

from browser_helpers import screenshot, sign_in


async def test_the_endpoint_form_lists_every_error_in_words(platform, browser_page, pool):
    base_url, _, api = platform
    page = browser_page
    _, key = await api.account(name="Forms Co")
    await sign_in(page, base_url, key)
    await page.goto(f"{base_url}/dashboard/endpoints")
    await page.fill("#create-endpoint input[name=url]", "ftp://example.com/hooks")
    await page.fill("#create-endpoint input[name=event_types]", "invoice.paid, bad/type, also*bad")
    await page.click("#create-endpoint button[type=submit]")
    errors = await page.eval_on_selector_all("main .alert.error li", "items => items.map(i => i.textContent)")
    assert len(errors) == 3, errors
    assert errors[0].startswith("URL: ") and "http" in errors[0]
    assert errors[1:] == [f"Event type “{name}” may contain only letters, digits and _ . : -, and may end in .* for"
                          " every type that starts with what comes before it (like invoice.*)"
                          for name in ("bad/type", "also*bad")]
    assert "regex" not in await page.inner_text("main") and "(?!" not in await page.inner_text("main")
    assert await pool.fetchval("SELECT count(*) FROM endpoints") == 0
    await screenshot(page, "66-endpoint-form-errors")

    await page.fill("#create-endpoint input[name=url]", "https://example.com/hooks")
    await page.fill("#create-endpoint input[name=event_types]", "invoice.paid")
    await page.click("#create-endpoint button[type=submit]")
    await page.wait_for_selector("text=Endpoint created")
    await page.fill("#edit-endpoint input[name=event_types]", "ok, bad/one, fine, bad|two")
    await page.click("#edit-endpoint button[type=submit]")
    errors = await page.eval_on_selector_all("main .alert.error li", "items => items.map(i => i.textContent)")
    assert errors == [f"Event type “{name}” may contain only letters, digits and _ . : -, and may end in .* for"
                      " every type that starts with what comes before it (like invoice.*)"
                      for name in ("bad/one", "bad|two")], errors
