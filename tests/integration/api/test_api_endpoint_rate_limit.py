"""An endpoint's rate_limit_per_second through the API: set on create, shown on every read,
changed and cleared by PATCH, left alone by a PATCH that does not name it; every bad value is a
422 problem naming the field, on create and on PATCH, and writes nothing."""

from __future__ import annotations

import pytest


async def test_rate_limit_is_kept_shown_patched_and_cleared(api):
    """Created with 50; read and listed with 50; PATCH to 10,000, to 1, to null; untouched by another PATCH."""
    _, headers = await api.account()
    plain = await api.endpoint(headers)
    assert plain["rate_limit_per_second"] is None
    created = await api.endpoint(headers, rate_limit_per_second=50)
    assert created["rate_limit_per_second"] == 50
    path = f"/v1/endpoints/{created['id']}"
    assert (await (await api.client.get(path, headers=headers)).json())["rate_limit_per_second"] == 50
    listed = (await (await api.client.get("/v1/endpoints", headers=headers)).json())["data"]
    assert {item["id"]: item["rate_limit_per_second"] for item in listed} == {plain["id"]: None, created["id"]: 50}
    for value in (10_000, 1, 1.0, None, 7):
        response = await api.client.patch(path, json={"rate_limit_per_second": value}, headers=headers)
        assert response.status == 200, await response.text()
        assert (await response.json())["rate_limit_per_second"] == value
    untouched = await api.client.patch(path, json={"description": "only this"}, headers=headers)
    assert (await untouched.json())["rate_limit_per_second"] == 7
    stored = await api.pool.fetchval("SELECT rate_limit_per_second FROM endpoints WHERE id = $1::uuid", created["id"])
    assert stored == 7


@pytest.mark.parametrize("value", [0, -1, 10_001, 2**31, 1.5, "50", True, [50], {"per_second": 50}])
async def test_bad_rate_limits_are_422_naming_the_field_and_write_nothing(api, value):
    """Out of 1..10,000, not a whole number, or not a number: 422 problem+json naming
    rate_limit_per_second, on create and on PATCH, with every row as it was."""
    _, headers = await api.account()
    endpoint = await api.endpoint(headers, rate_limit_per_second=20)
    before = await api.snapshot()
    created = await api.client.post("/v1/endpoints", json={"url": "https://example.com/h", "rate_limit_per_second": value},
                                    headers=headers)
    patched = await api.client.patch(f"/v1/endpoints/{endpoint['id']}", json={"rate_limit_per_second": value},
                                     headers=headers)
    for response in (created, patched):
        assert response.status == 422, await response.text()
        assert response.content_type == "application/problem+json"
        problem = await response.json()
        assert [error["field"] for error in problem["errors"]] == ["rate_limit_per_second"], problem
        assert problem["errors"][0]["message"], problem
    assert await api.snapshot() == before
