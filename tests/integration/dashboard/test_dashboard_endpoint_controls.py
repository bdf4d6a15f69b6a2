"""The dashboard shows a delivery's webhook-id (a replay's is the replayed delivery's) and the
endpoint's custom headers; an endpoint's page its signing kind; and rotating an Ed25519 endpoint
there keeps it Ed25519 and shows the new whpk_ public key, never a whsk_."""

from __future__ import annotations

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
    await settle(pool, dead, DeadReason.OUT_OF_RETRIES, attempt=0)
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
