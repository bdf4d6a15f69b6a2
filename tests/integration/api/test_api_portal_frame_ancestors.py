"""portal_frame_ancestors through PATCH /v1/account and the operator's PATCH /v1/accounts/{id}: at
most 10 https origins (scheme://host[:port], no path), stored lower case; a bad list answers 422
naming the item and changes nothing; [] and null clear it."""

from __future__ import annotations

import pytest

ORIGINS = ["https://app.example.com", "https://Portal.Example.org:8443"]


async def _stored(api, account_id) -> list[str]:
    return await api.pool.fetchval("SELECT portal_frame_ancestors FROM accounts WHERE id = $1", account_id)


async def test_an_account_and_the_operator_set_and_clear_the_origins(api):
    account_id, headers = await api.account()
    other_id, _ = await api.account()
    assert (await (await api.client.get("/v1/account", headers=headers)).json())["portal_frame_ancestors"] == []
    response = await api.client.patch("/v1/account", json={"portal_frame_ancestors": ORIGINS}, headers=headers)
    assert response.status == 200
    expected = ["https://app.example.com", "https://portal.example.org:8443"]
    assert (await response.json())["portal_frame_ancestors"] == expected and await _stored(api, account_id) == expected
    response = await api.client.patch("/v1/account", json={"payload_retention_days": 9}, headers=headers)
    assert (await response.json())["portal_frame_ancestors"] == expected  # untouched when not given
    assert await _stored(api, other_id) == []
    response = await api.client.patch(f"/v1/accounts/{account_id}", json={"portal_frame_ancestors": None},
                                      headers=api.operator)
    assert response.status == 200 and await _stored(api, account_id) == []
    response = await api.client.patch(f"/v1/accounts/{account_id}",
                                      json={"portal_frame_ancestors": [f"https://a{n}.example.com" for n in range(10)]},
                                      headers=api.operator)
    assert response.status == 200 and len(await _stored(api, account_id)) == 10
    response = await api.client.patch("/v1/account", json={"portal_frame_ancestors": []}, headers=headers)
    assert response.status == 200 and await _stored(api, account_id) == []


@pytest.mark.parametrize(
    ("origins", "field"),
    [
        (["http://app.example.com"], "portal_frame_ancestors[0]"),
        (["https://app.example.com", "https://app.example.com/portal"], "portal_frame_ancestors[1]"),
        (["https://app.example.com/"], "portal_frame_ancestors[0]"),
        (["https://app.example.com?x=1"], "portal_frame_ancestors[0]"),
        (["https://*.example.com"], "portal_frame_ancestors[0]"),
        (["https://app.example.com:70000"], "portal_frame_ancestors[0]"),
        (["https://app.example.com 'unsafe-inline'"], "portal_frame_ancestors[0]"),
        (["https://app.example.com; script-src *"], "portal_frame_ancestors[0]"),
        (["'self'"], "portal_frame_ancestors[0]"),
        (["https://a.example.com", "https://A.example.com"], "portal_frame_ancestors[1]"),
        ([f"https://a{n}.example.com" for n in range(11)], "portal_frame_ancestors"),
        ("https://app.example.com", "portal_frame_ancestors"),
    ],
)
async def test_a_bad_origin_list_answers_422_naming_the_item_and_changes_nothing(api, origins, field):
    account_id, headers = await api.account()
    await api.client.patch("/v1/account", json={"portal_frame_ancestors": ["https://kept.example.com"]}, headers=headers)
    for path, auth in (("/v1/account", headers), (f"/v1/accounts/{account_id}", api.operator)):
        response = await api.client.patch(path, json={"portal_frame_ancestors": origins}, headers=auth)
        assert response.status == 422 and response.content_type == "application/problem+json"
        assert [error["field"] for error in (await response.json())["errors"]] == [field]
    assert await _stored(api, account_id) == ["https://kept.example.com"]
