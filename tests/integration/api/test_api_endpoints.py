"""Endpoint routes: create with SSRF checks and sealed secrets, list, read, patch, delete (refunds
pending deliveries), rotate and read secrets, the per-account bound, and isolation between accounts."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer

from billing import closeout
from billing.audit import audit
from delivery.platform.web_app import create_app
from signing import generate_secret, parse_keyring
from signing.at_rest import decrypt_secret



async def test_create_list_read_patch_and_delete(api):
    """The whole life of an endpoint through the API, as the owner sees it."""
    _, headers = await api.account()
    created = await api.endpoint(headers, url="https://example.com/a", description="main", event_types=["a.b"],
                                 timeout_ms=5000)
    assert (created["url"], created["description"], created["event_types"], created["timeout_ms"], created["enabled"]) == (
        "https://example.com/a", "main", ["a.b"], 5000, True)
    path = f"/v1/endpoints/{created['id']}"
    assert (await (await api.client.get(path, headers=headers)).json()) == created
    listed = await (await api.client.get("/v1/endpoints", headers=headers)).json()
    assert [item["id"] for item in listed["data"]] == [created["id"]]
    patched = await api.client.patch(path, json={"event_types": None, "enabled": False, "url": "https://example.org/b"},
                                     headers=headers)
    assert patched.status == 200
    body = await patched.json()
    assert (body["event_types"], body["enabled"], body["url"], body["description"]) == (None, False, "https://example.org/b", "main")
    deleted = await api.client.delete(path, headers=headers)
    assert deleted.status == 200 and (await deleted.json())["deleted"] is True
    assert (await api.client.get(path, headers=headers)).status == 404
    # A repeat (a retry whose first answer was lost) reads as done; another account still sees 404.
    again = await api.client.delete(path, headers=headers)
    assert again.status == 200 and (await again.json()) == {**(await deleted.json()), "refunded_now": 0}
    _, other_headers = await api.account()
    assert (await api.client.delete(path, headers=other_headers)).status == 404
    assert (await api.client.delete(f"/v1/endpoints/{uuid.uuid4()}", headers=headers)).status == 404
    assert (await (await api.client.get("/v1/endpoints", headers=headers)).json())["data"] == []


async def test_secrets_are_sealed_at_rest_readable_by_the_owner_and_rotate_with_overlap(api):
    """A supplied secret is stored encrypted (bound to the endpoint id), read back by its owner only;
    rotation moves it to previous_secret for 24 hours."""
    _, headers = await api.account()
    _, other_headers = await api.account()
    secret = generate_secret()
    created = await api.endpoint(headers, secret=secret)
    endpoint_id = uuid.UUID(created["id"])
    row = await api.pool.fetchrow("SELECT secret FROM endpoints WHERE id = $1", endpoint_id)
    assert secret.encode() not in bytes(row["secret"])
    keyring = parse_keyring(api.settings.secret_keyring)
    assert decrypt_secret(bytes(row["secret"]), keyring, context=b"endpoint:" + str(endpoint_id).encode()) == secret
    path = f"/v1/endpoints/{endpoint_id}/secret"
    assert (await (await api.client.get(path, headers=headers)).json()) == {"secret": secret,
                                                                          "signing_key_type": "hmac"}
    assert (await api.client.get(path, headers=other_headers)).status == 404
    rotated = await api.client.post(f"/v1/endpoints/{endpoint_id}/secret/rotate", headers=headers)
    new_secret = (await rotated.json())["secret"]
    assert rotated.status == 200 and new_secret.startswith("whsec_") and new_secret != secret
    assert (await (await api.client.get(path, headers=headers)).json()) == {"secret": new_secret,
                                                                          "signing_key_type": "hmac"}
    row = await api.pool.fetchrow(
        "SELECT previous_secret, extract(epoch FROM previous_secret_expires_at - now()) AS left FROM endpoints WHERE id = $1",
        endpoint_id,
    )
    assert decrypt_secret(bytes(row["previous_secret"]), keyring, context=b"endpoint:" + str(endpoint_id).encode()) == secret
    assert 86_000 < row["left"] <= 86_400
    chosen = generate_secret()
    rotated = await api.client.post(f"/v1/endpoints/{endpoint_id}/secret/rotate", json={"secret": chosen}, headers=headers)
    assert (await rotated.json()) == {"secret": chosen, "signing_key_type": "hmac"}


async def test_a_retried_rotation_to_a_chosen_secret_changes_nothing(api):
    """The client lost the answer and rotates again to the secret it chose: the original secret must
    keep signing through its overlap, not be dropped by a second rotation. Concurrent retries too."""
    _, headers = await api.account()
    original, chosen = generate_secret(), generate_secret()
    endpoint_id = uuid.UUID((await api.endpoint(headers, secret=original))["id"])
    keyring = parse_keyring(api.settings.secret_keyring)
    context = b"endpoint:" + str(endpoint_id).encode()
    path = f"/v1/endpoints/{endpoint_id}/secret/rotate"
    responses = await asyncio.gather(*(api.client.post(path, json={"secret": chosen}, headers=headers) for _ in range(5)))
    assert [response.status for response in responses] == [200] * 5
    row = await api.pool.fetchrow("SELECT secret, previous_secret, previous_secret_expires_at FROM endpoints WHERE id = $1",
                                  endpoint_id)
    assert decrypt_secret(bytes(row["secret"]), keyring, context=context) == chosen
    assert decrypt_secret(bytes(row["previous_secret"]), keyring, context=context) == original
    again = await api.client.post(path, json={"secret": chosen}, headers=headers)
    assert again.status == 200 and (await again.json()) == {"secret": chosen, "signing_key_type": "hmac"}
    after = await api.pool.fetchrow("SELECT previous_secret, previous_secret_expires_at FROM endpoints WHERE id = $1",
                                    endpoint_id)
    assert after["previous_secret_expires_at"] == row["previous_secret_expires_at"]  # the overlap did not restart
    assert decrypt_secret(bytes(after["previous_secret"]), keyring, context=context) == original


@pytest.mark.parametrize(
    "body, field",
    [
        ({"url": "ftp://example.com/x"}, "url"),
        ({"url": "http://10.0.0.1/x"}, "url"),
        ({"url": "http://169.254.169.254/latest"}, "url"),
        ({"url": "http://0x7f.1/x"}, "url"),
        ({"url": "https://example.com", "timeout_ms": 999}, "timeout_ms"),
        ({"url": "https://example.com", "timeout_ms": 60001}, "timeout_ms"),
        ({"url": "https://example.com", "event_types": []}, "event_types"),
        ({"url": "https://example.com", "event_types": ["a", "a"]}, "event_types"),
        ({"url": "https://example.com", "event_types": ["bad type"]}, "event_types[0]"),
        ({"url": "https://example.com", "secret": "whsec_AAAA"}, "secret"),
        ({"url": "https://example.com", "secret": "nope"}, "secret"),
        ({"url": "https://example.com", "colour": "red"}, "colour"),
        ({}, "url"),
    ],
)
async def test_invalid_endpoints_answer_422_naming_the_field_and_write_nothing(api, body, field):
    """URLs the SSRF policy refuses, out-of-range fields, bad secrets and unknown fields: 422, nothing written."""
    _, headers = await api.account()
    before = await api.snapshot()
    response = await api.client.post("/v1/endpoints", json=body, headers=headers)
    assert response.status == 422, await response.text()
    assert [error["field"] for error in (await response.json())["errors"]] == [field]
    assert await api.snapshot() == before


async def test_loopback_is_allowed_only_in_dev_mode(api, pool, queue):
    """Dev mode (the fixture's) accepts http://127.0.0.1; a production app refuses it, and accepts an allowlisted network."""
    _, headers = await api.account()
    assert (await api.client.post("/v1/endpoints", json={"url": "http://127.0.0.1:9/x"}, headers=headers)).status == 201
    production = dataclasses.replace(api.settings.api, dev_mode=False, allowed_networks=("10.1.0.0/16",))
    app = create_app(dataclasses.replace(api.settings, api=production), pool, queue)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        refused = await client.post("/v1/endpoints", json={"url": "http://127.0.0.1:9/x"}, headers=headers)
        assert refused.status == 422
        allowed = await client.post("/v1/endpoints", json={"url": "http://10.1.2.3/x"}, headers=headers)
        assert allowed.status == 201


async def test_another_accounts_endpoint_answers_404_everywhere(api):
    """Reading, patching, deleting, rotating another account's endpoint: 404, exactly like a missing one; nothing changes."""
    _, owner = await api.account()
    _, intruder = await api.account()
    endpoint = await api.endpoint(owner)
    before = await api.snapshot()
    for endpoint_id in (endpoint["id"], str(uuid.uuid4()), "not-an-id"):
        base = f"/v1/endpoints/{endpoint_id}"
        for method, path, body in (("GET", base, None), ("PATCH", base, {"enabled": False}), ("DELETE", base, None),
                                   ("POST", base + "/secret/rotate", None), ("GET", base + "/secret", None)):
            response = await api.client.request(method, path, json=body, headers=intruder)
            assert response.status == 404, (method, path)
            assert (await response.json())["detail"] == "no such endpoint"
    assert await api.snapshot() == before


async def test_patch_validation_and_unknown_fields(api):
    """PATCH refuses unknown fields, a refused URL, and wrong types with 422, changing nothing."""
    _, headers = await api.account()
    endpoint = await api.endpoint(headers)
    before = await api.snapshot()
    for body, field in (({"secret": "x"}, "secret"), ({"url": "http://192.168.1.1"}, "url"), ({"enabled": "yes"}, "enabled"),
                        ({"timeout_ms": 0}, "timeout_ms")):
        response = await api.client.patch(f"/v1/endpoints/{endpoint['id']}", json=body, headers=headers)
        assert response.status == 422 and (await response.json())["errors"][0]["field"] == field
    assert await api.snapshot() == before


async def test_an_account_has_at_most_100_endpoints(api):
    """The 101st endpoint is 409 and not written; deleting one makes room again."""
    _, headers = await api.account()
    created = [await api.endpoint(headers) for _ in range(100)]
    before = await api.counts()
    response = await api.client.post("/v1/endpoints", json={"url": "https://example.com"}, headers=headers)
    assert response.status == 409
    assert await api.counts() == before
    await api.client.delete(f"/v1/endpoints/{created[0]['id']}", headers=headers)
    assert (await api.client.post("/v1/endpoints", json={"url": "https://example.com"}, headers=headers)).status == 201


async def test_deleting_an_endpoint_refunds_its_pending_deliveries(api):
    """Soft delete settles the endpoint's pending deliveries with endpoint_deleted: each refunded once, audit clean."""
    account_id, headers = await api.account(balance=10, price=2)
    endpoint = await api.endpoint(headers)
    for _ in range(3):
        assert (await api.send(headers)).status == 202
    assert (await (await api.client.get("/v1/balance", headers=headers)).json()) == {"balance": 4, "in_flight": 6}
    deleted = await (await api.client.delete(f"/v1/endpoints/{endpoint['id']}", headers=headers)).json()
    assert deleted["refunded_now"] == 3
    assert (await (await api.client.get("/v1/balance", headers=headers)).json()) == {"balance": 10, "in_flight": 0}
    reasons = await api.pool.fetch("SELECT state, dead_reason FROM deliveries WHERE account_id = $1", account_id)
    assert {tuple(row) for row in reasons} == {("dead", "endpoint_deleted")}
    assert (await audit(api.pool)).clean


async def _wait_blocked_on(pool, pattern: str) -> None:
    for _ in range(250):
        if await pool.fetchval("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                               " AND query LIKE $1", pattern):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"nothing waited on a lock in {pattern!r}")


@pytest.mark.parametrize("route", ["rotate", "rotate-keyed", "create", "create-keyed"])
async def test_a_create_or_rotation_waiting_on_the_closeout_is_refused(api, database_url, route):
    """An account being deleted takes no new endpoint or secret: one that waited on the closeout's
    account lock (its keys still authenticate until the closeout commits) would have given the
    deleted account a live secret again, and a stored answer the closeout had erased (found in
    review). Under the account lock the status is read; not active: 409 account-not-active."""
    account_id, headers = await api.account()
    endpoint = await api.endpoint(headers, url="https://example.com/a")
    await closeout.begin_closing(api.pool, account_id)
    sent = {**headers, **({"Idempotency-Key": "k-race"} if route.endswith("keyed") else {})}
    held = await asyncpg.connect(database_url)
    try:
        async with held.transaction():  # the deletion's closeout, held just before its COMMIT
            await closeout.close_out(held, account_id)
            if route.startswith("rotate"):
                path, body = f"/v1/endpoints/{endpoint['id']}/secret/rotate", None
            else:
                path, body = "/v1/endpoints", {"url": "https://example.com/b"}
            answer = asyncio.ensure_future(api.client.post(path, json=body, headers=sent))
            await _wait_blocked_on(api.pool, "%FROM accounts WHERE id = $1 FOR%")
    finally:
        await held.close()
    response = await answer
    assert response.status == 409 and (await response.json())["type"].endswith("/account-not-active")
    assert await api.pool.fetchval("SELECT count(*) FROM endpoints WHERE account_id = $1 AND secret IS NOT NULL",
                                   account_id) == 0
    assert await api.pool.fetchval("SELECT count(*) FROM idempotent_responses WHERE principal = $1",
                                   str(account_id)) == 0


async def test_a_closing_account_takes_no_new_endpoint_or_secret(api):
    account_id, headers = await api.account()
    endpoint = await api.endpoint(headers)
    await closeout.begin_closing(api.pool, account_id)
    for path, body in (("/v1/endpoints", {"url": "https://example.com/c"}),
                       (f"/v1/endpoints/{endpoint['id']}/secret/rotate", None)):
        response = await api.client.post(path, json=body, headers=headers)
        assert response.status == 409, (path, await response.text())
