"""The portal's endpoint page (edit URL, event types from the catalog, channels; disable and enable;
reveal and rotate the secret) and delivery page (attempts, payload or its erasure, headers), over
HTTP on the real API app. Another application's ids answer 404 and change nothing."""

from __future__ import annotations

import uuid

from billing.settle import DeadReason, settle
from delivery.engine import claims
from delivery.engine.results import AttemptResult, record_results
from test_portal import _api, _signed_in, _world

TOO_LONG_CHANNEL = "c" * 200


async def _endpoints(pool) -> list[tuple]:
    rows = await pool.fetch("SELECT id, url, event_types, channels, enabled, secret, previous_secret,"
                            " previous_secret_expires_at, updated_at FROM endpoints ORDER BY id")
    return [tuple(row) for row in rows]


async def test_the_portal_edits_an_endpoint_and_a_refused_form_lists_every_error(dash, pool):
    _, key, made, link = await _world(dash)
    for name in ("invoice.paid", "invoice.failed"):
        await _api(dash, "POST", "/v1/event-types", key, json={"name": name, "description": f"when {name}"})
    endpoint_id = uuid.UUID(made["a"][0])
    browser = await _signed_in(dash, link)
    try:
        html = await browser.page(f"/portal/endpoints/{endpoint_id}")
        assert 'value="invoice.paid"' in html and 'value="invoice.failed"' in html and "when invoice.paid" in html

        # Every field wrong at once: each is named, in words, and nothing changes.
        before = await _endpoints(pool)
        response, html = await browser.post(f"/portal/endpoints/{endpoint_id}", {
            "url": "ftp://example.com/x", "event_type": "invoice.paid", "more_event_types": "bad!type",
            "channels": f"eu {TOO_LONG_CHANNEL}"})
        assert response.status == 422
        assert "URL" in html and "Event type “bad!type”" in html and f"Channel “{TOO_LONG_CHANNEL}”" in html
        assert html.count('class="error"') == 3
        assert await _endpoints(pool) == before
        response, html = await browser.post(f"/portal/endpoints/{endpoint_id}", {"url": "", "channels": "eu"})
        assert response.status == 422 and html.count('class="error"') == 1 and await _endpoints(pool) == before

        await browser.page(f"/portal/endpoints/{endpoint_id}")
        response, _ = await browser.post(f"/portal/endpoints/{endpoint_id}", {
            "url": "https://example.com/moved", "event_type": "invoice.paid", "more_event_types": "order.*, order.*",
            "channels": "eu, priority"})
        assert response.status == 303
        row = await pool.fetchrow("SELECT url, event_types, channels FROM endpoints WHERE id = $1", endpoint_id)
        assert tuple(row) == ("https://example.com/moved", ["invoice.paid", "order.*"], ["eu", "priority"])
        html = await browser.page(f"/portal/endpoints/{endpoint_id}?saved=1")
        assert 'value="invoice.paid" checked' in html and 'value="order.*"' in html and "Saved." in html

        # Nothing chosen: every event type, every channel.
        response, _ = await browser.post(f"/portal/endpoints/{endpoint_id}", {"url": "https://example.com/moved"})
        assert response.status == 303
        row = await pool.fetchrow("SELECT event_types, channels FROM endpoints WHERE id = $1", endpoint_id)
        assert tuple(row) == (None, None)

        await browser.page(f"/portal/endpoints/{endpoint_id}")
        response, _ = await browser.post(f"/portal/endpoints/{endpoint_id}/enabled", {"enabled": "false"})
        assert response.status == 303
        assert await pool.fetchval("SELECT enabled FROM endpoints WHERE id = $1", endpoint_id) is False
        html = await browser.page(f"/portal/endpoints/{endpoint_id}?disabled=1")
        assert "disabled" in html
        response, _ = await browser.post(f"/portal/endpoints/{endpoint_id}/enabled", {"enabled": "true"})
        assert response.status == 303
        assert await pool.fetchval("SELECT enabled FROM endpoints WHERE id = $1", endpoint_id) is True
    finally:
        await browser.close()


async def test_the_portal_reveals_and_rotates_a_secret_with_the_apis_overlap(dash, pool):
    _, key, made, link = await _world(dash)
    endpoint_id = made["a"][0]
    secret = (await _api(dash, "GET", f"/v1/endpoints/{endpoint_id}/secret", key))["secret"]
    browser = await _signed_in(dash, link)
    try:
        html = await browser.page(f"/portal/endpoints/{endpoint_id}/secret/reveal")
        assert secret not in html  # the confirmation page does not show it
        response, html = await browser.post(f"/portal/endpoints/{endpoint_id}/secret/reveal", {})
        assert response.status == 200 and secret in html and response.headers["Cache-Control"] == "no-store"
        await browser.page(f"/portal/endpoints/{endpoint_id}/secret/rotate")
        response, html = await browser.post(f"/portal/endpoints/{endpoint_id}/secret/rotate", {})
        assert response.status == 200
        rotated = (await _api(dash, "GET", f"/v1/endpoints/{endpoint_id}/secret", key))["secret"]
        assert rotated != secret and rotated in html and secret not in html
        overlap = await pool.fetchval("SELECT extract(epoch FROM previous_secret_expires_at - now())"
                                      " FROM endpoints WHERE id = $1", uuid.UUID(endpoint_id))
        assert 23 * 3600 < overlap <= 24 * 3600
    finally:
        await browser.close()


async def test_another_applications_or_accounts_ids_answer_404_on_every_new_page_and_change_nothing(dash, pool):
    _, _, made, link = await _world(dash)
    other_endpoint, other_delivery = made["b"]
    _, stranger_key = await dash.account(balance=10)
    stranger_endpoint = (await dash.endpoint(stranger_key, "https://example.com/stranger"))["id"]
    stranger_delivery = (await dash.send(stranger_key))["deliveries"][0]["id"]
    browser = await _signed_in(dash, link)
    try:
        await browser.page("/portal/")
        before = await _endpoints(pool)
        for path in (f"/portal/endpoints/{stranger_endpoint}", f"/portal/deliveries/{stranger_delivery}",
                     f"/portal/endpoints/{stranger_endpoint}/secret/reveal",f"/portal/endpoints/{other_endpoint}", f"/portal/endpoints/{other_endpoint}/secret/reveal",
                     f"/portal/endpoints/{other_endpoint}/secret/rotate", f"/portal/deliveries/{other_delivery}",
                     f"/portal/deliveries/{uuid.uuid4()}", "/portal/deliveries/not-an-id", "/portal/endpoints/x"):
            response, html = await browser.get(path)
            assert response.status == 404, path
            assert "example.com/b-hooks" not in html and "example.com/stranger" not in html
        for path, form in ((f"/portal/endpoints/{other_endpoint}", {"url": "https://example.com/taken"}),
                           (f"/portal/endpoints/{stranger_endpoint}", {"url": "https://example.com/taken"}),
                           (f"/portal/endpoints/{stranger_endpoint}/secret/rotate", {}),
                           (f"/portal/endpoints/{other_endpoint}/enabled", {"enabled": "false"}),
                           (f"/portal/endpoints/{other_endpoint}/secret/reveal", {}),
                           (f"/portal/endpoints/{other_endpoint}/secret/rotate", {})):
            response, html = await browser.post(path, form)
            assert response.status == 404, path
            assert "whsec_" not in html
        assert await _endpoints(pool) == before
    finally:
        await browser.close()


async def test_a_delivery_page_shows_attempts_payload_and_headers_and_says_when_it_was_erased(dash, pool):
    account_id, key, made, link = await _world(dash)
    delivery_id = uuid.UUID(made["a"][1])
    [claimed] = await claims.claim_ids(pool, [claims.DeliveryKey(account_id, delivery_id)], lease_ms=30_000)
    await record_results(pool, [AttemptResult(delivery_id, claimed.attempt, account_id, False, 12, status_code=503,
                                              response_excerpt="upstream <b>down</b>", retry_delay_seconds=3600)])
    browser = await _signed_in(dash, link)
    try:
        html = await browser.page(f"/portal/deliveries/{delivery_id}")
        assert "503" in html and "12 ms" in html and "upstream &lt;b&gt;down&lt;/b&gt;" in html
        assert 'id="payload-text">{}</pre>' in html
        webhook_id = await pool.fetchval("SELECT coalesce(webhook_id, id) FROM deliveries WHERE id = $1", delivery_id)
        assert f'id="header-webhook-id">{webhook_id}<' in html and "webhook-signature" in html
        assert "balance" not in html.lower() and "ledger entr" not in html.lower() and "credits" not in html

        await settle(pool, delivery_id, DeadReason.OUT_OF_RETRIES, account_id=account_id, attempt=claimed.attempt)
        html = await browser.page(f"/portal/deliveries/{delivery_id}")
        assert 'id="replay">Replay (3 credits)' in html
        message_id = await pool.fetchval("SELECT message_id FROM deliveries WHERE id = $1", delivery_id)
        await _api(dash, "POST", f"/v1/messages/{message_id}/expunge", key)
        erased_on = await pool.fetchval("SELECT to_char(payload_erased_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')"
                                        " FROM messages WHERE id = $1", message_id)
        html = await browser.page(f"/portal/deliveries/{delivery_id}")
        assert f"erased on {erased_on}" in html and 'id="payload-text"' not in html
        assert "upstream" not in html and 'id="replay"' not in html
        home = await browser.page("/portal/")
        assert f'href="/portal/deliveries/{delivery_id}"' in home
    finally:
        await browser.close()
