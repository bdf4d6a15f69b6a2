"""The overview shows the account's newest operational events as notices, in words, and only its own."""

from __future__ import annotations

from billing import accounts as billing_accounts
from billing.messages import MessageRequest, create_message
from billing.settle import DeadReason, settle


async def test_the_overview_shows_recent_operational_events_as_notices(dash, pool):
    account_id, key = await dash.account(balance=100, price=2)
    endpoint = await dash.endpoint(key)
    created = await create_message(pool, MessageRequest(account_id, "invoice.paid", b"{}"), attempts_max=3)
    await settle(pool, created.deliveries[0].id, DeadReason.OUT_OF_RETRIES, account_id=account_id, attempt=0)
    await pool.execute("UPDATE endpoints SET enabled = false WHERE id = $1::uuid", endpoint["id"])
    other_id, other_key = await dash.account(balance=0)
    await billing_accounts.top_up(pool, other_id, "someone-else", 77)
    await dash.sign_in(key)
    html = await dash.page("/dashboard/overview")
    notices = html.split('id="notices"', 1)[1].split("</section>", 1)[0]
    assert "1 deliveries died and were refunded (2 credits)." in notices
    assert "Endpoint https://example.com/hooks was disabled: you disabled it" in notices
    assert "100 credits were added" in notices  # the account's own top-up
    assert "77 credits" not in notices and "someone-else" not in notices


async def test_no_notices_no_section(dash):
    _, key = await dash.account(balance=0)
    await dash.sign_in(key)
    assert 'id="notices"' not in await dash.page("/dashboard/overview")
