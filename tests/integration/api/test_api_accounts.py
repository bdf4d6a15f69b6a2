"""Operator account routes, top-ups and reversals, and an account's balance, ledger and API keys."""

from __future__ import annotations

import uuid

import pytest

from billing.audit import audit


async def test_create_and_read_an_account_with_its_first_key(api):
    """POST /v1/accounts answers the account and a key shown once (stored only as a hash); GET reads it back."""
    response = await api.client.post("/v1/accounts", json={"name": "acme", "price_per_delivery": 3}, headers=api.operator)
    assert response.status == 201
    body = await response.json()
    key = body["api_key"]["key"]
    assert key.startswith("hl_live_") and key.startswith(body["api_key"]["prefix"])
    assert body["account"] == {"id": body["account"]["id"], "name": "acme", "status": "active", "balance": 0,
                               "price_per_delivery": 3, "payload_retention_days": 30, "low_balance_threshold": None,
                               "portal_frame_ancestors": []}
    stored = await api.pool.fetchrow("SELECT key_hash, prefix FROM api_keys WHERE id = $1", uuid.UUID(body["api_key"]["id"]))
    assert key.encode() not in bytes(stored["key_hash"]) and stored["prefix"] == body["api_key"]["prefix"]
    read = await api.client.get(f"/v1/accounts/{body['account']['id']}", headers=api.operator)
    assert read.status == 200 and (await read.json()) == body["account"]
    assert (await api.client.get("/v1/balance", headers=api.bearer(key))).status == 200


async def test_price_defaults_from_configuration(api):
    """Without price_per_delivery the ledger setting's default applies."""
    response = await api.client.post("/v1/accounts", json={"name": "acme"}, headers=api.operator)
    assert (await response.json())["account"]["price_per_delivery"] == api.settings.ledger.price_per_delivery_default


@pytest.mark.parametrize(
    "body, field",
    [
        ({"name": "acme", "price_per_delivery": -1}, "price_per_delivery"),
        ({"name": "", "price_per_delivery": 1}, "name"),
        ({"name": "a\u0000b"}, "name"),
        ({"name": "acme", "extra": 1}, "extra"),
        ({"price_per_delivery": 1}, "name"),
        ({"name": 5}, "name"),
    ],
)
async def test_invalid_account_bodies_answer_422_and_write_nothing(api, body, field):
    """Each malformed body answers problem+json 422 naming the field; no row is written."""
    before = await api.counts()
    response = await api.client.post("/v1/accounts", json=body, headers=api.operator)
    assert response.status == 422 and response.content_type == "application/problem+json"
    problem = await response.json()
    assert [error["field"] for error in problem["errors"]] == [field]
    assert await api.counts() == before


async def test_malformed_json_is_400_and_unknown_or_malformed_ids_are_404(api):
    """Unparsable JSON is 400; a malformed path id and an unknown one are both 404, never 500."""
    response = await api.client.post("/v1/accounts", data=b"{nope",
                                     headers={**api.operator, "Content-Type": "application/json"})
    assert response.status == 400 and (await response.json())["status"] == 400
    for account_id in ("not-a-uuid", str(uuid.uuid4()), "x" * 500):
        assert (await api.client.get(f"/v1/accounts/{account_id}", headers=api.operator)).status == 404


async def test_topups_are_idempotent_by_order_and_conflict_on_another_amount(api):
    """Same order twice: 201 then 200 with applied=false, one ledger entry; another amount: 409; unknown account: 404."""
    account_id, headers = await api.account()
    path = f"/v1/accounts/{account_id}/topups"
    first = await api.client.post(path, json={"order_id": "o-1", "amount": 50}, headers=api.operator)
    again = await api.client.post(path, json={"order_id": "o-1", "amount": 50}, headers=api.operator)
    assert (first.status, again.status) == (201, 200)
    assert (await again.json())["applied"] is False and (await again.json())["balance"] == 50
    before = await api.counts()
    conflict = await api.client.post(path, json={"order_id": "o-1", "amount": 60}, headers=api.operator)
    assert conflict.status == 409
    missing = await api.client.post(f"/v1/accounts/{uuid.uuid4()}/topups", json={"order_id": "o-2", "amount": 1},
                                    headers=api.operator)
    assert missing.status == 404
    invalid = await api.client.post(path, json={"order_id": "o 3", "amount": 0}, headers=api.operator)
    assert invalid.status == 422 and {e["field"] for e in (await invalid.json())["errors"]} <= {"order_id", "amount"}
    assert await api.counts() == before
    balance = await (await api.client.get("/v1/balance", headers=headers)).json()
    assert balance == {"balance": 50, "in_flight": 0}


async def test_reversal_takes_back_a_topup_once(api):
    """A reversal answers 201 then 200 (applied=false); an unknown order is 404; a balance too low is 402."""
    account_id, headers = await api.account(balance=0)
    await api.client.post(f"/v1/accounts/{account_id}/topups", json={"order_id": "o-r", "amount": 20}, headers=api.operator)
    path = f"/v1/accounts/{account_id}/topups/o-r/reversal"
    first, again = [await api.client.post(path, headers=api.operator) for _ in range(2)]
    assert (first.status, again.status) == (201, 200)
    assert (await first.json())["amount"] == -20 and (await first.json())["balance"] == 0
    assert (await api.client.post(f"/v1/accounts/{account_id}/topups/nope/reversal", headers=api.operator)).status == 404
    other_id, _ = await api.account()
    assert (await api.client.post(f"/v1/accounts/{other_id}/topups/o-r/reversal", headers=api.operator)).status == 404
    await api.client.post(f"/v1/accounts/{account_id}/topups", json={"order_id": "o-s", "amount": 5}, headers=api.operator)
    endpoint = await api.endpoint(headers)
    assert endpoint and (await api.send(headers)).status == 202
    assert (await api.client.post(f"/v1/accounts/{account_id}/topups/o-s/reversal", headers=api.operator)).status == 402
    assert (await audit(api.pool)).clean


async def test_ledger_pages_by_seq_and_filters_by_delivery(api):
    """GET /v1/ledger lists the account's own entries oldest first, page by page, and filters by delivery_id."""
    account_id, headers = await api.account(balance=100)
    other_id, other_headers = await api.account(balance=100)
    await api.endpoint(headers)
    sent = [await (await api.send(headers)).json() for _ in range(4)]
    seen, cursor = [], None
    while True:
        query = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = await (await api.client.get("/v1/ledger", params=query, headers=headers)).json()
        seen += page["data"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [entry["kind"] for entry in seen] == ["topup"] + ["charge"] * 4
    assert [entry["seq"] for entry in seen] == sorted(entry["seq"] for entry in seen)
    delivery_id = sent[2]["deliveries"][0]["id"]
    only = await (await api.client.get("/v1/ledger", params={"delivery_id": delivery_id}, headers=headers)).json()
    assert [entry["id"] for entry in only["data"]] == [f"charge:{delivery_id}"]
    foreign = await (await api.client.get("/v1/ledger", params={"delivery_id": delivery_id}, headers=other_headers)).json()
    assert foreign["data"] == []
    for bad in ({"limit": "0"}, {"limit": "101"}, {"cursor": "abc"}, {"delivery_id": "x"}):
        response = await api.client.get("/v1/ledger", params=bad, headers=headers)
        assert response.status == 422 and (await response.json())["errors"][0]["field"] in bad


async def test_api_keys_create_list_revoke_and_stay_within_the_account(api):
    """Keys list with prefixes only; another account's key id is 404 on revoke; a revoke is idempotent."""
    _, headers = await api.account()
    _, other_headers = await api.account()
    created = await api.client.post("/v1/api-keys", headers=headers)
    assert created.status == 201
    key = await created.json()
    listed = await (await api.client.get("/v1/api-keys", headers=headers)).json()
    assert len(listed["data"]) == 2 and all("key" not in item for item in listed["data"])
    assert key["id"] in {item["id"] for item in listed["data"]}
    before = await api.snapshot()
    assert (await api.client.delete(f"/v1/api-keys/{key['id']}", headers=other_headers)).status == 404
    assert (await api.client.delete("/v1/api-keys/nope", headers=headers)).status == 404
    assert (await api.client.post("/v1/api-keys", json={"name": "x"}, headers=headers)).status == 422
    assert await api.snapshot() == before
    assert (await api.client.delete(f"/v1/api-keys/{key['id']}", headers=headers)).status == 204
    assert (await api.client.delete(f"/v1/api-keys/{key['id']}", headers=headers)).status == 204
    listed = await (await api.client.get("/v1/api-keys", headers=headers)).json()
    assert [item["revoked_at"] is not None for item in listed["data"] if item["id"] == key["id"]] == [True]


async def test_the_key_list_shows_every_live_key_after_many_revoked_ones(api):
    """The list answers at most 100 keys without a next page; an account that rotated its key more
    than 100 times still sees (and can revoke) the keys that work, not only the oldest revoked ones."""
    _, headers = await api.account()
    (first,) = (await (await api.client.get("/v1/api-keys", headers=headers)).json())["data"]
    current = first
    for _ in range(100):  # rotate: make a new key, revoke the one before it
        made = await api.client.post("/v1/api-keys", headers=headers)
        assert made.status == 201
        assert (await api.client.delete(f"/v1/api-keys/{current['id']}", headers=headers)).status == 204
        current = await made.json()
        headers = api.bearer(current["key"])
    listed = (await (await api.client.get("/v1/api-keys", headers=headers)).json())["data"]
    assert [k["id"] for k in listed if k["revoked_at"] is None] == [current["id"]]
