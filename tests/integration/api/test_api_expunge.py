"""POST /v1/messages/{id}/expunge and the account's payload_retention_days through the API: 404 for bad
and other accounts' ids, 409 while a delivery is live, the same answer twice; the delivery then says
when its payload was erased and a replay is refused."""

from __future__ import annotations

import uuid


async def test_expunge_through_the_api(api):
    """Bad ids and another account's message answer 404; a pending delivery 409 with Retry-After; once it
    finished, 200, twice the same; GET /v1/deliveries/{id} says payload_erased_at; a replay is 409."""
    _, headers = await api.account(balance=100)
    _, other = await api.account(balance=100)
    await api.endpoint(headers)
    sent = await (await api.send(headers)).json()
    message_id, delivery_id = sent["id"], sent["deliveries"][0]["id"]
    for path, who in ((f"/v1/messages/{uuid.uuid4()}/expunge", headers), ("/v1/messages/nope/expunge", headers),
                      (f"/v1/messages/{message_id}/expunge", other)):
        response = await api.client.post(path, headers=who)
        assert response.status == 404, await response.text()
    live = await api.client.post(f"/v1/messages/{message_id}/expunge", headers=headers)
    assert live.status == 409 and "Retry-After" in live.headers
    assert (await live.json())["type"].endswith("message-live")
    await api.pool.execute("UPDATE deliveries SET state = 'delivered', attempt = 1, finished_at = now() WHERE id = $1",
                           uuid.UUID(delivery_id))
    first = await api.client.post(f"/v1/messages/{message_id}/expunge", headers=headers)
    second = await api.client.post(f"/v1/messages/{message_id}/expunge", headers=headers)
    assert first.status == second.status == 200
    body = await first.json()
    assert body == await second.json() and body["payload_erased_by"].startswith("api_key:")
    detail = await (await api.client.get(f"/v1/deliveries/{delivery_id}", headers=headers)).json()
    assert detail["payload_erased_at"] == body["payload_erased_at"]
    replay = await api.client.post(f"/v1/deliveries/{delivery_id}/replay", headers=headers)
    assert replay.status == 409 and "erased on " in (await replay.json())["detail"]


async def test_payload_retention_days_set_by_the_operator(api):
    """Default 30; set on create and by PATCH (operator only), 1 to 3,650; out of range 422."""
    response = await api.client.post("/v1/accounts", json={"name": "r", "payload_retention_days": 7},
                                     headers=api.operator)
    account = (await response.json())["account"]
    assert response.status == 201 and account["payload_retention_days"] == 7
    account_id, headers = await api.account()
    assert (await (await api.client.get(f"/v1/accounts/{account_id}", headers=api.operator)).json())[
        "payload_retention_days"] == 30
    for days, status in ((0, 422), (3651, 422), (3650, 200), (1, 200)):
        response = await api.client.patch(f"/v1/accounts/{account_id}", json={"payload_retention_days": days},
                                          headers=api.operator)
        assert response.status == status, await response.text()
    assert (await api.client.patch(f"/v1/accounts/{account_id}", json={"payload_retention_days": 5},
                                   headers=headers)).status == 403
    assert (await api.client.patch(f"/v1/accounts/{uuid.uuid4()}", json={"payload_retention_days": 5},
                                   headers=api.operator)).status == 404
    assert (await (await api.client.get(f"/v1/accounts/{account_id}", headers=api.operator)).json())[
        "payload_retention_days"] == 1
