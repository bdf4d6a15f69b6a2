"""A delivery's page in Chromium: the payload and the headers as sent, a delivery being sent, an erased
payload, replays linked both ways, refunds marked, and Replay offered only where it can succeed."""

from __future__ import annotations

import json
import re
import uuid

from browser_helpers import screenshot, sign_in, wait_for_state
from billing.settle import DeadReason, reclaim, settle
from delivery.dashboard.routes_deliveries import PAYLOAD_SHOWN_BYTES_MAX
from engine_helpers import running_worker


async def _send(api, key: str, payload: bytes, event_type: str = "invoice.paid") -> str:
    async with api.http.post("/v1/messages", data=b'{"event_type":"' + event_type.encode() + b'","payload":' + payload + b"}",
                             headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"}) as response:
        assert response.status == 202, await response.text()
        return (await response.json())["deliveries"][0]["id"]


async def test_the_payload_and_headers_sent_are_shown_escaped_and_the_secret_never(
        platform, browser_page, receiver_factory, pool):
    base_url, settings, api = platform
    page = browser_page
    receiver = await receiver_factory(lambda number: 200)
    account_id, key = await api.account(balance=100, price=1, name="Payload Co")
    await api.endpoint(key, url=receiver.url)
    payload = json.dumps({"invoice": 42, "note": "<script>document.title='owned'</script> & \"quotes\"",
                          "city": "東京"}, ensure_ascii=False).encode()
    delivery_id = await _send(api, key, payload)

    await sign_in(page, base_url, key)
    await page.goto(f"{base_url}/dashboard/deliveries/{delivery_id}")
    assert (await page.inner_text("#payload-text")).encode() == payload  # byte for byte, shown as text
    assert await page.title() != "owned" and not await page.locator("#payload script").count()
    assert await page.inner_text("#header-webhook-id") == delivery_id
    assert await page.inner_text("#header-content-type") == "application/json"
    assert await page.inner_text("#header-webhook-timestamp") == "—"  # no attempt yet
    assert "whsec_" not in await page.content()
    assert not await page.locator("#payload-cut").count()

    async with running_worker(settings, pool):
        await wait_for_state(page, "delivered")
    started = await pool.fetchval("SELECT started_at FROM delivery_attempts WHERE delivery_id = $1",
                                  uuid.UUID(delivery_id))
    assert await page.inner_text("#header-webhook-timestamp") == str(int(started.timestamp()))
    assert "whsec_" not in await page.content()
    await screenshot(page, "40-delivery-payload-and-headers")

    big = b'{"blob":"' + b"x" * (PAYLOAD_SHOWN_BYTES_MAX * 2) + b'"}'
    big_id = await _send(api, key, big)
    await page.goto(f"{base_url}/dashboard/deliveries/{big_id}")
    assert "Only its first 16 KiB are shown" in await page.inner_text("#payload-cut")
    assert len(await page.inner_text("#payload-text")) == PAYLOAD_SHOWN_BYTES_MAX
    assert f"{len(big)} bytes" in await page.inner_text("#payload")


async def test_a_delivery_being_sent_says_so_and_an_erased_payload_says_it_was_erased(platform, browser_page, pool):
    base_url, _, api = platform
    page = browser_page
    _, key = await api.account(balance=10, name="Sending Co")
    await api.endpoint(key)
    delivery_id = (await api.send(key))["deliveries"][0]["id"]
    await pool.execute("UPDATE deliveries SET state = 'sending', attempt = 1, leased_until = now() + interval '1 hour'"
                       " WHERE id = $1", uuid.UUID(delivery_id))
    await sign_in(page, base_url, key)
    await page.goto(f"{base_url}/dashboard/deliveries/{delivery_id}")
    being_sent = await page.inner_text("#being-sent")
    assert "Being sent now" in being_sent and "attempt 1" in being_sent
    assert "No attempt yet" not in await page.inner_text("main")
    await screenshot(page, "41-delivery-being-sent")

    await pool.execute("UPDATE messages SET payload = NULL WHERE id = (SELECT message_id FROM deliveries WHERE id = $1)",
                       uuid.UUID(delivery_id))
    await page.reload()
    assert "The payload was erased" in await page.inner_text("#payload-erased")


async def test_replays_link_both_ways_and_dead_rows_are_marked_refunded_or_reclaimed(platform, browser_page, pool):
    base_url, _, api = platform
    page = browser_page
    account_id, key = await api.account(balance=50, price=2, name="Replay Co")
    await api.endpoint(key)
    dead_id = (await api.send(key))["deliveries"][0]["id"]
    recovered_id = (await api.send(key))["deliveries"][0]["id"]
    for delivery_id in (dead_id, recovered_id):
        await settle(pool, uuid.UUID(delivery_id), DeadReason.OUT_OF_RETRIES, account_id=account_id, attempt=0)
    await reclaim(pool, uuid.UUID(recovered_id), account_id=account_id)  # a late 2xx: it arrived after all

    await sign_in(page, base_url, key)
    await page.goto(f"{base_url}/dashboard/deliveries")
    dead_row = page.locator("tr", has=page.locator(f"a[href='/dashboard/deliveries/{dead_id}']"))
    assert "refunded" in await dead_row.inner_text() and await dead_row.locator("s").count() == 1
    recovered_row = page.locator("tr", has=page.locator(f"a[href='/dashboard/deliveries/{recovered_id}']"))
    assert "refunded, then reclaimed" in await recovered_row.inner_text()
    await screenshot(page, "42-deliveries-refund-marks")

    await page.goto(f"{base_url}/dashboard/deliveries/{dead_id}")
    assert "refunded" in await page.inner_text("#price")
    await page.click("#replay")
    await page.click("#confirm")
    await page.wait_for_selector("#replay-of")
    replay_id = re.search(r"/deliveries/([0-9a-f-]{36})", page.url).group(1)
    assert await page.inner_text("#replay-of a") == dead_id
    await page.click("#replay-of a")
    await page.wait_for_selector("#replays")
    assert replay_id in await page.inner_text("#replays")
    await screenshot(page, "43-delivery-replayed-as")
    await page.click(f"#replays a[href='/dashboard/deliveries/{replay_id}']")
    await page.wait_for_selector("#replay-of")
    await page.goto(f"{base_url}/dashboard/deliveries")
    replay_row = page.locator("tr", has=page.locator(f"a[href='/dashboard/deliveries/{replay_id}']"))
    assert "replay" in await replay_row.inner_text()


async def test_replay_is_hidden_where_it_cannot_succeed_and_a_refused_one_answers_a_clear_page(
        platform, browser_page, pool):
    """Replaying a dead delivery whose endpoint was deleted answered 500; the API answers 422 for it."""
    base_url, _, api = platform
    page = browser_page
    account_id, key = await api.account(balance=50, price=2, name="Gone Co")
    endpoint = await api.endpoint(key)
    dead_id = (await api.send(key))["deliveries"][0]["id"]
    await settle(pool, uuid.UUID(dead_id), DeadReason.OUT_OF_RETRIES, account_id=account_id, attempt=0)

    await sign_in(page, base_url, key)
    await page.goto(f"{base_url}/dashboard/deliveries/{dead_id}/replay")
    async with api.http.delete(f"/v1/endpoints/{endpoint['id']}", headers={"Authorization": f"Bearer {key}"}) as gone:
        assert gone.status == 200
    charges = await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE account_id = $1 AND kind = 'charge'",
                                  account_id)
    async with page.expect_response(lambda r: r.url.endswith("/replay") and r.request.method == "POST") as posted:
        await page.click("#confirm")
    assert (await posted.value).status == 409
    blocked = await page.inner_text("#replay-blocked")
    assert "endpoint was deleted" in blocked and "Internal server error" not in await page.inner_text("main")
    assert "Nothing was charged" in await page.inner_text("main")
    assert await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE account_id = $1 AND kind = 'charge'",
                               account_id) == charges
    await screenshot(page, "44-replay-refused")

    await page.goto(f"{base_url}/dashboard/deliveries/{dead_id}")
    assert not await page.locator("#replay").count()
    assert "endpoint was deleted" in await page.inner_text("#replay-blocked")
    await screenshot(page, "45-delivery-replay-not-available")

    # A disabled endpoint and a short balance are said too, and Replay comes back once they are mended.
    other = await api.endpoint(key, url="https://example.com/other")
    second = (await api.send(key))["deliveries"][0]["id"]
    await settle(pool, uuid.UUID(second), DeadReason.OUT_OF_RETRIES, account_id=account_id, attempt=0)
    async with api.http.patch(f"/v1/endpoints/{other['id']}", json={"enabled": False},
                              headers={"Authorization": f"Bearer {key}"}) as response:
        assert response.status == 200
    await page.goto(f"{base_url}/dashboard/deliveries/{second}")
    assert "endpoint is disabled" in await page.inner_text("#replay-blocked")
    await pool.execute("UPDATE endpoints SET enabled = true WHERE id = $1", uuid.UUID(other["id"]))
    await pool.execute("UPDATE accounts SET price_per_delivery = 1000 WHERE id = $1", account_id)
    await page.reload()
    assert "does not cover a replay" in await page.inner_text("#replay-blocked")
    await pool.execute("UPDATE accounts SET price_per_delivery = 2 WHERE id = $1", account_id)
    await page.reload()
    assert await page.locator("#replay").count() == 1
