"""The dashboard in a real browser: an account's day, the operator's view, and the refusals."""

from __future__ import annotations

import re

from browser_helpers import screenshot, sign_in, wait_for_state
from dashboard_helpers import OPERATOR_KEY
from billing.messages import MessageRequest, create_message
from billing.settle import DeadReason, settle
from delivery.operations import deletion
from engine_helpers import running_worker


async def _create_endpoint(page, base_url: str, url: str, event_types: str) -> str:
    await page.goto(f"{base_url}/dashboard/endpoints")
    await page.fill("#create-endpoint input[name=url]", url)
    await page.fill("#create-endpoint input[name=event_types]", event_types)
    await page.click("#create-endpoint button[type=submit]")
    await page.wait_for_selector("text=Endpoint created")
    return page.url.split("/endpoints/")[1].split("?")[0]


async def test_account_signs_in_creates_an_endpoint_watches_a_delivery_and_replays_a_dead_one(
        platform, browser_page, receiver_factory, pool):
    """Sign in, see the balance, create endpoints, send through the API, watch delivered and dead, replay, see the charge."""
    base_url, settings, api = platform
    page = browser_page
    ok_receiver = await receiver_factory(lambda number: 200)
    failing_receiver = await receiver_factory(lambda number: 503)
    account_id, key = await api.account(balance=100, price=2, name="Acme Payments")

    await page.goto(f"{base_url}/dashboard/")
    assert page.url.endswith("/dashboard/sign-in")
    await screenshot(page, "01-sign-in")
    await sign_in(page, base_url, key)
    assert page.url.endswith("/dashboard/overview"), await page.inner_text("main")
    assert await page.inner_text("#balance") == "100"
    await screenshot(page, "02-overview-new-account")

    await _create_endpoint(page, base_url, ok_receiver.url, "order.paid")
    await screenshot(page, "03-endpoint-created")
    await page.click("text=Reveal secret…")
    await page.click("#confirm")
    assert (await page.inner_text("#secret")).startswith("whsec_")
    await screenshot(page, "04-endpoint-secret")
    await _create_endpoint(page, base_url, failing_receiver.url, "order.failed")
    await page.goto(f"{base_url}/dashboard/endpoints")
    await screenshot(page, "05-endpoints")

    async with running_worker(settings, pool):
        paid = (await api.send(key, "order.paid"))["deliveries"][0]["id"]
        failed = (await api.send(key, "order.failed"))["deliveries"][0]["id"]
        await page.goto(f"{base_url}/dashboard/deliveries/{paid}")
        await wait_for_state(page, "delivered")
        assert await page.inner_text("#attempts tbody tr:first-child td:nth-child(3)") == "200"
        assert f"charge:{paid}" in await page.inner_text("#entries")
        await screenshot(page, "06-delivery-delivered")

        await page.goto(f"{base_url}/dashboard/deliveries/{failed}")
        await wait_for_state(page, "dead")
        assert await page.inner_text("#dead-reason") == "out_of_retries"
        assert await page.locator("#attempts tbody tr").count() == 3
        assert f"refund:{failed}" in await page.inner_text("#entries")
        await screenshot(page, "07-delivery-dead")

        await page.goto(f"{base_url}/dashboard/deliveries")
        await screenshot(page, "08-deliveries")
        await page.goto(f"{base_url}/dashboard/deliveries/{failed}")
        await page.click("#replay")
        assert "2 credits" in await page.inner_text("#cost")
        await screenshot(page, "09-replay-confirm")
        await page.click("#confirm")
        await page.wait_for_selector("text=Replayed from")
        replayed = re.search(r"/deliveries/([0-9a-f-]{36})", page.url).group(1)
        assert replayed != failed

    await page.goto(f"{base_url}/dashboard/ledger")
    ledger = await page.inner_text("#ledger")
    assert f"charge:{replayed}" in ledger
    last_row = await page.inner_text("#ledger tbody tr:last-child")  # oldest first, as GET /v1/ledger
    assert f"charge:{replayed}" in last_row and "-2" in last_row
    await screenshot(page, "10-ledger")
    await page.goto(f"{base_url}/dashboard/overview")
    assert await page.locator("svg rect.bar").count() >= 1
    await screenshot(page, "11-overview-with-chart")


async def test_operator_sees_accounts_dead_letters_audit_and_deletions(platform, browser_page, pool):
    """The operator key opens the operator's pages: balances, a dead letter from an account, a clean audit, a deletion."""
    base_url, _, api = platform
    page = browser_page
    account_id, key = await api.account(balance=30, price=3, name="Globex")
    gone_id, gone_key = await api.account(balance=12, price=1, name="Initech (leaving)")
    await api.endpoint(key)
    created = await create_message(pool, MessageRequest(account_id, "invoice.paid", b"{}"), attempts_max=3)
    dead_id = created.deliveries[0].id
    await settle(pool, dead_id, DeadReason.ENDPOINT_DISABLED, account_id=account_id, attempt=0)
    await deletion.start_account_deletion(pool, None, gone_id)
    await deletion.run_deletion(pool, gone_id)

    await sign_in(page, base_url, OPERATOR_KEY)
    assert page.url.endswith("/dashboard/operator")
    assert "Globex" in await page.inner_text("#accounts")
    await screenshot(page, "20-operator-accounts")
    await page.click("text=Dead letters")
    assert str(dead_id)[-12:] in await page.inner_text("#dead-letters")
    await screenshot(page, "21-operator-dead-letters")
    await page.click(f"text=…{str(dead_id)[-12:]}")
    await page.wait_for_selector("text=endpoint_disabled")
    await screenshot(page, "22-operator-dead-letter")
    await page.click("text=Audit")
    await page.click("#run-audit")
    await page.wait_for_selector("#audit-result .badge.ok")
    await screenshot(page, "23-operator-audit")
    await page.click("text=Deletions")
    assert "done" in await page.inner_text("#deletions")
    await page.click("text=Initech (leaving)")
    await page.wait_for_selector("text=owed_to_customer")
    await screenshot(page, "24-operator-deletion")


async def test_refusals_wrong_key_other_accounts_delivery_missing_csrf_and_sign_out(platform, browser_page, pool):
    """A wrong key is refused; another account's delivery is a 404 page; a form without its token is 403; sign-out ends it."""
    base_url, _, api = platform
    page = browser_page
    other_id, other_key = await api.account(name="Other")
    await api.endpoint(other_key)
    theirs = (await api.send(other_key))["deliveries"][0]["id"]
    _, key = await api.account(name="Mine")

    await sign_in(page, base_url, "hl_live_not-a-real-key")
    assert "That key is not valid" in await page.inner_text("main")
    await screenshot(page, "30-wrong-key")

    await sign_in(page, base_url, key)
    response = await page.goto(f"{base_url}/dashboard/deliveries/{theirs}")
    assert response.status == 404 and "no such delivery" in await page.inner_text("main")
    await screenshot(page, "31-other-accounts-delivery-404")

    await page.goto(f"{base_url}/dashboard/endpoints")
    await page.fill("#create-endpoint input[name=url]", "https://example.com/hooks")
    await page.eval_on_selector("#create-endpoint input[name=csrf_token]", "input => input.remove()")
    async with page.expect_response(lambda r: r.url.endswith("/dashboard/endpoints") and r.request.method == "POST") as posted:
        await page.click("#create-endpoint button[type=submit]")
    assert (await posted.value).status == 403
    assert "security token" in await page.inner_text("main")
    assert await pool.fetchval("SELECT count(*) FROM endpoints WHERE account_id <> $1", other_id) == 0
    await screenshot(page, "32-missing-csrf-403")

    await page.goto(f"{base_url}/dashboard/overview")
    await page.click("text=Sign out")
    await page.wait_for_url(f"{base_url}/dashboard/sign-in")
    assert await pool.fetchval("SELECT count(*) FROM dashboard_sessions") == 0
    await page.goto(f"{base_url}/dashboard/overview")
    assert page.url.endswith("/dashboard/sign-in")
