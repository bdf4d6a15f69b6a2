"""The operator opens an account, tops it up and deletes it from the dashboard, in Chromium: each form
checked as the API checks it (every error at once, in words), CSRF-protected, the deletion confirmed by
typing the account's name."""

from __future__ import annotations

import re
import uuid

from browser_helpers import screenshot, sign_in
from dashboard_helpers import OPERATOR_KEY
from billing.audit import audit
from delivery.operations import deletion


async def test_the_operator_opens_tops_up_and_deletes_an_account(platform, browser_page, pool):
    base_url, _, api = platform
    page = browser_page
    await sign_in(page, base_url, OPERATOR_KEY)
    assert page.url.endswith("/dashboard/operator")

    await page.fill("#open-account input[name=name]", "tab\tname")
    await page.fill("#open-account input[name=price_per_delivery]", "1.5")
    await page.click("#open-account button[type=submit]")
    errors = await page.inner_text("main .alert.error")
    assert "Name must not contain control characters" in errors and "Price per delivery must be a whole number" in errors
    assert "regex" not in errors and await pool.fetchval("SELECT count(*) FROM accounts") == 0
    await screenshot(page, "60-operator-open-account-errors")

    await page.fill("#open-account input[name=name]", "Umbrella Corp")
    await page.fill("#open-account input[name=price_per_delivery]", "2")
    await page.click("#open-account button[type=submit]")
    await page.wait_for_selector("#api-key")
    key = await page.inner_text("#api-key")
    account_id = uuid.UUID(await page.inner_text("#account-id"))
    assert key.startswith("hl_live_")
    async with api.http.get("/v1/balance", headers={"Authorization": f"Bearer {key}"}) as response:
        assert response.status == 200 and (await response.json())["balance"] == 0  # the key works
    await screenshot(page, "61-operator-account-opened")
    await page.reload()  # the browser sends the form again: the same account and key, not a second one
    assert await page.inner_text("#api-key") == key and "sent before" in await page.inner_text("main")
    assert await pool.fetchval("SELECT count(*) FROM accounts") == 1

    await page.click("#to-account")
    await page.fill("#top-up input[name=amount]", "ten")
    await page.fill("#top-up input[name=order_id]", "bad order id")
    await page.click("#top-up button[type=submit]")
    errors = await page.inner_text("main .alert.error")
    assert "Amount must be a whole number, not a string" in errors and "Order id may contain only letters" in errors
    await page.fill("#top-up input[name=amount]", "500")
    await page.fill("#top-up input[name=order_id]", "inv-2026-001")
    await page.click("#top-up button[type=submit]")
    await page.wait_for_selector("#notice")
    assert await page.inner_text("#balance") == "500" and "inv-2026-001" in await page.inner_text("#notice")
    await page.fill("#top-up input[name=amount]", "500")
    await page.fill("#top-up input[name=order_id]", "inv-2026-001")
    await page.click("#top-up button[type=submit]")
    await page.wait_for_selector("text=was applied before")
    assert await page.inner_text("#balance") == "500"  # once per order id
    await screenshot(page, "62-operator-account-topped-up")

    await page.click("#delete")
    await page.fill("#delete-account input[name=confirm]", "Umbrella")
    async with page.expect_response(lambda r: r.url.endswith("/delete") and r.request.method == "POST") as posted:
        await page.click("#confirm")
    assert (await posted.value).status == 422
    assert "nothing was deleted" in await page.inner_text("#delete-error")
    assert await pool.fetchval("SELECT status FROM accounts WHERE id = $1", account_id) == "active"
    await screenshot(page, "63-operator-delete-confirm")
    await page.eval_on_selector("#delete-account input[name=csrf_token]", "input => input.remove()")
    await page.fill("#delete-account input[name=confirm]", "Umbrella Corp")
    async with page.expect_response(lambda r: r.url.endswith("/delete") and r.request.method == "POST") as posted:
        await page.click("#confirm")
    assert (await posted.value).status == 403  # CSRF-protected like every form
    assert await pool.fetchval("SELECT count(*) FROM account_deletions") == 0

    await page.goto(f"{base_url}/dashboard/operator/accounts/{account_id}/delete")
    await page.fill("#delete-account input[name=confirm]", "Umbrella Corp")
    await page.click("#confirm")
    await page.wait_for_url(re.compile(rf".*/dashboard/operator/deletions/{account_id}$"))
    assert await pool.fetchval("SELECT count(*) FROM account_deletions WHERE account_id = $1", account_id) == 1
    await screenshot(page, "64-operator-deletion-started")
    await deletion.run_deletion(pool, account_id)  # what the worker's job does
    await page.reload()
    assert "done" in await page.inner_text("main")
    assert (await audit(pool, account_id)).clean
    assert await pool.fetchval("SELECT status FROM accounts WHERE id = $1", account_id) == "deleted"
    await screenshot(page, "65-operator-account-deleted")
