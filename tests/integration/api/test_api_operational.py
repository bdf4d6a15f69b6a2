"""Operational endpoint, event and account routes: the whole life of an operational endpoint, the
checks a bad body gets (422 naming the field, nothing written), paging events by cursor and type,
the low balance threshold, and isolation: another account's id answers 404 on every route."""

from __future__ import annotations

import uuid

from billing import accounts as billing_accounts
from signing import generate_secret


async def _operational_endpoint(api, headers, **fields) -> dict:
    fields.setdefault("url", "https://ops.example.com/hook")
    response = await api.client.post("/v1/operational-endpoints", json=fields, headers=headers)
    assert response.status == 201, await response.text()
    return await response.json()


async def _rows(api) -> int:
    return await api.pool.fetchval("SELECT count(*) FROM operational_endpoints")


async def test_create_list_read_patch_read_secret_and_delete(api):
    """As the owner sees it; the secret is sealed at rest and answered as made or given."""
    _, headers = await api.account()
    given = generate_secret()
    created = await _operational_endpoint(api, headers, description="pager", event_types=["balance.low"], secret=given)
    endpoint = created["endpoint"]
    assert (endpoint["url"], endpoint["event_types"], endpoint["enabled"], created["secret"]) == (
        "https://ops.example.com/hook", ["balance.low"], True, given)
    sealed = await api.pool.fetchval("SELECT secret FROM operational_endpoints WHERE id = $1", uuid.UUID(endpoint["id"]))
    assert given.encode() not in bytes(sealed)
    path = f"/v1/operational-endpoints/{endpoint['id']}"
    assert await (await api.client.get(path, headers=headers)).json() == endpoint
    assert await (await api.client.get(path + "/secret", headers=headers)).json() == {"secret": given}
    listed = await (await api.client.get("/v1/operational-endpoints", headers=headers)).json()
    assert [item["id"] for item in listed["data"]] == [endpoint["id"]]
    patched = await api.client.patch(path, json={"event_types": None, "enabled": False}, headers=headers)
    assert patched.status == 200
    assert ((body := await patched.json())["event_types"], body["enabled"], body["description"]) == (None, False, "pager")
    made = await _operational_endpoint(api, headers)
    assert made["secret"].startswith("whsec_") and made["secret"] != given
    assert (await api.client.delete(path, headers=headers)).status == 204
    assert (await api.client.get(path, headers=headers)).status == 404
    assert (await api.client.delete(path, headers=headers)).status == 404


async def test_bad_bodies_answer_422_naming_the_field_and_write_nothing(api):
    _, headers = await api.account()
    bad = [
        ({"url": "ftp://ops.example.com/x"}, "url"),
        ({"url": "https://ops.example.com/x", "event_types": ["invoice.paid"]}, "event_types"),
        ({"url": "https://ops.example.com/x", "event_types": ["balance.low", "balance.low"]}, "event_types"),
        ({"url": "https://ops.example.com/x", "event_types": []}, "event_types"),
        ({"url": "https://ops.example.com/x", "secret": "whsec_short"}, "secret"),
        ({"url": "https://ops.example.com/x", "colour": "red"}, "colour"),
    ]
    for body, field in bad:
        response = await api.client.post("/v1/operational-endpoints", json=body, headers=headers)
        assert response.status == 422, (body, await response.text())
        problem = await response.json()
        assert response.content_type == "application/problem+json"
        assert field in [error["field"] for error in problem["errors"]], (body, problem)
    assert await _rows(api) == 0
    response = await api.client.patch("/v1/account", json={"low_balance_threshold": 0}, headers=headers)
    assert response.status == 422 and (await response.json())["errors"][0]["field"] == "low_balance_threshold"
    response = await api.client.get("/v1/operational-events?type=nope", headers=headers)
    assert response.status == 422 and (await response.json())["errors"][0]["field"] == "type"


async def test_another_account_gets_404_on_every_route(api):
    """Account B names account A's operational endpoint and event: 404 everywhere, and nothing changes."""
    account_a, headers_a = await api.account()
    _, headers_b = await api.account()
    endpoint = (await _operational_endpoint(api, headers_a))["endpoint"]
    await billing_accounts.top_up(api.pool, account_a, "order-a", 10)  # writes topup.applied for A
    page = await (await api.client.get("/v1/operational-events", headers=headers_a)).json()
    (event,) = page["data"]
    assert event["type"] == "topup.applied" and event["data"]["amount"] == 10
    path = f"/v1/operational-endpoints/{endpoint['id']}"
    for method, url, body in (("get", path, None), ("patch", path, {"enabled": False}), ("delete", path, None),
                              ("get", path + "/secret", None), ("get", f"/v1/operational-events/{event['id']}", None)):
        response = await api.client.request(method, url, json=body, headers=headers_b)
        assert response.status == 404, (method, url)
    assert (await (await api.client.get("/v1/operational-events", headers=headers_b)).json())["data"] == []
    assert (await (await api.client.get("/v1/operational-endpoints", headers=headers_b)).json())["data"] == []
    assert await (await api.client.get(path, headers=headers_a)).json() == endpoint
    assert (await api.client.get(f"/v1/operational-events/{event['id']}", headers=headers_a)).status == 200


async def test_events_page_by_cursor_and_filter_by_type(api):
    account_id, headers = await api.account()
    for number in range(5):
        await billing_accounts.top_up(api.pool, account_id, f"order-{number}", 10)
    await billing_accounts.reverse_top_up(api.pool, account_id, "order-0")
    seen, cursor = [], None
    while True:
        query = "?limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = await (await api.client.get("/v1/operational-events" + query, headers=headers)).json()
        seen += page["data"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [event["type"] for event in seen] == ["topup.applied"] * 5 + ["topup.reversed"]
    assert [event["seq"] for event in seen] == sorted(event["seq"] for event in seen)
    reversed_ = await (await api.client.get("/v1/operational-events?type=topup.reversed", headers=headers)).json()
    assert [event["data"]["order_id"] for event in reversed_["data"]] == ["order-0"]


async def test_the_low_balance_threshold_is_read_and_set_by_the_account(api):
    account_id, headers = await api.account(balance=10, price=1)
    own = await (await api.client.get("/v1/account", headers=headers)).json()
    assert (own["id"], own["balance"], own["low_balance_threshold"]) == (str(account_id), 10, None)
    response = await api.client.patch("/v1/account", json={"low_balance_threshold": 9}, headers=headers)
    assert response.status == 200 and (await response.json())["low_balance_threshold"] == 9
    await api.endpoint(headers)
    assert (await api.send(headers)).status == 202  # 10 -> 9: not below
    assert (await api.send(headers)).status == 202  # 9 -> 8: below
    events = await (await api.client.get("/v1/operational-events?type=balance.low", headers=headers)).json()
    assert [event["data"] for event in events["data"]] == [{"balance": 8, "threshold": 9}]
    response = await api.client.patch("/v1/account", json={"low_balance_threshold": None}, headers=headers)
    assert (await response.json())["low_balance_threshold"] is None


async def test_a_create_repeated_with_its_idempotency_key_makes_one_endpoint(api):
    """The same key and body: the stored answer (the same endpoint and secret), replayed; one row."""
    _, headers = await api.account()
    keyed = {**headers, "Idempotency-Key": "ops-1"}
    body = {"url": "https://ops.example.com/once"}
    first = await api.client.post("/v1/operational-endpoints", json=body, headers=keyed)
    again = await api.client.post("/v1/operational-endpoints", json=body, headers=keyed)
    assert (first.status, again.status) == (201, 201) and again.headers["Idempotent-Replayed"] == "true"
    assert await first.json() == await again.json()
    assert await _rows(api) == 1
