"""The dashboard shows a delivery's webhook-id (a replay's is the replayed delivery's), the
endpoint's custom headers and those each attempt was sent with; an endpoint's page its signing
kind and rate limit; rotating an Ed25519 endpoint there keeps it Ed25519 and shows the new whpk_
public key, never a whsk_. The endpoint forms set the rate limit, custom headers and signing key
type with the API's rules: a refused form lists every error in words and writes nothing."""

from __future__ import annotations

import json
import re
import uuid

from billing.messages import MessageRequest, create_message
from billing.settle import DeadReason, settle
from delivery.operations import dead_letters


async def test_a_replays_page_shows_the_webhook_id_it_is_sent_under(dash, pool):
    account_id, key = await dash.account()
    endpoint = await dash.endpoint(key, headers={"X-Tenant": "acme"})
    created = await create_message(pool, MessageRequest(account_id, "invoice.paid", b"{}"), attempts_max=3)
    dead = created.deliveries[0].id
    await settle(pool, dead, DeadReason.OUT_OF_RETRIES, account_id=account_id, attempt=0)
    replay = (await dead_letters.replay(pool, dead, attempts_max=3)).created[dead]
    await dash.sign_in(key)
    html = await dash.page(f"/dashboard/deliveries/{dead}")
    assert re.search(rf'id="webhook-id"><code>{dead}</code></dd>', html)
    html = await dash.page(f"/dashboard/deliveries/{replay}")
    assert re.search(rf'id="webhook-id"><code>{dead}</code> <span class="muted">', html)
    assert "<code>X-Tenant: acme</code>" in html
    page = await dash.page(f"/dashboard/endpoints/{endpoint['id']}")
    assert "HMAC-SHA256" in page and "<code>X-Tenant: acme</code>" in page


async def test_rotating_an_ed25519_endpoint_keeps_it_ed25519_and_shows_only_the_public_key(dash, pool):
    _, key = await dash.account()
    endpoint = await dash.endpoint(key, signing_key_type="ed25519")
    endpoint_id = uuid.UUID(endpoint["id"])
    await dash.sign_in(key)
    assert "Ed25519" in await dash.page(f"/dashboard/endpoints/{endpoint_id}")
    await dash.page(f"/dashboard/endpoints/{endpoint_id}/secret/reveal")
    _, html = await dash.post(f"/dashboard/endpoints/{endpoint_id}/secret/reveal", {})
    shown = re.search(r'id="secret">(whpk_[^<]+)<', html).group(1)
    assert "Public key" in html and "whsk_" not in html
    await dash.page(f"/dashboard/endpoints/{endpoint_id}/secret/rotate")
    response, html = await dash.post(f"/dashboard/endpoints/{endpoint_id}/secret/rotate", {})
    rotated = re.search(r'id="secret">(whpk_[^<]+)<', html).group(1)
    assert response.status == 200 and rotated != shown and "whsk_" not in html and "New public key" in html
    assert await pool.fetchval("SELECT signing_key_type FROM endpoints WHERE id = $1", endpoint_id) == "ed25519"
    async with dash.http.get(f"/v1/endpoints/{endpoint_id}/secret", headers={"Authorization": f"Bearer {key}"}) as api:
        assert await api.json() == {"secret": rotated, "signing_key_type": "ed25519"}


async def _endpoint_row(pool, endpoint_id: uuid.UUID):
    return await pool.fetchrow("SELECT rate_limit_per_second, headers::text AS headers, signing_key_type, secret,"
                               " previous_secret, description FROM endpoints WHERE id = $1", endpoint_id)


async def test_the_create_form_sets_the_rate_limit_custom_headers_and_an_ed25519_key(dash, pool):
    """Created from the form: the row holds the limit, the headers (one `Name: value` a line, blank
    lines skipped) and an Ed25519 key; the endpoint's page shows them and prefills its edit form."""
    _, key = await dash.account()
    await dash.sign_in(key)
    await dash.page("/dashboard/endpoints")
    response, html = await dash.post("/dashboard/endpoints", {
        "url": "https://example.com/hooks", "description": "", "event_types": "",
        "rate_limit_per_second": " 50 ", "headers": "X-Tenant: acme\r\n\r\nAuthorization: Bearer a:b ",
        "signing_key_type": "ed25519"})
    assert response.status == 303, html[:800]
    endpoint_id = uuid.UUID(response.headers["Location"].split("/")[-1].split("?")[0])
    row = await _endpoint_row(pool, endpoint_id)
    assert row["rate_limit_per_second"] == 50 and row["signing_key_type"] == "ed25519"
    assert json.loads(row["headers"]) == {"X-Tenant": "acme", "Authorization": "Bearer a:b"}
    html = await dash.page(f"/dashboard/endpoints/{endpoint_id}")
    assert re.search(r'id="rate-limit">50 requests per second', html)
    assert "<code>X-Tenant: acme</code>" in html and "<code>Authorization: Bearer a:b</code>" in html
    assert "Ed25519" in html and 'name="rate_limit_per_second" maxlength="32" placeholder="no limit" value="50"' in html
    assert ">X-Tenant: acme\nAuthorization: Bearer a:b</textarea>" in html


async def test_a_refused_create_form_lists_every_error_and_writes_nothing(dash, pool):
    """A limit out of range, a header line without a colon, a signature header, a name given twice,
    a header the platform sets and an unknown key type: 422, one sentence for each, what was typed
    kept, no endpoint written."""
    _, key = await dash.account()
    await dash.sign_in(key)
    await dash.page("/dashboard/endpoints")
    typed = "X-Tenant acme\nwebhook-id: mine\nX-A: 1\nX-A: 2\nHost: example.com"
    response, html = await dash.post("/dashboard/endpoints", {
        "url": "https://example.com/hooks", "event_types": "", "rate_limit_per_second": "0", "headers": typed,
        "signing_key_type": "rsa"})
    assert response.status == 422
    errors = re.search(r'<div class="alert error" role="alert"><ul>(.*?)</ul></div>', html, re.S).group(1)
    lines = re.findall(r"<li>(.*?)</li>", errors)
    assert len(lines) == 6, lines
    assert any(line.startswith("Rate limit per second must be a whole number from 1 to 10,000") for line in lines)
    assert any("line 1" in line and "Name: value" in line for line in lines)
    assert any("webhook-id" in line and "signature" in line for line in lines)
    assert any("X-A" in line and "given twice" in line for line in lines)
    assert any(line.startswith("Signing key type must be hmac or ed25519") for line in lines)
    assert any("“Host”" in line and "set by the platform" in line for line in lines)
    assert await pool.fetchval("SELECT count(*) FROM endpoints") == 0
    assert 'value="0"' in html and "X-Tenant acme" in html, "what was typed is shown again"

    response, html = await dash.post("/dashboard/endpoints", {
        "url": "https://example.com/hooks", "event_types": "", "rate_limit_per_second": "fast",
        "headers": "Host: example.com\nX-Ok: fine"})
    assert response.status == 422 and await pool.fetchval("SELECT count(*) FROM endpoints") == 0
    assert "it was “fast”" in html and "host is set by the platform" in html


async def test_the_edit_form_changes_clears_and_refuses_the_rate_limit_and_headers(dash, pool):
    """An edit sets the limit and headers; a refused edit (every error listed) changes nothing,
    the description included; empty fields clear both; a form without the fields leaves them."""
    _, key = await dash.account()
    endpoint = await dash.endpoint(key)
    endpoint_id = uuid.UUID(endpoint["id"])
    await dash.sign_in(key)
    path = f"/dashboard/endpoints/{endpoint_id}"
    await dash.page(path)
    response, _ = await dash.post(path, {"description": "main", "event_types": "", "rate_limit_per_second": "25",
                                         "headers": "X-Tenant: acme"})
    assert response.status == 303
    row = await _endpoint_row(pool, endpoint_id)
    assert (row["rate_limit_per_second"], json.loads(row["headers"]), row["description"]) == (25, {"X-Tenant": "acme"},
                                                                                               "main")
    await dash.page(path)
    response, html = await dash.post(path, {"description": "other", "event_types": "bad type!",
                                            "rate_limit_per_second": "10001", "headers": "Content-Length: 5"})
    assert response.status == 422
    lines = re.findall(r"<li>(.*?)</li>", re.search(r'role="alert"><ul>(.*?)</ul>', html, re.S).group(1))
    assert len(lines) == 3 and any(line.startswith("Event type") for line in lines), lines
    assert any("Rate limit" in line for line in lines) and any("content-length" in line for line in lines)
    assert tuple(await _endpoint_row(pool, endpoint_id)) == tuple(row), "a refused edit changes nothing"
    assert 'value="10001"' in html and ">Content-Length: 5</textarea>" in html

    await dash.page(path)
    response, _ = await dash.post(path, {"description": "main", "event_types": ""})
    assert response.status == 303 and tuple(await _endpoint_row(pool, endpoint_id)) == tuple(row)
    await dash.page(path)
    response, _ = await dash.post(path, {"description": "main", "event_types": "", "rate_limit_per_second": "",
                                         "headers": " \n"})
    assert response.status == 303
    cleared = await _endpoint_row(pool, endpoint_id)
    assert (cleared["rate_limit_per_second"], cleared["headers"]) == (None, None)
    assert re.search(r'id="rate-limit">none<', await dash.page(path))


async def test_rotating_from_the_form_may_change_the_signing_key_type(dash, pool):
    """HMAC to Ed25519 from the rotate page: the new whpk_ is shown, the row is Ed25519 and keeps
    the old secret signing for the overlap; an unknown kind is refused (422) and rotates nothing."""
    _, key = await dash.account()
    endpoint = await dash.endpoint(key)
    endpoint_id = uuid.UUID(endpoint["id"])
    await dash.sign_in(key)
    html = await dash.page(f"/dashboard/endpoints/{endpoint_id}/secret/rotate")
    assert '<option value="hmac" selected>' in html and '<option value="ed25519">' in html
    before = await _endpoint_row(pool, endpoint_id)
    response, html = await dash.post(f"/dashboard/endpoints/{endpoint_id}/secret/rotate", {"signing_key_type": "dsa"})
    assert response.status == 422 and "Signing key type must be hmac or ed25519" in html
    assert tuple(await _endpoint_row(pool, endpoint_id)) == tuple(before)
    response, html = await dash.post(f"/dashboard/endpoints/{endpoint_id}/secret/rotate",
                                     {"signing_key_type": "ed25519"})
    assert response.status == 200 and "New public key" in html and "whsk_" not in html
    shown = re.search(r'id="secret">(whpk_[^<]+)<', html).group(1)
    after = await _endpoint_row(pool, endpoint_id)
    assert after["signing_key_type"] == "ed25519" and after["previous_secret"] == before["secret"]
    async with dash.http.get(f"/v1/endpoints/{endpoint_id}/secret", headers={"Authorization": f"Bearer {key}"}) as api:
        assert await api.json() == {"secret": shown, "signing_key_type": "ed25519"}
    assert '<option value="ed25519" selected>' in await dash.page(f"/dashboard/endpoints/{endpoint_id}/secret/rotate")


async def test_a_delivery_page_shows_the_headers_each_attempt_was_sent_with(dash, pool):
    """Two attempts recorded with different headers (the endpoint's changed between them), and the
    endpoint's headers changed again since: each attempt's row shows its own; an attempt without
    any shows a dash."""
    account_id, key = await dash.account()
    endpoint = await dash.endpoint(key, headers={"X-Tenant": "now"})
    created = await create_message(pool, MessageRequest(account_id, "invoice.paid", b"{}"), attempts_max=3)
    delivery_id = created.deliveries[0].id
    for attempt, sent in ((1, '{"X-Tenant": "first"}'), (2, '{"X-Tenant": "second", "X-Trace": "t"}'), (3, None)):
        await pool.execute("INSERT INTO delivery_attempts (delivery_id, attempt, account_id, started_at, status_code,"
                           " sent_headers) VALUES ($1, $2, $3, now(), 500, $4::jsonb)", delivery_id, attempt,
                           account_id, sent)
    await dash.sign_in(key)
    html = await dash.page(f"/dashboard/deliveries/{delivery_id}")
    cells = re.findall(r'<td class="sent-headers">(.*?)</td>', html, re.S)
    assert cells == ["<code>X-Tenant: first</code>", "<code>X-Tenant: second</code><br><code>X-Trace: t</code>", "—"]
    assert "<code>X-Tenant: now</code>" in html, "the endpoint's headers now, apart"
    assert endpoint["headers"] == {"X-Tenant": "now"}
