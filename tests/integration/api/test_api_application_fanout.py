"""A message to one application never reaches another application's endpoints: many applications,
fan-out, concurrent sends coalesced into shared batches (direct and planned writes alike), and the
database's own check against a delivery that crosses applications."""

from __future__ import annotations

import asyncio
import random
import uuid

import asyncpg
import pytest

from billing import ids
from billing import messages as billing_messages
from billing.settle import DeadReason, settle

APPLICATIONS = 40
SENDS = 400
EVENT_TYPES = ("invoice.paid", "invoice.failed", "user.created")


async def _world(api) -> tuple[dict, dict]:
    """An account with APPLICATIONS applications of 1 to 3 endpoints each (some filtered by event
    type, one disabled here and there), and endpoints in the default application too."""
    _, headers = await api.account(balance=100_000)
    applications = []
    for number in range(APPLICATIONS):
        response = await api.client.post("/v1/applications", json={"name": f"customer {number}", "uid": f"c{number}"},
                                         headers=headers)
        assert response.status == 201
        applications.append((await response.json())["id"])
        for index in range(1 + number % 3):
            fields = {"url": f"https://example.com/{number}/{index}"}
            if index == 1:
                fields["event_types"] = [EVENT_TYPES[number % 3]]
            if index == 2 and number % 5 == 0:
                fields["enabled"] = False
            response = await api.client.post(f"/v1/applications/{applications[-1]}/endpoints", json=fields,
                                             headers=headers)
            assert response.status == 201
    for _ in range(2):
        await api.endpoint(headers)
    return headers, {"applications": applications}


async def _check_every_message(pool: asyncpg.Pool) -> int:
    """Each message's deliveries are exactly its application's live, enabled, subscribed endpoints; none crosses."""
    crossing = await pool.fetchval(
        "SELECT count(*) FROM deliveries d JOIN messages m ON m.id = d.message_id JOIN endpoints e ON e.id = d.endpoint_id"
        " WHERE e.application_id <> m.application_id")
    assert crossing == 0
    rows = await pool.fetch(
        "SELECT m.id, coalesce(array_agg(d.endpoint_id ORDER BY d.endpoint_id) FILTER (WHERE d.id IS NOT NULL), '{}')"
        "   AS made,"
        " (SELECT coalesce(array_agg(e.id ORDER BY e.id), '{}') FROM endpoints e WHERE e.application_id = m.application_id"
        "   AND e.enabled AND e.deleted_at IS NULL AND (e.event_types IS NULL OR m.event_type = ANY (e.event_types)))"
        "   AS subscribed"
        " FROM messages m LEFT JOIN deliveries d ON d.message_id = m.id GROUP BY m.account_id, m.id")
    for row in rows:
        assert row["made"] == row["subscribed"], row["id"]
    return len(rows)


@pytest.mark.parametrize("run", range(3))
async def test_concurrent_sends_to_many_applications_reach_only_their_own_endpoints(api, run):
    """SENDS messages at once to random applications (by id and by uid) and to the default one; the
    group commit carries them in shared batches. Every seventh reuses one of three idempotency keys
    with another body: once a key is written, the direct write declines a batch holding it, and the
    batch goes the planned way. Every message made exactly its own application's deliveries, on
    both ways."""
    headers, world = await _world(api)
    writes_before = dict(billing_messages.WRITES)
    chooser = random.Random(run)
    sends = []
    for number in range(SENDS):
        index = chooser.randrange(-1, APPLICATIONS)
        path = "/v1/messages" if index < 0 else (
            f"/v1/applications/{world['applications'][index] if number % 2 else f'c{index}'}/messages")
        key = {"Idempotency-Key": f"key-{number % 3}"} if number % 7 == 0 else {}
        body = {"event_type": chooser.choice(EVENT_TYPES), "payload": {"n": number}}
        sends.append(api.client.post(path, json=body, headers={**headers, **key}))
    answers = await asyncio.gather(*sends)
    statuses = [answer.status for answer in answers]
    # A key reused with another body is 422, one still in flight 409; every other send is accepted.
    assert set(statuses) <= {202, 409, 422} and statuses.count(202) >= SENDS - SENDS // 7, statuses
    assert await _check_every_message(api.pool) == statuses.count(202)
    writes = {way: billing_messages.WRITES[way] - writes_before.get(way, 0) for way in billing_messages.WRITES}
    assert writes.get("direct", 0) > 0 and writes.get("unlocked", 0) + writes.get("fell_back", 0) > 0, writes


async def test_the_database_refuses_a_delivery_whose_endpoint_is_in_another_application(api):
    """BYPASSES THE APP: a raw delivery from a message of application A to an endpoint of
    application B of the same account fails the reference check, and nothing is written."""
    account_id, headers = await api.account(balance=10)
    endpoints = {}
    messages = {}
    for uid in ("a", "b"):
        assert (await api.client.post("/v1/applications", json={"name": uid, "uid": uid}, headers=headers)).status == 201
        response = await api.client.post(f"/v1/applications/{uid}/endpoints", json={"url": "https://example.com/h"},
                                         headers=headers)
        endpoints[uid] = uuid.UUID((await response.json())["id"])
        response = await api.client.post(f"/v1/applications/{uid}/messages", json={"event_type": "a", "payload": {}},
                                         headers=headers)
        messages[uid] = uuid.UUID((await response.json())["id"])
    before = await api.counts()
    with pytest.raises(asyncpg.ForeignKeyViolationError, match="one application"):
        await api.pool.execute(
            "INSERT INTO deliveries (id, account_id, message_id, endpoint_id, price, attempts_max)"
            " VALUES ($1, $2, $3, $4, 1, 3)", ids.new_id(), account_id, messages["a"], endpoints["b"])
    with pytest.raises(asyncpg.ForeignKeyViolationError, match="names no application"):
        _, other_headers = await api.account()
        other = await api.client.post("/v1/applications", json={"name": "x"}, headers=other_headers)
        await api.pool.execute(
            "INSERT INTO messages (id, account_id, event_type, payload, application_id) VALUES ($1, $2, 'a', '{}', $3)",
            ids.new_id(), account_id, uuid.UUID((await other.json())["id"]))
    with pytest.raises(asyncpg.RestrictViolationError):
        await api.pool.execute("UPDATE endpoints SET application_id = account_id WHERE id = $1", endpoints["b"])
    after = await api.counts()
    assert {**after, "accounts": 0, "api_keys": 0} == {**before, "accounts": 0, "api_keys": 0}


async def test_a_replay_of_an_applications_delivery_stays_in_that_application(api):
    """Replaying a dead delivery of an application's endpoint makes a message of that application
    (the database would refuse one that crossed), charged to the account, to the same endpoint."""
    account_id, headers = await api.account(balance=10)
    assert (await api.client.post("/v1/applications", json={"name": "a", "uid": "a"}, headers=headers)).status == 201
    endpoint = await (await api.client.post("/v1/applications/a/endpoints", json={"url": "https://example.com/h"},
                                            headers=headers)).json()
    sent = await (await api.client.post("/v1/applications/a/messages", json={"event_type": "a", "payload": {}},
                                        headers=headers)).json()
    (delivery,) = sent["deliveries"]
    await settle(api.pool, uuid.UUID(delivery["id"]), DeadReason.ENDPOINT_DISABLED, attempt=0)
    replayed = await api.client.post(f"/v1/deliveries/{delivery['id']}/replay", headers=headers)
    assert replayed.status == 202, await replayed.text()
    body = await replayed.json()
    assert [d["endpoint_id"] for d in body["deliveries"]] == [endpoint["id"]]
    application_id = await api.pool.fetchval("SELECT application_id FROM messages WHERE id = $1", uuid.UUID(body["id"]))
    assert str(application_id) == endpoint["application_id"] != str(account_id)
