"""GET and PATCH /v1/account: an account reads itself and sets its own payload_retention_days (1 to
3,650); bad bodies answer 422 naming the field and change nothing; another account is untouched."""

from __future__ import annotations

import pytest


async def _retention(api, account_id) -> int:
    return await api.pool.fetchval("SELECT payload_retention_days FROM accounts WHERE id = $1", account_id)


async def test_an_account_reads_and_sets_its_own_retention(api):
    """GET answers the account as the operator's read does; PATCH sets the days at both ends of the range
    and only for the caller; the operator key, which is no account, is refused (403)."""
    account_id, headers = await api.account(balance=5)
    other_id, _ = await api.account()
    read = await api.client.get("/v1/account", headers=headers)
    assert read.status == 200
    body = await read.json()
    operator_read = await (await api.client.get(f"/v1/accounts/{account_id}", headers=api.operator)).json()
    assert body == operator_read and body["payload_retention_days"] == 30 and body["balance"] == 5
    for days in (1, 3650, 7):
        response = await api.client.patch("/v1/account", json={"payload_retention_days": days}, headers=headers)
        assert response.status == 200, await response.text()
        assert (await response.json())["payload_retention_days"] == days
        assert await _retention(api, account_id) == days
    assert (await (await api.client.get("/v1/account", headers=headers)).json())["payload_retention_days"] == 7
    assert await _retention(api, other_id) == 30
    for method in ("get", "patch"):
        response = await getattr(api.client, method)("/v1/account", json={"payload_retention_days": 2},
                                                     headers=api.operator)
        assert response.status in (401, 403), await response.text()
    assert (await api.client.get("/v1/account")).status == 401
    assert await _retention(api, account_id) == 7


@pytest.mark.parametrize(
    "body, field",
    [
        ({"payload_retention_days": 0}, "payload_retention_days"),
        ({"payload_retention_days": 3651}, "payload_retention_days"),
        ({"payload_retention_days": -5}, "payload_retention_days"),
        ({"payload_retention_days": "30"}, "payload_retention_days"),
        ({"payload_retention_days": 1.5}, "payload_retention_days"),
        ({"payload_retention_days": None}, "payload_retention_days"),
        ({"payload_retention_days": 5, "price_per_delivery": 0}, "price_per_delivery"),
    ],
)
async def test_bad_retention_bodies_answer_422_naming_the_field_and_change_nothing(api, body, field):
    """Out of range, wrong type, missing or an unknown field (an account may not set its price): 422
    problem+json naming the field; the account keeps 30 days and its price."""
    account_id, headers = await api.account()
    response = await api.client.patch("/v1/account", json=body, headers=headers)
    assert response.status == 422 and response.content_type == "application/problem+json"
    assert [error["field"] for error in (await response.json())["errors"]] == [field]
    row = await api.pool.fetchrow("SELECT payload_retention_days, price_per_delivery FROM accounts WHERE id = $1",
                                  account_id)
    assert tuple(row) == (30, 1)


async def test_an_empty_patch_changes_nothing_and_a_threshold_leaves_the_retention_as_it_was(api):
    """Each setting is changed only when given: {} answers the account unchanged, and setting the
    low balance threshold keeps the retention (and the reverse)."""
    account_id, headers = await api.account()
    response = await api.client.patch("/v1/account", json={}, headers=headers)
    assert response.status == 200
    assert ((await response.json())["payload_retention_days"], (await response.json())["low_balance_threshold"]) == (30, None)
    response = await api.client.patch("/v1/account", json={"payload_retention_days": 9}, headers=headers)
    response = await api.client.patch("/v1/account", json={"low_balance_threshold": 5}, headers=headers)
    body = await response.json()
    assert (body["payload_retention_days"], body["low_balance_threshold"]) == (9, 5)
    response = await api.client.patch("/v1/account", json={"payload_retention_days": 10}, headers=headers)
    assert (await response.json())["low_balance_threshold"] == 5
    operator = await api.client.patch(f"/v1/accounts/{account_id}", json={"low_balance_threshold": None},
                                      headers=api.operator)
    assert ((await operator.json())["payload_retention_days"], (await operator.json())["low_balance_threshold"]) == (10, None)


async def test_malformed_json_is_400_and_changes_nothing(api):
    account_id, headers = await api.account()
    response = await api.client.patch("/v1/account", data=b"{nope",
                                      headers={**headers, "Content-Type": "application/json"})
    assert response.status == 400 and response.content_type == "application/problem+json"
    assert await _retention(api, account_id) == 30
