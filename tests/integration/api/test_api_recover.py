"""Recover an endpoint's dead deliveries (GET/POST /v1/endpoints/{id}/recover), against the real app
and database: the plan writes nothing and says what POST then charges; POST replays each dead
delivery once as a new pending delivery charged once; a changed total is 409 and a total the
balance cannot cover is 402, both writing nothing; one call takes at most 200 and `more` says to
call again; an Idempotency-Key answers a retry with the first answer, also across a lost COMMIT;
and concurrent identical recovers replay each dead delivery exactly once.

Dead deliveries are made as the worker makes them: sent through the API (or create_messages, for
many), then killed through the one settle function, which writes each refund.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import datetime, timezone

import pytest
from aiohttp.test_utils import TestClient, TestServer

from billing.audit import audit
from billing.messages import MessageRequest, create_messages
from billing.settle import settle
from delivery.operations import dead_letters
from delivery.platform.web_app import create_app

SINCE = "2000-01-01T00:00:00Z"
CONCURRENT_CALLS = 8
CONCURRENT_ROUNDS = 20


@dataclasses.dataclass(frozen=True)
class Scene:
    """An account (id, auth headers) with two endpoints; `dead` died on `endpoint`, `elsewhere` on `other`."""

    account_id: uuid.UUID
    headers: dict
    endpoint: str
    other: str
    dead: list[str]
    elsewhere: list[str]


async def _kill(api, delivery_ids) -> None:
    """Kill deliveries through the one settle function, as the worker does after the last attempt."""
    for delivery_id in delivery_ids:
        owner = await api.pool.fetchval("SELECT account_id FROM deliveries WHERE id = $1", uuid.UUID(str(delivery_id)))
        await settle(api.pool, uuid.UUID(str(delivery_id)), "out_of_retries", account_id=owner)


async def _dead_on(api, headers: dict, endpoint: str, count: int) -> list[str]:
    """Send `count` messages and kill their deliveries to `endpoint`; the dead ids, oldest first."""
    dead = []
    for _ in range(count):
        response = await api.send(headers)
        assert response.status == 202, await response.text()
        dead += [d["id"] for d in (await response.json())["deliveries"] if d["endpoint_id"] == endpoint]
    await _kill(api, dead)
    return dead


async def _scene(api, *, balance: int = 100, price: int = 2, dead: int = 3) -> Scene:
    account_id, headers = await api.account(balance=balance, price=price)
    endpoint = (await api.endpoint(headers, url="https://example.com/down"))["id"]
    other = (await api.endpoint(headers, url="https://example.com/up"))["id"]
    killed = []
    for _ in range(dead):
        sent = await (await api.send(headers)).json()
        killed.append({d["endpoint_id"]: d["id"] for d in sent["deliveries"]})
    dead_ids = [by_endpoint[endpoint] for by_endpoint in killed]
    elsewhere = [killed[0][other]]
    await _kill(api, dead_ids + elsewhere)
    return Scene(account_id, headers, endpoint, other, dead_ids, elsewhere)


async def _plan(api, headers: dict, endpoint: str, **params) -> dict:
    response = await api.client.get(f"/v1/endpoints/{endpoint}/recover", params={"since": SINCE, **params},
                                    headers=headers)
    assert response.status == 200, await response.text()
    return await response.json()


async def _recover(api, headers: dict, endpoint: str, confirm_total: int, *, key: str | None = None, **fields):
    extra = {"Idempotency-Key": key} if key else {}
    return await api.client.post(f"/v1/endpoints/{endpoint}/recover",
                                 json={"since": SINCE, "confirm_total": confirm_total, **fields},
                                 headers={**headers, **extra})


async def _balance(api, headers: dict) -> int:
    return (await (await api.client.get("/v1/balance", headers=headers)).json())["balance"]


async def _problem(response, status: int, slug: str) -> dict:
    assert response.status == status, await response.text()
    assert response.content_type == "application/problem+json"
    problem = await response.json()
    assert problem["type"].endswith("/" + slug), problem
    return problem


async def _replays_of(api, dead_ids) -> dict[str, int]:
    """How many replay messages each dead delivery has (keyed replay:<id>)."""
    rows = await api.pool.fetch(
        "SELECT substr(idempotency_key, 8) AS old, count(*) AS n FROM messages"
        " WHERE idempotency_key = ANY($1::text[]) GROUP BY 1",
        [f"replay:{dead_id}" for dead_id in dead_ids])
    return {row["old"]: row["n"] for row in rows}


async def test_recover_replays_each_dead_delivery_as_a_new_pending_delivery_charged_once(api):
    """The plan lists the endpoint's dead deliveries (not the other endpoint's) and their total at the
    current price; POST replays exactly those as new pending deliveries to that endpoint, each with
    one charge of the price; the old ones stay dead with their refunds; the balance moves by the total;
    the audit is clean; the next plan is empty."""
    scene = await _scene(api)
    plan = await _plan(api, scene.headers, scene.endpoint)
    assert (plan["count"], plan["total_charge"], plan["more"], plan["endpoint_enabled"]) == (3, 6, False, True)
    assert plan["dead_delivery_ids"] == sorted(scene.dead) and plan["endpoint_id"] == scene.endpoint
    balance = await _balance(api, scene.headers)
    response = await _recover(api, scene.headers, scene.endpoint, plan["total_charge"])
    assert response.status == 202, await response.text()
    assert "Idempotent-Replayed" not in response.headers
    body = await response.json()
    assert (body["replayed_count"], body["already_replayed_count"], body["refused_count"]) == (3, 0, 0)
    assert (body["total_charged"], body["more"]) == (6, False)
    pairs = {entry["dead_delivery_id"]: entry["delivery_id"] for entry in body["replayed"]}
    assert sorted(pairs) == plan["dead_delivery_ids"] and len(set(pairs.values())) == 3
    for old, new in pairs.items():
        fresh = await (await api.client.get(f"/v1/deliveries/{new}", headers=scene.headers)).json()
        assert (fresh["state"], fresh["endpoint_id"], fresh["price"], fresh["attempt"]) == ("pending", scene.endpoint, 2, 0)
        assert [(e["id"], e["amount"]) for e in fresh["ledger_entries"]] == [(f"charge:{new}", -2)]
        stale = await (await api.client.get(f"/v1/deliveries/{old}", headers=scene.headers)).json()
        assert stale["state"] == "dead" and [e["kind"] for e in stale["ledger_entries"]] == ["charge", "refund"]
    assert await _balance(api, scene.headers) == balance - 6
    assert await _replays_of(api, scene.dead + scene.elsewhere) == {old: 1 for old in scene.dead}
    assert (await audit(api.pool)).clean
    after = await _plan(api, scene.headers, scene.endpoint)
    assert (after["count"], after["total_charge"], after["dead_delivery_ids"]) == (0, 0, [])


async def test_the_plan_writes_nothing_and_its_total_follows_the_current_price(api):
    """GET writes nothing; a new price changes the plan's total, and POST charges the plan's total."""
    scene = await _scene(api, price=2)
    before = await api.snapshot()
    assert (await _plan(api, scene.headers, scene.endpoint))["total_charge"] == 6
    assert await api.snapshot() == before
    await api.pool.execute("UPDATE accounts SET price_per_delivery = 5 WHERE id = $1", scene.account_id)
    plan = await _plan(api, scene.headers, scene.endpoint)
    assert plan["total_charge"] == 15
    balance = await _balance(api, scene.headers)
    body = await (await _recover(api, scene.headers, scene.endpoint, 15)).json()
    assert body["total_charged"] == 15 and await _balance(api, scene.headers) == balance - 15
    assert (await audit(api.pool)).clean


async def test_a_confirmed_total_that_is_not_the_total_now_is_409_and_writes_nothing(api):
    """confirm_total differs from the total computed at the moment of the call: 409 total-changed,
    saying the total now; nothing is written; the right total then goes ahead."""
    scene = await _scene(api)
    plan = await _plan(api, scene.headers, scene.endpoint)
    more_dead = await _dead_on(api, scene.headers, scene.endpoint, 1)  # one more died since the plan
    before = await api.snapshot()
    problem = await _problem(await _recover(api, scene.headers, scene.endpoint, plan["total_charge"]), 409,
                             "total-changed")
    assert "charge 8 credits for 4 dead deliveries" in problem["detail"] and "nothing was replayed" in problem["detail"]
    assert await api.snapshot() == before
    for wrong in (0, 9, 7):
        await _problem(await _recover(api, scene.headers, scene.endpoint, wrong), 409, "total-changed")
    assert await api.snapshot() == before
    body = await (await _recover(api, scene.headers, scene.endpoint, 8)).json()
    assert {entry["dead_delivery_id"] for entry in body["replayed"]} == set(scene.dead + more_dead)


async def test_a_total_the_balance_cannot_cover_is_402_and_replays_none(api):
    """All or nothing: with 5 to replay and 2 credits, 402 and nothing is written (create_messages
    alone would replay 2 and refuse 3); topped up, the whole call goes ahead."""
    account_id, headers = await api.account(balance=10, price=1)
    endpoint = (await api.endpoint(headers))["id"]
    dead = await _dead_on(api, headers, endpoint, 5)  # 10 - 5 + 5 refunded
    for _ in range(8):
        assert (await api.send(headers)).status == 202  # spent down to 2
    assert await _balance(api, headers) == 2
    assert (await _plan(api, headers, endpoint))["total_charge"] == 5
    before = await api.snapshot()
    problem = await _problem(await _recover(api, headers, endpoint, 5), 402, "insufficient-balance")
    assert "nothing was replayed" in problem["detail"]
    assert await api.snapshot() == before and await _replays_of(api, dead) == {}
    top_up = await api.client.post(f"/v1/accounts/{account_id}/topups", json={"order_id": "more", "amount": 3},
                                   headers=api.operator)
    assert top_up.status == 201
    body = await (await _recover(api, headers, endpoint, 5)).json()
    assert (body["replayed_count"], body["total_charged"]) == (5, 5) and await _balance(api, headers) == 0
    assert (await audit(api.pool)).clean


async def test_one_call_replays_at_most_200_and_the_next_goes_on(api):
    """205 dead: the plan and the first call take 200 (oldest first) with more=true; the next call
    takes the last 5 with more=false; each dead delivery is replayed once; the audit is clean."""
    account_id, headers = await api.account(balance=1000, price=1)
    endpoint = (await api.endpoint(headers))["id"]
    requests = [MessageRequest(account_id, "invoice.paid", b'{"n":1}', endpoint_ids=(uuid.UUID(endpoint),))
                for _ in range(205)]
    created = await create_messages(api.pool, requests, attempts_max=3)
    dead = [str(message.deliveries[0].id) for message in created]
    await _kill(api, dead)
    plan = await _plan(api, headers, endpoint)
    assert (plan["count"], plan["total_charge"], plan["more"]) == (dead_letters.REPLAY_BATCH_MAX, 200, True)
    assert plan["dead_delivery_ids"] == sorted(dead)[:200]
    first = await (await _recover(api, headers, endpoint, 200)).json()
    assert (first["replayed_count"], first["total_charged"], first["more"]) == (200, 200, True)
    assert {entry["dead_delivery_id"] for entry in first["replayed"]} == set(plan["dead_delivery_ids"])
    second_plan = await _plan(api, headers, endpoint)
    assert (second_plan["count"], second_plan["total_charge"], second_plan["more"]) == (5, 5, False)
    second = await (await _recover(api, headers, endpoint, 5)).json()
    assert (second["replayed_count"], second["more"]) == (5, False)
    assert await _replays_of(api, dead) == {old: 1 for old in dead}
    assert await _balance(api, headers) == 1000 - 205
    assert (await audit(api.pool)).clean


async def test_a_dead_delivery_replayed_before_is_left_out(api):
    """One of three was replayed by the operator's keyed replay (replay:<id>): the plan and POST
    leave it out and charge for the other two only; a second recover finds nothing to do."""
    scene = await _scene(api)
    first = sorted(scene.dead)[0]
    await dead_letters.replay(api.pool, uuid.UUID(first), attempts_max=3)
    plan = await _plan(api, scene.headers, scene.endpoint)
    assert (plan["count"], plan["total_charge"]) == (2, 4) and first not in plan["dead_delivery_ids"]
    body = await (await _recover(api, scene.headers, scene.endpoint, 4)).json()
    assert first not in {entry["dead_delivery_id"] for entry in body["replayed"]} and body["replayed_count"] == 2
    assert await _replays_of(api, scene.dead) == {old: 1 for old in scene.dead}
    empty = await _recover(api, scene.headers, scene.endpoint, 0)
    assert empty.status == 202 and (await empty.json())["replayed_count"] == 0
    assert (await audit(api.pool)).clean


async def _replays(api, old) -> list[dict]:
    """Every delivery that replays `old` (by deliveries.replay_of), oldest first, with its charge."""
    rows = await api.pool.fetch(
        "SELECT d.id, d.state, (SELECT l.amount FROM ledger_entries l WHERE l.id = 'charge:' || d.id::text) AS charge"
        " FROM deliveries d WHERE d.replay_of = $1 ORDER BY d.id", uuid.UUID(str(old)))
    return [dict(row) for row in rows]


async def _single_replay(api, headers: dict, old: str, key: str | None = None) -> str:
    """POST /v1/deliveries/{old}/replay; the new delivery's id."""
    extra = {"Idempotency-Key": key} if key else {}
    response = await api.client.post(f"/v1/deliveries/{old}/replay", headers={**headers, **extra})
    assert response.status == 202, await response.text()
    (delivery,) = (await response.json())["deliveries"]
    return delivery["id"]


@pytest.mark.parametrize("key", [None, "my-own-key"], ids=["unkeyed", "keyed"])
async def test_a_dead_delivery_replayed_singly_is_left_out_and_not_charged_again(api, key):
    """One of three was replayed through POST /v1/deliveries/{id}/replay (unkeyed, or under the
    caller's own key: never replay:<id>): the recovery's plan and the operator's bulk plan leave it
    out; POST recover replays and charges the other two only; the balance and the ledger show one
    replay of it, charged once; a recovery and a bulk replay after that find nothing."""
    scene = await _scene(api)
    first = sorted(scene.dead)[0]
    balance = await _balance(api, scene.headers)
    single = await _single_replay(api, scene.headers, first, key)
    assert await _balance(api, scene.headers) == balance - 2
    plan = await _plan(api, scene.headers, scene.endpoint)
    assert (plan["count"], plan["total_charge"]) == (2, 4) and first not in plan["dead_delivery_ids"]
    since, until = datetime.fromisoformat(plan["since"]), datetime.fromisoformat(plan["until"])
    bulk = await dead_letters.plan_bulk_replay(api.pool, uuid.UUID(scene.endpoint), since, until)
    assert sorted(map(str, bulk.delivery_ids)) == plan["dead_delivery_ids"] and bulk.total_charge == 4
    body = await (await _recover(api, scene.headers, scene.endpoint, 4, until=plan["until"])).json()
    assert (body["replayed_count"], body["already_replayed_count"], body["total_charged"]) == (2, 0, 4)
    assert first not in {entry["dead_delivery_id"] for entry in body["replayed"] + body["already_replayed"]}
    assert await _balance(api, scene.headers) == balance - 2 - 4
    assert await _replays(api, first) == [{"id": uuid.UUID(single), "state": "pending", "charge": -2}]
    for old in scene.dead:
        assert [replay["charge"] for replay in await _replays(api, old)] == [-2]
    assert (await _plan(api, scene.headers, scene.endpoint))["count"] == 0
    after = await dead_letters.bulk_replay(api.pool, uuid.UUID(scene.endpoint), since, until, confirm_total=0,
                                           attempts_max=3)
    assert (after.created, after.already, after.charged) == ({}, {}, 0)
    assert await _balance(api, scene.headers) == balance - 6
    assert (await audit(api.pool)).clean


async def test_the_operators_bulk_replay_leaves_out_a_dead_delivery_replayed_singly(api):
    """The operator's bulk replay (hookledger deliveries replay --endpoint) after a single replay
    through the API: its plan's total leaves that delivery out, and it replays and charges the other
    two only."""
    scene = await _scene(api)
    first = sorted(scene.dead)[0]
    await _single_replay(api, scene.headers, first)
    balance = await _balance(api, scene.headers)
    since, until = datetime(2000, 1, 1, tzinfo=timezone.utc), datetime(2999, 1, 1, tzinfo=timezone.utc)
    plan = await dead_letters.plan_bulk_replay(api.pool, uuid.UUID(scene.endpoint), since, until)
    assert uuid.UUID(first) not in plan.delivery_ids and plan.total_charge == 4
    done = await dead_letters.bulk_replay(api.pool, uuid.UUID(scene.endpoint), since, until, confirm_total=4,
                                          attempts_max=3)
    assert set(map(str, done.created)) == set(scene.dead) - {first} and done.charged == 4
    assert await _balance(api, scene.headers) == balance - 4
    assert [len(await _replays(api, old)) for old in sorted(scene.dead)] == [1, 1, 1]
    assert (await audit(api.pool)).clean


async def test_a_single_replay_after_a_recovery_is_one_more_replay_and_the_plan_still_leaves_it_out(api):
    """Asked for by id, a dead delivery that a recovery replayed already is replayed once more and
    charged (the caller asked for exactly that); the recovery's plan still offers nothing."""
    scene = await _scene(api)
    assert (await (await _recover(api, scene.headers, scene.endpoint, 6)).json())["replayed_count"] == 3
    first = sorted(scene.dead)[0]
    balance = await _balance(api, scene.headers)
    again = await _single_replay(api, scene.headers, first)
    assert await _balance(api, scene.headers) == balance - 2
    replays = await _replays(api, first)
    assert len(replays) == 2 and replays[-1]["id"] == uuid.UUID(again)
    assert [replay["charge"] for replay in replays] == [-2, -2]
    plan = await _plan(api, scene.headers, scene.endpoint)
    assert (plan["count"], plan["total_charge"]) == (0, 0)
    assert (await audit(api.pool)).clean


async def test_replay_of_names_the_delivery_replayed_and_is_null_on_a_messages_own(api):
    """replay_of, in the table and on GET /v1/deliveries/{id} and the list: null on the deliveries
    of a message sent; the old delivery's id on a single replay's, a recovery's, the operator's
    keyed replay's and its --again replay's; a replay of a replay names the replay it sent again."""
    scene = await _scene(api, dead=4)
    first, second, third, fourth = sorted(scene.dead)
    sent = await (await api.send(scene.headers)).json()
    single = await _single_replay(api, scene.headers, first)
    recovered = await (await _recover(api, scene.headers, scene.endpoint, 6, until="2999-01-01T00:00:00Z")).json()
    assert {entry["dead_delivery_id"] for entry in recovered["replayed"]} == {second, third, fourth}
    keyed = await dead_letters.replay(api.pool, uuid.UUID(fourth), attempts_max=3)
    assert keyed.already and not keyed.created  # the recovery's replay, under the same key replay:<id>
    forced = await dead_letters.replay(api.pool, uuid.UUID(fourth), attempts_max=3, again=True)
    await _kill(api, [single])
    of_replay = await _single_replay(api, scene.headers, single)
    expected = {delivery["id"]: None for delivery in sent["deliveries"]}
    expected |= {single: first, of_replay: single, str(forced.created[uuid.UUID(fourth)]): fourth}
    expected |= {entry["delivery_id"]: entry["dead_delivery_id"] for entry in recovered["replayed"]}
    expected |= {old: None for old in scene.dead + scene.elsewhere}
    rows = await api.pool.fetch("SELECT id, replay_of FROM deliveries WHERE account_id = $1", scene.account_id)
    table = {str(row["id"]): None if row["replay_of"] is None else str(row["replay_of"]) for row in rows}
    assert {delivery_id: table[delivery_id] for delivery_id in expected} == expected
    assert all(table[delivery_id] is None for delivery_id in set(table) - set(expected))  # the scene's live ones
    listed = await (await api.client.get("/v1/deliveries", params={"limit": "100"}, headers=scene.headers)).json()
    assert listed["next_cursor"] is None
    assert {delivery["id"]: delivery["replay_of"] for delivery in listed["data"]} == table
    for delivery_id, replayed in expected.items():
        one = await (await api.client.get(f"/v1/deliveries/{delivery_id}", headers=scene.headers)).json()
        assert one["replay_of"] == replayed, delivery_id
    assert (await audit(api.pool)).clean


async def test_the_range_bounds_what_is_replayed(api):
    """Only deliveries that died in [since, until) are planned and replayed; until defaults to
    PostgreSQL's now, and the plan echoes the range it used."""
    scene = await _scene(api, dead=2)
    cut = (await api.pool.fetchval("SELECT now()")).isoformat()
    later = await _dead_on(api, scene.headers, scene.endpoint, 1)
    early = await _plan(api, scene.headers, scene.endpoint, until=cut)
    assert sorted(early["dead_delivery_ids"]) == sorted(scene.dead)
    recent = await api.client.get(f"/v1/endpoints/{scene.endpoint}/recover", params={"since": cut},
                                  headers=scene.headers)
    body = await recent.json()
    assert body["dead_delivery_ids"] == later and body["since"].startswith(cut[:19])
    response = await _recover(api, scene.headers, scene.endpoint, 2, since=cut)
    assert [entry["dead_delivery_id"] for entry in (await response.json())["replayed"]] == later


async def test_another_accounts_endpoint_a_missing_one_and_a_deleted_one_are_404(api):
    """Another account's endpoint answers 404 on the plan and on POST, exactly as a missing or
    malformed id does, and nothing is written; a deleted endpoint is 404 too."""
    owner = await _scene(api)
    _, intruder = await api.account(balance=100)
    before = await api.snapshot()
    for endpoint in (owner.endpoint, str(uuid.uuid4()), "nope"):
        plan = await api.client.get(f"/v1/endpoints/{endpoint}/recover", params={"since": SINCE}, headers=intruder)
        problem = await _problem(plan, 404, "not-found")
        assert problem["detail"] == "no such endpoint"
        post = await _recover(api, intruder, endpoint, 6)
        assert (await _problem(post, 404, "not-found"))["detail"] == "no such endpoint"
    assert await api.snapshot() == before
    assert (await api.client.delete(f"/v1/endpoints/{owner.other}", headers=owner.headers)).status == 200
    before = await api.snapshot()
    gone = await api.client.get(f"/v1/endpoints/{owner.other}/recover", params={"since": SINCE}, headers=owner.headers)
    await _problem(gone, 404, "not-found")
    await _problem(await _recover(api, owner.headers, owner.other, 2), 404, "not-found")
    assert await api.snapshot() == before


async def test_a_disabled_endpoint_is_planned_but_not_recovered(api):
    """A disabled endpoint's plan answers (endpoint_enabled false); POST is 409 endpoint-disabled and
    writes nothing, as a replay to it would be refused; enabled again, the recovery goes ahead."""
    scene = await _scene(api)
    patched = await api.client.patch(f"/v1/endpoints/{scene.endpoint}", json={"enabled": False}, headers=scene.headers)
    assert patched.status == 200
    plan = await _plan(api, scene.headers, scene.endpoint)
    assert (plan["endpoint_enabled"], plan["count"]) == (False, 3)
    before = await api.snapshot()
    await _problem(await _recover(api, scene.headers, scene.endpoint, 6), 409, "endpoint-disabled")
    assert await api.snapshot() == before
    await api.client.patch(f"/v1/endpoints/{scene.endpoint}", json={"enabled": True}, headers=scene.headers)
    assert (await (await _recover(api, scene.headers, scene.endpoint, 6)).json())["replayed_count"] == 3


async def test_missing_and_wrong_keys_are_401_and_write_nothing(api):
    """No key or a wrong key: 401 on the plan and on POST; the operator key: 403; nothing written."""
    scene = await _scene(api)
    before = await api.snapshot()
    for headers in ({}, {"Authorization": "Bearer hl_live_wrong"}):
        plan = await api.client.get(f"/v1/endpoints/{scene.endpoint}/recover", params={"since": SINCE}, headers=headers)
        assert plan.status == 401 and plan.headers["WWW-Authenticate"].startswith("Bearer")
        post = await _recover(api, headers, scene.endpoint, 6)
        assert post.status == 401 and post.content_type == "application/problem+json"
    forbidden = await _recover(api, api.operator, scene.endpoint, 6)
    assert forbidden.status == 403
    assert await api.snapshot() == before


_BAD_BODIES = [
    ({"since": SINCE, "confirm_total": 6, "extra": 1}, {"extra"}),
    ({"confirm_total": 6}, {"since"}),
    ({"since": SINCE}, {"confirm_total"}),
    ({"since": "2026-01-01T00:00:00", "confirm_total": 6}, {"since"}),  # no timezone
    ({"since": "yesterday", "confirm_total": 6}, {"since"}),
    ({"since": SINCE, "until": "2026-01-01", "confirm_total": 6}, {"until"}),
    ({"since": SINCE, "until": SINCE, "confirm_total": 6}, {"until"}),  # since < until
    ({"since": "2001-01-01T00:00:00Z", "until": "2000-06-01T00:00:00+02:00", "confirm_total": 6}, {"until"}),
    ({"since": "2999-01-01T00:00:00Z", "confirm_total": 6}, {"since"}),  # later than now, the default until
    ({"since": "0001-01-01T00:00:00+14:00", "confirm_total": 6}, {"since"}),  # before year 1 in UTC
    ({"since": SINCE, "confirm_total": -1}, {"confirm_total"}),
    ({"since": SINCE, "confirm_total": "6"}, {"confirm_total"}),
    ({"since": SINCE, "confirm_total": 6.5}, {"confirm_total"}),
    ({"since": SINCE, "confirm_total": 2**63}, {"confirm_total"}),
    ({"since": SINCE, "confirm_total": True}, {"confirm_total"}),
]


@pytest.mark.parametrize("body, fields", _BAD_BODIES)
async def test_invalid_bodies_are_422_naming_the_field_and_change_nothing(api, body, fields):
    scene = await _scene(api, dead=1)
    before = await api.snapshot()
    response = await api.client.post(f"/v1/endpoints/{scene.endpoint}/recover", json=body, headers=scene.headers)
    problem = await _problem(response, 422, "invalid-request")
    assert {error["field"] for error in problem["errors"]} == fields, problem
    assert await api.snapshot() == before


async def test_malformed_json_and_invalid_query_strings_are_refused_and_change_nothing(api):
    scene = await _scene(api, dead=1)
    before = await api.snapshot()
    malformed = await api.client.post(f"/v1/endpoints/{scene.endpoint}/recover", data=b"{",
                                      headers={**scene.headers, "Content-Type": "application/json"})
    await _problem(malformed, 400, "malformed-json")
    twice = await api.client.post(f"/v1/endpoints/{scene.endpoint}/recover",
                                  data=b'{"since": "2000-01-01T00:00:00Z", "confirm_total": 2, "confirm_total": 2}',
                                  headers={**scene.headers, "Content-Type": "application/json"})
    assert {e["field"] for e in (await _problem(twice, 422, "invalid-request"))["errors"]} == {"confirm_total"}
    for params, fields in (({}, {"since"}), ({"since": "2026-01-01T00:00:00"}, {"since"}),
                           ({"since": SINCE, "until": "2000-01-01T00:00:00Z"}, {"until"}),
                           ({"since": "2999-01-01T00:00:00Z"}, {"since"}),
                           ({"since": SINCE, "limit": "5"}, {"limit"}), ({"since": "x", "until": "y"}, {"since", "until"})):
        response = await api.client.get(f"/v1/endpoints/{scene.endpoint}/recover", params=params, headers=scene.headers)
        problem = await _problem(response, 422, "invalid-request")
        assert {error["field"] for error in problem["errors"]} == fields, (params, problem)
    assert await api.snapshot() == before


async def test_an_idempotency_key_answers_a_retry_with_the_first_answer(api):
    """The same key and body again: the stored answer (Idempotent-Replayed: true), not 409
    total-changed, and nothing more charged; another body with the key is 422; a refused call stores
    nothing, so its corrected retry with the same key goes ahead."""
    scene = await _scene(api)
    refused = await _recover(api, scene.headers, scene.endpoint, 5, key="recover-1")
    await _problem(refused, 409, "total-changed")
    first = await _recover(api, scene.headers, scene.endpoint, 6, key="recover-1")
    assert first.status == 202 and "Idempotent-Replayed" not in first.headers
    before = await api.snapshot()
    again = await _recover(api, scene.headers, scene.endpoint, 6, key="recover-1")
    assert again.status == 202 and again.headers["Idempotent-Replayed"] == "true"
    assert await again.read() == await first.read()
    assert await api.snapshot() == before
    await _problem(await _recover(api, scene.headers, scene.endpoint, 0, key="recover-1"), 422,
                   "idempotency-key-reused")
    unkeyed = await _recover(api, scene.headers, scene.endpoint, 6)
    await _problem(unkeyed, 409, "total-changed")  # without the key, the total now (0) is told instead
    assert await api.snapshot() == before
    assert await _replays_of(api, scene.dead) == {old: 1 for old in scene.dead}


@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "unkeyed"])
async def test_a_lost_commit_answer_is_resolved(api, cut_pool, cutter, queue, keyed):
    """Through a proxy that drops COMMIT's answer: written, 202 with the replays (the lost answer is
    asked about, not guessed); not written, 503 write-failed and nothing written, and the retry
    replays once. With a key, the retry of the written call answers the stored answer."""
    settings = dataclasses.replace(api.settings, api=dataclasses.replace(api.settings.api,
                                                                          commit_outcome_wait_seconds=2))
    scene = await _scene(api)
    extra = {"Idempotency-Key": "cut-1"} if keyed else {}
    async with TestClient(TestServer(create_app(settings, cut_pool, queue), host="127.0.0.1")) as client:
        async def post(confirm_total: int):
            return await client.post(f"/v1/endpoints/{scene.endpoint}/recover",
                                     json={"since": SINCE, "confirm_total": confirm_total},
                                     headers={**scene.headers, **extra})

        assert (await client.get("/v1/balance", headers=scene.headers)).status == 200  # the key cached before a cut
        cutter.arm("before")
        failed = await post(6)
        problem = await _problem(failed, 503, "write-failed")
        assert failed.headers["Retry-After"] == "1", problem
        assert await _replays_of(api, scene.dead) == {}
        cutter.arm("after")
        written = await post(6)
        assert written.status == 202, await written.text()
        assert (await written.json())["replayed_count"] == 3
        assert cutter.cuts == 2
        retried = await post(6)
        if keyed:
            assert retried.status == 202 and retried.headers["Idempotent-Replayed"] == "true"
            assert await retried.read() == await written.read()
        else:
            await _problem(retried, 409, "total-changed")
    assert await _replays_of(api, scene.dead) == {old: 1 for old in scene.dead}
    assert (await audit(api.pool)).clean


async def test_concurrent_identical_recovers_replay_each_dead_delivery_exactly_once(api):
    """8 identical recovers at once (half with one Idempotency-Key, half without), 20 rounds: each
    round exactly one call replays (202, not a stored answer) and charges the total once; the others
    answer the stored answer, 409 idempotency-key-in-use or 409 total-changed; no dead delivery is
    ever replayed twice; balance, ledger and audit agree."""
    account_id, headers = await api.account(balance=10_000, price=3)
    endpoint = (await api.endpoint(headers))["id"]
    every_dead: list[str] = []
    for round_number in range(CONCURRENT_ROUNDS):
        dead = await _dead_on(api, headers, endpoint, 3)
        every_dead += dead
        balance = await _balance(api, headers)
        total = (await _plan(api, headers, endpoint))["total_charge"]
        assert total == 9
        calls = [_recover(api, headers, endpoint, total, key=f"round-{round_number}" if index % 2 else None)
                 for index in range(CONCURRENT_CALLS)]
        responses = await asyncio.gather(*calls)
        fresh, outcomes = [], []
        for response in responses:
            body = await response.json()
            if response.status == 202 and "Idempotent-Replayed" not in response.headers:
                fresh.append(body)
                outcomes.append("replayed")
            elif response.status == 202:
                outcomes.append("stored")
            else:
                assert response.status == 409, body
                outcomes.append(body["type"].rsplit("/", 1)[-1])
        assert len(fresh) == 1, outcomes
        assert set(outcomes) <= {"replayed", "stored", "idempotency-key-in-use", "total-changed"}, outcomes
        assert sorted(entry["dead_delivery_id"] for entry in fresh[0]["replayed"]) == sorted(dead)
        assert fresh[0]["total_charged"] == total
        assert await _balance(api, headers) == balance - total
    assert await _replays_of(api, every_dead) == {old: 1 for old in every_dead}
    charges = await api.pool.fetchval(
        "SELECT count(*) FROM ledger_entries l JOIN deliveries d ON d.id = l.delivery_id"
        " JOIN messages m ON m.id = d.message_id WHERE l.kind = 'charge' AND m.idempotency_key LIKE 'replay:%'"
        " AND d.account_id = $1", account_id)
    assert charges == len(every_dead)
    assert (await audit(api.pool)).clean


async def test_the_document_describes_both_operations_and_their_answers(api):
    """/openapi.json lists both operations with their refusals (402/404/409/422, Retry-After on 409),
    and a real plan and a real recovery validate against the schemas it gives for them."""
    jsonschema_rs = pytest.importorskip("jsonschema_rs")  # schemathesis's own validator
    spec = await (await api.client.get("/openapi.json")).json()
    operations = spec["paths"]["/v1/endpoints/{id}/recover"]
    assert {"200", "401", "403", "404", "422", "503"} <= set(operations["get"]["responses"])
    assert {"202", "400", "402", "404", "409", "413", "415", "422", "503"} <= set(operations["post"]["responses"])
    assert "Retry-After" in operations["post"]["responses"]["409"]["headers"]
    assert "Idempotent-Replayed" in operations["post"]["responses"]["202"]["headers"]
    since = next(p for p in operations["get"]["parameters"] if p["name"] == "since")
    assert since["required"] is True and since["schema"]["format"] == "date-time"
    scene = await _scene(api)
    plan = await _plan(api, scene.headers, scene.endpoint)
    recovered = await (await _recover(api, scene.headers, scene.endpoint, plan["total_charge"])).json()
    for body, kind in ((plan, "RecoverPlan"), (recovered, "Recovered")):
        schema = {"$ref": f"#/components/schemas/{kind}", "components": spec["components"]}
        jsonschema_rs.Draft202012Validator(schema, validate_formats=True).validate(body)
