"""The customer portal in Chromium: an app makes an application and a portal link; its customer
signs in with the link, adds an endpoint on a loopback receiver, sends a test event and sees it
delivered, replays a dead delivery; the link does not sign in twice."""

from __future__ import annotations

import time
import uuid

from browser_helpers import screenshot
from billing.settle import DeadReason, settle
from engine_helpers import running_worker


async def _api(api, method: str, path: str, key: str, **kwargs) -> dict:
    async with api.http.request(method, path, headers={"Authorization": f"Bearer {key}"}, **kwargs) as response:
        assert response.status < 300, await response.text()
        return await response.json()


async def _until_delivered(page, count: int, seconds: float = 20) -> None:
    """Reload the portal until `count` of its deliveries are delivered (the worker sends meanwhile)."""
    deadline = time.monotonic() + seconds
    while await page.locator("#deliveries td.state", has_text="delivered").count() < count:
        assert time.monotonic() < deadline, await page.inner_text("#deliveries")
        await page.wait_for_timeout(300)
        await page.reload()


async def test_a_customer_signs_in_adds_an_endpoint_tests_it_and_replays_a_dead_delivery(
        platform, browser_page, receiver_factory, pool):
    base_url, settings, api = platform
    page = browser_page
    receiver = await receiver_factory(lambda number: 200)
    account_id, key = await api.account(balance=100, price=2, name="App Co")
    await _api(api, "POST", "/v1/applications", key, json={"name": "Globex", "uid": "globex"})
    link = await _api(api, "POST", "/v1/applications/globex/portal-links", key)

    await page.goto(link["url"])
    await screenshot(page, "60-portal-sign-in")
    async with page.expect_navigation():
        await page.click("#portal-sign-in button")
    assert page.url == f"{base_url}/portal/"
    assert "No endpoints yet" in await page.inner_text("#endpoints")

    await page.fill("#add-endpoint input[name=url]", receiver.url)
    async with page.expect_navigation():
        await page.click("#add-endpoint button")
    assert receiver.url in await page.inner_text("#endpoints")
    async with page.expect_navigation():
        await page.click(".test-event button")
    assert "Send test event (2 credits)" in await page.inner_text("#endpoints")
    async with running_worker(settings, pool):
        await _until_delivered(page, 1)
    assert receiver.received and receiver.received[0]["body"] == b'{"test":true,"sent_from":"the webhook portal"}'
    await screenshot(page, "61-portal-test-event-delivered")

    # The delivery's page: its attempt, payload and headers; then the endpoint's page: edit, reveal.
    async with page.expect_navigation():
        await page.click("#deliveries td a")
    assert "200" in await page.inner_text("#attempts")
    assert await page.inner_text("#payload-text") == '{"test":true,"sent_from":"the webhook portal"}'
    await page.goto(f"{base_url}/portal/")
    async with page.expect_navigation():
        await page.click(f"#endpoints a:has-text('{receiver.url}')")
    await page.fill("#edit-endpoint input[name=more_event_types]", "a, webhook.*")
    async with page.expect_navigation():
        await page.click("#edit-endpoint button")
    assert "Saved." in await page.inner_text("main")
    assert await pool.fetchval("SELECT event_types FROM endpoints WHERE url = $1", receiver.url) == ["a", "webhook.*"]
    async with page.expect_navigation():
        await page.click("a:has-text('Reveal secret')")
    async with page.expect_navigation():
        await page.click("#confirm")
    assert (await page.inner_text("#secret")).startswith("whsec_")
    await screenshot(page, "63-portal-secret")
    await page.goto(f"{base_url}/portal/")

    # A delivery that died: the customer replays it, and the account pays for the replay.
    sent = await _api(api, "POST", "/v1/applications/globex/messages", key, json={"event_type": "a", "payload": {}})
    dead = uuid.UUID(sent["deliveries"][0]["id"])
    owner = await pool.fetchval("SELECT account_id FROM deliveries WHERE id = $1", dead)
    await settle(pool, dead, DeadReason.ENDPOINT_DISABLED, account_id=owner, attempt=0)
    await page.reload()
    balance = await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id)
    async with page.expect_navigation():
        await page.click(f"form[action='/portal/deliveries/{dead}/replay'] button")
    assert await pool.fetchval("SELECT count(*) FROM deliveries WHERE replay_of = $1", dead) == 1
    assert await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id) == balance - 2
    async with running_worker(settings, pool):
        await _until_delivered(page, 2)
    assert len(receiver.received) == 2
    assert "balance" not in (await page.content()).lower()
    await screenshot(page, "62-portal-replayed")

    # The link again, in a browser of its own: it does not sign in twice.
    second = await page.context.browser.new_context()
    try:
        other = await second.new_page()
        await other.goto(link["url"])
        await other.click("#portal-sign-in button")
        await other.wait_for_selector("#problem")
        assert "used already" in await other.inner_text("#problem")
    finally:
        await second.close()
