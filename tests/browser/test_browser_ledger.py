"""The ledger page in Chromium: entries in the API's order (oldest first), and charged, refunded and net per day."""

from __future__ import annotations

import uuid

from browser_helpers import screenshot, sign_in
from billing import accounts as billing_accounts
from billing.audit import audit
from billing.settle import DeadReason, settle


async def _cells(page, selector: str) -> list[str]:
    return await page.eval_on_selector_all(f"{selector} td", "cells => cells.map(c => c.textContent.trim())")


async def test_the_ledger_lists_oldest_first_like_the_api_with_totals_per_day(platform, browser_page, pool):
    base_url, _, api = platform
    page = browser_page
    account_id, key = await api.account(balance=0, price=3, name="Ledger Co")
    # Yesterday's top-up, written as a top-up writes it but dated a day back (the ledger takes inserts).
    async with pool.acquire() as connection, connection.transaction():
        await connection.execute("INSERT INTO ledger_entries (id, account_id, kind, amount, created_at)"
                                 " VALUES ('topup:yesterday', $1, 'topup', 50, now() - interval '1 day')", account_id)
        await connection.execute("UPDATE accounts SET balance = balance + 50 WHERE id = $1", account_id)
    await billing_accounts.top_up(pool, account_id, "today", 50)
    await api.endpoint(key)
    sent = [(await api.send(key))["deliveries"][0]["id"] for _ in range(4)]
    await settle(pool, uuid.UUID(sent[1]), DeadReason.OUT_OF_RETRIES, account_id=account_id, attempt=0)
    assert (await audit(pool, account_id)).clean
    async with api.http.get("/v1/ledger", headers={"Authorization": f"Bearer {key}"}) as response:
        api_order = [entry["id"] for entry in (await response.json())["data"]]

    await sign_in(page, base_url, key)
    await page.goto(f"{base_url}/dashboard/ledger")
    shown = await page.eval_on_selector_all("#ledger tbody tr td:nth-child(3) code", "cells => cells.map(c => c.textContent)")
    assert shown == api_order and shown[0] == "topup:yesterday"  # the order of GET /v1/ledger
    # Day, deliveries, charged, refunded, net, top-ups and other, balance change
    assert (await _cells(page, "#daily-totals tbody tr:nth-child(1)"))[1:] == ["0", "0", "0", "0", "+50", "+50"]
    assert (await _cells(page, "#daily-totals tbody tr:nth-child(2)"))[1:] == ["4", "12", "3", "9", "+50", "+41"]
    assert (await _cells(page, "#daily-totals tr.total")) == ["Total", "4", "12", "3", "9", "+100", "+91"]
    assert await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id) == 91
    await screenshot(page, "50-ledger-totals-per-day")
