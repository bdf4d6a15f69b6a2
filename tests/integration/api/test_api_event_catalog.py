"""The event catalog, wildcard subscriptions and channels: schemas checked when written and applied
to every payload (422 naming the failing path, nothing written), archived types refused, "invoice.*"
matching a family of types, channels filtering deliveries; on the direct write and the planned one."""

from __future__ import annotations

import uuid

import pytest

from billing import messages

_SCHEMA = {"type": "object", "required": ["amount"],
           "properties": {"amount": {"type": "integer", "minimum": 0},
                          "items": {"type": "array", "items": {"type": "object", "required": ["sku"]}}}}


async def _post(api, path: str, headers: dict, body: dict, status: int = 201) -> dict:
    response = await api.client.post(path, json=body, headers=headers)
    assert response.status == status, await response.text()
    return await response.json()


async def _send(api, headers: dict, event_type: str, payload, **extra):
    return await api.client.post("/v1/messages", json={"event_type": event_type, "payload": payload, **extra},
                                 headers=headers)


async def test_event_types_are_created_listed_read_and_changed(api):
    """The catalog's life; another account sees none of it."""
    _, headers = await api.account()
    _, other = await api.account()
    created = await _post(api, "/v1/event-types", headers, {"name": "invoice.paid", "description": "Paid",
                                                            "schema": _SCHEMA})
    assert (created["name"], created["schema"], created["archived"]) == ("invoice.paid", _SCHEMA, False)
    await _post(api, "/v1/event-types", headers, {"name": "user.created"})
    again = await api.client.post("/v1/event-types", json={"name": "invoice.paid"}, headers=headers)
    assert again.status == 409 and (await again.json())["type"].endswith("/event-type-exists")
    read = await (await api.client.get("/v1/event-types/invoice.paid", headers=headers)).json()
    assert read == created
    archived = await api.client.patch("/v1/event-types/user.created", json={"archived": True}, headers=headers)
    assert (await archived.json())["archived"] is True
    listed = await (await api.client.get("/v1/event-types", headers=headers)).json()
    assert [item["name"] for item in listed["data"]] == ["invoice.paid"]
    listed = await (await api.client.get("/v1/event-types?include_archived=true&limit=1", headers=headers)).json()
    assert [item["name"] for item in listed["data"]] == ["invoice.paid"] and listed["next_cursor"] == created["id"]
    cleared = await api.client.patch("/v1/event-types/invoice.paid", json={"schema": None}, headers=headers)
    assert (await cleared.json())["schema"] is None
    assert (await api.client.get("/v1/event-types/invoice.paid", headers=other)).status == 404
    assert (await api.client.patch("/v1/event-types/invoice.paid", json={"archived": True}, headers=other)).status == 404
    assert (await (await api.client.get("/v1/event-types", headers=other)).json())["data"] == []


BAD_SCHEMAS = {
    "an unknown type": ({"type": "nonsense"}, "schema.type"),
    "a nested bad keyword": ({"properties": {"amount": {"minimum": "zero"}}}, "schema.properties.amount.minimum"),
    "a remote reference": ({"$ref": "https://example.com/schema.json"}, "schema.$ref"),
    "not a schema at all": ([1, 2], "schema"),
    "too large": ({"description": "x" * 70_000}, "schema"),
}


@pytest.mark.parametrize("case", BAD_SCHEMAS, ids=list(BAD_SCHEMAS))
async def test_a_bad_schema_is_422_naming_its_path_and_writes_nothing(api, case):
    schema, field = BAD_SCHEMAS[case]
    _, headers = await api.account()
    await _post(api, "/v1/event-types", headers, {"name": "kept", "schema": {"type": "object"}})
    before = [tuple(row) for row in await api.pool.fetch("SELECT * FROM event_types ORDER BY id")]
    for method, path, body in (("post", "/v1/event-types", {"name": "invoice.paid", "schema": schema}),
                               ("patch", "/v1/event-types/kept", {"schema": schema})):
        response = await api.client.request(method, path, json=body, headers=headers)
        assert response.status == 422, (case, method, await response.text())
        assert field in [error["field"] for error in (await response.json())["errors"]], await response.text()
    assert [tuple(row) for row in await api.pool.fetch("SELECT * FROM event_types ORDER BY id")] == before


async def test_payloads_are_checked_against_their_types_schema(api):
    """A payload that fails the schema is 422 naming each failing path, and nothing is written or
    charged; one that passes is sent; a type without a schema, or not in the catalog, takes any payload;
    an archived type takes no new messages. Both routes apply it."""
    account_id, headers = await api.account(balance=100)
    await api.endpoint(headers)
    await _post(api, "/v1/event-types", headers, {"name": "invoice.paid", "schema": _SCHEMA})
    await _post(api, "/v1/event-types", headers, {"name": "old.type", "archived": True})
    before = await api.snapshot()
    cases = (
        ({"amount": "ten"}, ["payload.amount"]),
        ({"amount": -1, "items": [{"sku": "a"}, {}]}, ["payload.amount", "payload.items[1]"]),
        ({}, ["payload"]),
        ([1], ["payload"]),
    )
    for payload, fields in cases:
        for path in ("/v1/messages", f"/v1/applications/{account_id}/messages"):
            response = await api.client.post(path, json={"event_type": "invoice.paid", "payload": payload},
                                             headers=headers)
            assert response.status == 422, (payload, await response.text())
            assert [error["field"] for error in (await response.json())["errors"]] == fields
    archived = await _send(api, headers, "old.type", {})
    assert archived.status == 422 and [e["field"] for e in (await archived.json())["errors"]] == ["event_type"]
    assert await api.snapshot() == before
    assert (await _send(api, headers, "invoice.paid", {"amount": 3, "items": [{"sku": "a"}]})).status == 202
    assert (await _send(api, headers, "not.in.catalog", "anything")).status == 202
    # A schema changed through this process applies at once.
    await api.client.patch("/v1/event-types/invoice.paid", json={"schema": {"type": "string"}}, headers=headers)
    assert (await _send(api, headers, "invoice.paid", {"amount": 3})).status == 422
    assert (await _send(api, headers, "invoice.paid", "paid")).status == 202


async def test_wildcard_subscriptions_and_channels_filter_the_fan_out(api):
    """invoice.* takes every invoice.<...> type and nothing else; an endpoint with channels takes
    only messages with one of them; the planned write (in a caller's transaction) decides the same."""
    account_id, headers = await api.account(balance=1000)
    invoices = await api.endpoint(headers, url="https://example.com/invoices", event_types=["invoice.*", "user.created"])
    eu = await api.endpoint(headers, url="https://example.com/eu", channels=["eu", "global"])
    everything = await api.endpoint(headers, url="https://example.com/all")
    assert invoices["event_types"] == ["invoice.*", "user.created"] and eu["channels"] == ["eu", "global"]
    expected = {
        ("invoice.paid", None): {invoices["id"], everything["id"]},
        ("invoice.refund.issued", None): {invoices["id"], everything["id"]},
        ("invoicex", None): {everything["id"]},
        ("user.created", None): {invoices["id"], everything["id"]},
        ("user.deleted", ("us",)): {everything["id"]},
        ("user.deleted", ("us", "eu")): {eu["id"], everything["id"]},
        ("invoice.paid", ("global",)): {invoices["id"], eu["id"], everything["id"]},
    }
    for (event_type, channels), endpoints in expected.items():
        extra = {"channels": list(channels)} if channels else {}
        response = await _send(api, headers, event_type, {}, **extra)
        assert response.status == 202, await response.text()
        made = {d["endpoint_id"] for d in (await response.json())["deliveries"]}
        assert made == endpoints, (event_type, channels)
    async with api.pool.acquire() as connection, connection.transaction():
        requests = [messages.MessageRequest(account_id, event_type, b"{}", channels=channels)
                    for event_type, channels in expected]
        results = await messages.create_messages(connection, requests, attempts_max=3)
    for result, endpoints in zip(results, expected.values(), strict=True):
        assert {str(d.endpoint_id) for d in result.deliveries} == endpoints
    stored = await api.pool.fetchval("SELECT channels FROM messages WHERE account_id = $1 AND channels IS NOT NULL"
                                     " ORDER BY id LIMIT 1", account_id)
    assert stored == ["us"]


BAD_INPUT = {
    "a star without a dot": ("endpoint", {"url": "https://example.com/h", "event_types": ["invoice*"]}, "event_types[0]"),
    "a bare star": ("endpoint", {"url": "https://example.com/h", "event_types": ["*"]}, "event_types[0]"),
    "a star inside": ("endpoint", {"url": "https://example.com/h", "event_types": ["a.*.b"]}, "event_types[0]"),
    "an endpoint channel twice": ("endpoint", {"url": "https://example.com/h", "channels": ["a", "a"]}, "channels"),
    "an endpoint channel with a comma": ("endpoint", {"url": "https://example.com/h", "channels": ["a,b"]}, "channels[0]"),
    "no endpoint channels": ("endpoint", {"url": "https://example.com/h", "channels": []}, "channels"),
    "eleven message channels": ("message", {"event_type": "a", "payload": {}, "channels": [f"c{n}" for n in range(11)]},
                                "channels"),
    "a message channel twice": ("message", {"event_type": "a", "payload": {}, "channels": ["x", "x"]}, "channels"),
    "a message channel too long": ("message", {"event_type": "a", "payload": {}, "channels": ["c" * 129]}, "channels[0]"),
    "a message channel not a string": ("message", {"event_type": "a", "payload": {}, "channels": [1]}, "channels[0]"),
}


@pytest.mark.parametrize("case", BAD_INPUT, ids=list(BAD_INPUT))
async def test_bad_subscriptions_and_channels_are_422_and_write_nothing(api, case):
    kind, body, field = BAD_INPUT[case]
    _, headers = await api.account(balance=10)
    await api.endpoint(headers)
    before = await api.snapshot()
    response = await api.client.post("/v1/endpoints" if kind == "endpoint" else "/v1/messages", json=body,
                                     headers=headers)
    assert response.status == 422, await response.text()
    assert field in [error["field"] for error in (await response.json())["errors"]], await response.text()
    assert await api.snapshot() == before
