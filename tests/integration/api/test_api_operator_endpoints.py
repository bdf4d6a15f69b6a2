"""POST /v1/operator/endpoints/{id}/disable: the operator switches any account's endpoint off with
disabled_reason 'operator' (endpoint.disabled, reason operator, with the refunds it causes); run
again it changes nothing and writes no second event; an unknown or malformed id answers 404, an
account's key 403; an endpoint already off keeps its own reason."""

from __future__ import annotations

import json
import uuid


async def _disabled_events(api, account_id) -> list[dict]:
    rows = await api.pool.fetch("SELECT data::text AS data FROM operational_events WHERE account_id = $1"
                                " AND type = 'endpoint.disabled' ORDER BY seq", account_id)
    return [json.loads(row["data"]) for row in rows]


async def test_the_operator_disables_an_endpoint_once(api):
    account_id, headers = await api.account(balance=10)
    endpoint = await api.endpoint(headers)
    for _ in range(3):
        assert (await api.send(headers)).status == 202
    path = f"/v1/operator/endpoints/{endpoint['id']}/disable"
    response = await api.client.post(path, headers=api.operator)
    assert response.status == 200, await response.text()
    body = await response.json()
    assert (body["id"], body["enabled"], body["disabled_reason"]) == (endpoint["id"], False, "operator")
    (event,) = await _disabled_events(api, account_id)
    assert (event["endpoint_id"], event["reason"], event["detail"]) == (endpoint["id"], "operator", "operator")
    assert event["refunds"] == {"deliveries": 3, "amount": 3}
    again = await api.client.post(path, headers=api.operator)
    assert again.status == 200 and await again.json() == body
    assert len(await _disabled_events(api, account_id)) == 1
    shown = await (await api.client.get(f"/v1/endpoints/{endpoint['id']}", headers=headers)).json()
    assert (shown["enabled"], shown["disabled_reason"]) == (False, "operator")


async def test_an_endpoint_already_off_keeps_its_reason(api):
    account_id, headers = await api.account()
    endpoint = await api.endpoint(headers)
    await api.pool.execute("UPDATE endpoints SET enabled = false, disabled_reason = 'receiver answered 410 Gone'"
                           " WHERE id = $1", uuid.UUID(endpoint["id"]))
    response = await api.client.post(f"/v1/operator/endpoints/{endpoint['id']}/disable", headers=api.operator)
    assert response.status == 200
    assert (await response.json())["disabled_reason"] == "receiver answered 410 Gone"
    assert [event["reason"] for event in await _disabled_events(api, account_id)] == ["gone"]


async def test_unknown_ids_answer_404_and_an_account_key_403(api):
    _, headers = await api.account()
    endpoint = await api.endpoint(headers)
    for bad in (str(uuid.uuid4()), "not-an-id"):
        response = await api.client.post(f"/v1/operator/endpoints/{bad}/disable", headers=api.operator)
        assert response.status == 404 and response.content_type == "application/problem+json"
    await api.pool.execute("UPDATE endpoints SET deleted_at = now() WHERE id = $1", uuid.UUID(endpoint["id"]))
    assert (await api.client.post(f"/v1/operator/endpoints/{endpoint['id']}/disable",
                                  headers=api.operator)).status == 404
    other = await api.endpoint(headers)
    response = await api.client.post(f"/v1/operator/endpoints/{other['id']}/disable", headers=headers)
    assert response.status == 403
    assert await api.pool.fetchval("SELECT enabled FROM endpoints WHERE id = $1", uuid.UUID(other["id"]))
