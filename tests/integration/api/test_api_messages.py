"""POST /v1/messages: accepted and charged, exact payload bytes, idempotency keys (Stripe semantics),
402 and 413 writing nothing, validation, and wake-ups after commit that never fail a request."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid

import pytest
from aiohttp.test_utils import TestClient, TestServer

from billing.audit import audit
from delivery.engine import queue as job_queue
from delivery.platform.web_app import create_app

JSON = {"Content-Type": "application/json"}  # what aiohttp's client does not send for data=


async def test_a_message_fans_out_charges_and_stores_the_exact_payload(api, pool, queue):
    """202 lists one delivery per subscribed endpoint; the stored payload is the request's JSON value byte for byte;
    after the commit the real Redis queue is woken with exactly the new delivery ids.

    (The wake is observed by recording what the real queue was asked, not by reading Redis: other test suites on the
    same Redis server flush it at any time.)
    """
    woken: list[list[tuple[uuid.UUID, uuid.UUID]]] = []

    class RecordingQueue(job_queue.Queue):
        async def wake(self, delivery_ids):
            delivery_ids = list(delivery_ids)
            await super().wake(delivery_ids)
            woken.append(delivery_ids)

    async with TestClient(TestServer(create_app(api.settings, pool, RecordingQueue(queue.redis)), host="127.0.0.1")) as client:
        account_id, headers = await api.account(balance=10, price=2)
        first = await api.endpoint(headers)
        second = await api.endpoint(headers, event_types=["invoice.paid"])
        await api.endpoint(headers, event_types=["user.created"])
        body = b'{"event_type": "invoice.paid", "payload": {"b": [1, 2.50, "\\u00e9"],  "a": null}}'
        response = await client.post("/v1/messages", data=body, headers={**headers, **JSON})
        assert response.status == 202 and "Idempotent-Replayed" not in response.headers
        accepted = await response.json()
        assert {d["endpoint_id"] for d in accepted["deliveries"]} == {first["id"], second["id"]}
        assert accepted["total_charged"] == 4 and accepted["event_type"] == "invoice.paid"
        payload = await pool.fetchval("SELECT payload FROM messages WHERE id = $1", uuid.UUID(accepted["id"]))
        assert bytes(payload) == b'{"b": [1, 2.50, "\\u00e9"],  "a": null}'
        assert (await (await client.get("/v1/balance", headers=headers)).json()) == {"balance": 6, "in_flight": 4}
        for _ in range(2000):  # the wake-up follows the commit, off the request's path: a loaded machine may take seconds
            if woken:
                break
            await asyncio.sleep(0.01)
        # Each delivery is woken with its account: (account_id, delivery_id), as the claims take them.
        assert [sorted(keys) for keys in woken] == [sorted((account_id, uuid.UUID(d["id"])) for d in accepted["deliveries"])]


@pytest.mark.parametrize("payload", ["null", "3", '"text"', "[]", "true"])
async def test_any_json_value_is_a_payload(api, payload):
    """The payload may be any JSON value, stored as written."""
    _, headers = await api.account(balance=1)
    await api.endpoint(headers)
    response = await api.client.post("/v1/messages", data=f'{{"event_type":"t","payload":{payload}}}',
                                     headers={**headers, **JSON})
    assert response.status == 202
    stored = await api.pool.fetchval("SELECT payload FROM messages WHERE id = $1", uuid.UUID((await response.json())["id"]))
    assert bytes(stored) == payload.encode()


async def test_twenty_concurrent_identical_requests_with_one_key_charge_once(api):
    """20 identical POSTs with one Idempotency-Key at once: one message, one charge; the others are replays (202 with
    Idempotent-Replayed) or 409 while the first is in flight, never a second charge."""
    account_id, headers = await api.account(balance=100)
    await api.endpoint(headers)
    responses = await asyncio.gather(*(api.send(headers, key="same-key") for _ in range(20)))
    statuses = [response.status for response in responses]
    assert set(statuses) <= {202, 409}, statuses
    bodies = [await response.json() for response in responses if response.status == 202]
    assert len({body["id"] for body in bodies}) == 1
    assert sum(1 for r in responses if r.status == 202 and "Idempotent-Replayed" not in r.headers) == 1
    assert await api.pool.fetchval("SELECT count(*) FROM messages WHERE account_id = $1", account_id) == 1
    assert await api.pool.fetchval("SELECT count(*) FROM ledger_entries WHERE kind = 'charge' AND account_id = $1", account_id) == 1
    for response in responses:
        if response.status == 409:
            assert response.headers["Retry-After"] and (await response.json())["status"] == 409
    again = await api.send(headers, key="same-key")
    assert again.status == 202 and again.headers["Idempotent-Replayed"] == "true"
    assert (await again.json()) == bodies[0]


async def test_same_key_with_another_body_is_422_and_writes_nothing(api):
    """A key reused with a different payload or event type answers 422."""
    _, headers = await api.account(balance=100)
    await api.endpoint(headers)
    assert (await api.send(headers, payload={"n": 1}, key="k")).status == 202
    before = await api.snapshot()
    for kwargs in ({"payload": {"n": 2}}, {"event_type": "other.type"}):
        response = await api.send(headers, key="k", **kwargs)
        assert response.status == 422 and "idempotency" in (await response.json())["type"]
    assert await api.snapshot() == before


async def test_keys_belong_to_their_account(api):
    """The same key on two accounts makes two messages."""
    _, first = await api.account(balance=5)
    _, second = await api.account(balance=5)
    for headers in (first, second):
        await api.endpoint(headers)
    one, two = await api.send(first, key="k"), await api.send(second, key="k")
    assert (one.status, two.status) == (202, 202)
    assert (await one.json())["id"] != (await two.json())["id"]


async def test_insufficient_balance_is_402_and_writes_nothing(api):
    """A message the balance cannot cover for every endpoint answers 402; no message, delivery or ledger row appears."""
    _, headers = await api.account(balance=2)
    for _ in range(3):
        await api.endpoint(headers)
    before = await api.snapshot()
    response = await api.send(headers)
    assert response.status == 402 and (await response.json())["type"].endswith("insufficient-balance")
    assert await api.snapshot() == before


async def test_oversized_payloads_are_413_and_write_nothing(api, pool, queue):
    """A payload over the limit answers 413, whether the declared length or the parsed payload tells."""
    settings = dataclasses.replace(api.settings, api=dataclasses.replace(api.settings.api, payload_bytes_max=1000))
    async with TestClient(TestServer(create_app(settings, pool, queue), host="127.0.0.1")) as client:
        _, headers = await api.account(balance=100)
        await api.endpoint(headers)
        before = await api.snapshot()
        just_over = json.dumps({"event_type": "t", "payload": "x" * 999})  # 1001 bytes with the quotes
        response = await client.post("/v1/messages", data=just_over, headers={**headers, **JSON})
        assert response.status == 413 and (await response.json())["status"] == 413
        huge = json.dumps({"event_type": "t", "payload": "x" * 100_000})
        assert (await client.post("/v1/messages", data=huge, headers={**headers, **JSON})).status == 413

        async def chunks():
            yield huge.encode()

        assert (await client.post("/v1/messages", data=chunks(), headers={**headers, **JSON})).status == 413
        assert await api.snapshot() == before
        at_limit = json.dumps({"event_type": "t", "payload": "x" * 998})
        assert (await client.post("/v1/messages", data=at_limit, headers={**headers, **JSON})).status == 202


@pytest.mark.parametrize(
    "body, status, field",
    [
        (b'{"event_type": "t"}', 422, "payload"),
        (b'{"payload": 1}', 422, "event_type"),
        (b'{"event_type": "", "payload": 1}', 422, "event_type"),
        (b'{"event_type": "has space", "payload": 1}', 422, "event_type"),
        (b'{"event_type": "t", "payload": 1, "extra": 2}', 422, "extra"),
        (b'{"event_type": "t", "payload": 1', 400, None),
        (b'[]', 422, "$"),
        (b'', 400, None),
    ],
)
async def test_invalid_messages_write_nothing(api, body, status, field):
    """Malformed JSON is 400; wrong shapes are 422 with the field named; nothing is written either way."""
    _, headers = await api.account(balance=10)
    await api.endpoint(headers)
    before = await api.snapshot()
    response = await api.client.post("/v1/messages", data=body, headers={**headers, **JSON})
    assert response.status == status, await response.text()
    problem = await response.json()
    if field is not None:
        assert [error["field"] for error in problem["errors"]] == [field]
    assert await api.snapshot() == before


async def test_a_bad_idempotency_key_is_422(api):
    """An Idempotency-Key longer than 255 characters answers 422 naming the header."""
    _, headers = await api.account(balance=10)
    response = await api.send(headers, key="k" * 256)
    assert response.status == 422 and (await response.json())["errors"][0]["field"] == "Idempotency-Key"


async def test_redis_down_does_not_fail_a_committed_create(api, pool):
    """When waking workers fails (Redis unreachable), the committed create still answers 202; the sweeper finds it.

    The queue here is a stand-in whose wake raises ConnectionError, as the Redis client does when Redis is down;
    the database is real.
    """

    class Unreachable:
        async def wake(self, delivery_ids):
            raise ConnectionError("redis is down")

    async with TestClient(TestServer(create_app(api.settings, pool, Unreachable()), host="127.0.0.1")) as client:
        _, headers = await api.account(balance=5)
        await api.endpoint(headers)
        response = await client.post("/v1/messages", json={"event_type": "t", "payload": 1}, headers=headers)
        assert response.status == 202
    assert await pool.fetchval("SELECT count(*) FROM deliveries WHERE state = 'pending'") == 1
    assert (await audit(pool)).clean
