"""A replay, a recovery and an operator's bulk replay arrive under the webhook-id of the delivery
they replay, so a receiver deduplicating on webhook-id processes each webhook once.

Everything real: the API on loopback, a worker with its Redis, and a receiver built as
signing/RECEIVING.md says (webhook_handler with the PostgreSQL dedupe store, the business write
in the receipt's transaction). The receiver processes the first attempt of each original but
answers too late, every time, so each original dies out_of_retries and is refunded although it
was processed: the case a replay under a new id would process twice. A replay of a webhook the
receiver never processed (it answered 503 before processing) is processed, once.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta, timezone

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from billing.audit import audit
from delivery.operations import dead_letters
from delivery.platform import config
from delivery.platform.web_app import create_app
from engine_helpers import fast_environment, running_worker, wait_for
from signing import PostgresDedupe, WebhookEvent, create_receipts_table, generate_secret, webhook_handler

OPERATOR_KEY = "op_replay_webhook_id_" + "k" * 32
PRICE = 3
SEND_TIMEOUT_SECONDS = 1.0  # the endpoints' timeout_ms
LATE_SECONDS = SEND_TIMEOUT_SECONDS + 0.5  # how late the receiver answers while `late`


class DedupingReceiver:
    """signing.webhook_handler on PostgresDedupe; records every request's webhook-id and answer."""

    def __init__(self, pool, secret: str) -> None:
        self.pool = pool
        self.late = False  # process, then answer after the sender has given up
        self.refusing = False  # answer 503 without processing
        self.requests: list[tuple[str, int]] = []  # (webhook-id, status answered)
        self.handle = webhook_handler(self._process, keys=[secret], dedupe=PostgresDedupe(pool))

    async def _process(self, event: WebhookEvent) -> None:
        # The receiver's own write, in the receipt's transaction: it commits exactly once per id.
        await event.connection.execute("INSERT INTO receiver_orders (webhook_id) VALUES ($1)", event.id)

    @web.middleware
    async def observe(self, request: web.Request, handler) -> web.StreamResponse:
        if self.refusing:
            response = web.Response(status=503)
        else:
            response = await handler(request)
            if self.late:
                await asyncio.sleep(LATE_SECONDS)
        self.requests.append((request.headers.get("webhook-id", ""), response.status))
        return response

    async def processed(self) -> dict[str, int]:
        rows = await self.pool.fetch("SELECT webhook_id, count(*) AS n FROM receiver_orders GROUP BY webhook_id")
        return {row["webhook_id"]: row["n"] for row in rows}


async def _dead(pool, delivery_ids) -> bool:
    return await pool.fetchval("SELECT count(*) = $2 FROM deliveries WHERE id = ANY($1::uuid[]) AND state = 'dead'",
                               list(delivery_ids), len(delivery_ids))


async def _delivered(pool, delivery_ids) -> bool:
    return await pool.fetchval(
        "SELECT count(*) = $2 FROM deliveries WHERE id = ANY($1::uuid[]) AND state = 'delivered'",
        list(delivery_ids), len(delivery_ids))


async def test_replays_arrive_under_the_original_webhook_id_and_are_processed_once(
        pool, database_url, redis_url, keyring, arq_queue):
    settings = config.load(fast_environment(database_url, redis_url, keyring, HOOKLEDGER_OPERATOR_KEY=OPERATOR_KEY))
    secret = generate_secret()
    async with pool.acquire() as connection:
        await create_receipts_table(connection)
        await connection.execute("CREATE TABLE receiver_orders (webhook_id text NOT NULL)")
    receiver = DedupingReceiver(pool, secret)
    app = web.Application(middlewares=[receiver.observe])
    app.router.add_post("/webhooks", receiver.handle)
    async with TestServer(app, host="127.0.0.1") as receiver_server, \
            TestClient(TestServer(create_app(settings, pool, arq_queue), host="127.0.0.1")) as api, \
            running_worker(settings, pool):
        operator = {"Authorization": f"Bearer {OPERATOR_KEY}"}
        created = await (await api.post("/v1/accounts", json={"name": "replays", "price_per_delivery": PRICE},
                                        headers=operator)).json()
        account_id = created["account"]["id"]
        headers = {"Authorization": f"Bearer {created['api_key']['key']}"}
        topup = await api.post(f"/v1/accounts/{account_id}/topups", json={"order_id": "o-1", "amount": 1000},
                               headers=operator)
        assert topup.status == 201
        url = str(receiver_server.make_url("/webhooks"))
        endpoints = {}
        for name in ("single", "bulk"):  # a second endpoint for the operator's bulk replay, apart from recover
            response = await api.post("/v1/endpoints", json={"url": url, "secret": secret, "event_types": [name],
                                                                 "timeout_ms": 1000},
                                      headers=headers)
            assert response.status == 201, await response.text()
            endpoints[name] = (await response.json())["id"]

        async def send(event_type: str) -> uuid.UUID:
            response = await api.post("/v1/messages", json={"event_type": event_type, "payload": {"t": event_type}},
                                      headers=headers)
            assert response.status == 202, await response.text()
            return uuid.UUID((await response.json())["deliveries"][0]["id"])

        # Three originals, each processed on its first attempt but answered too late every time.
        receiver.late = True
        since = datetime.now(timezone.utc) - timedelta(minutes=1)
        first, second, third = await send("single"), await send("single"), await send("bulk")
        await wait_for(lambda: _dead(pool, (first, second, third)), timeout_seconds=60)
        assert await receiver.processed() == {str(first): 1, str(second): 1, str(third): 1}
        receiver.late = False

        # A replay through the API.
        response = await api.post(f"/v1/deliveries/{first}/replay", headers=headers)
        assert response.status == 202, await response.text()
        replay = uuid.UUID((await response.json())["deliveries"][0]["id"])
        # The endpoint's recovery: only `second` is left to it (`first` was replayed).
        plan = await (await api.get(f"/v1/endpoints/{endpoints['single']}/recover",
                                    params={"since": since.isoformat()}, headers=headers)).json()
        assert plan["dead_delivery_ids"] == [str(second)]
        response = await api.post(f"/v1/endpoints/{endpoints['single']}/recover",
                                  json={"since": since.isoformat(), "confirm_total": plan["total_charge"]},
                                  headers=headers)
        assert response.status == 202, await response.text()
        recovered = uuid.UUID((await response.json())["replayed"][0]["delivery_id"])
        # The operator's bulk replay (found by the worker's sweep: nothing wakes it).
        bulk = await dead_letters.bulk_replay(pool, uuid.UUID(endpoints["bulk"]), since, datetime.now(timezone.utc),
                                              confirm_total=PRICE, attempts_max=settings.ledger.attempts_max)
        bulk_replay = bulk.created[third]
        await wait_for(lambda: _delivered(pool, (replay, recovered, bulk_replay)), timeout_seconds=30)
        # A replay of the replay: still the first webhook's id.
        response = await api.post(f"/v1/deliveries/{replay}/replay", headers=headers)
        again = uuid.UUID((await response.json())["deliveries"][0]["id"])
        await wait_for(lambda: _delivered(pool, (again,)), timeout_seconds=30)

        # A webhook the receiver never processed (503 before its handler): its replay is processed.
        receiver.refusing = True
        unprocessed = await send("single")
        await wait_for(lambda: _dead(pool, (unprocessed,)), timeout_seconds=30)
        receiver.refusing = False
        response = await api.post(f"/v1/deliveries/{unprocessed}/replay", headers=headers)
        late_replay = uuid.UUID((await response.json())["deliveries"][0]["id"])
        await wait_for(lambda: _delivered(pool, (late_replay,)), timeout_seconds=30)

        replays = {replay: first, recovered: second, bulk_replay: third, again: first, late_replay: unprocessed}
        for new_id, original in replays.items():
            body = await (await api.get(f"/v1/deliveries/{new_id}", headers=headers)).json()
            assert (body["webhook_id"], body["state"]) == (str(original), "delivered"), body
            charges = [(entry["id"], entry["amount"]) for entry in body["ledger_entries"]]
            assert charges == [(f"charge:{new_id}", -PRICE)]
        assert (await (await api.get(f"/v1/deliveries/{again}", headers=headers)).json())["replay_of"] == str(replay)
        original_body = await (await api.get(f"/v1/deliveries/{first}", headers=headers)).json()
        assert original_body["webhook_id"] == str(first) and original_body["replay_of"] is None
        balance = (await (await api.get("/v1/balance", headers=headers)).json())["balance"]

    # Every request carried a webhook-id the receiver verified (none answered 401), and never the
    # replay's own id; the receiver processed each webhook once, the never-processed one included.
    assert {status for _, status in receiver.requests} <= {200, 503}
    assert {webhook_id for webhook_id, _ in receiver.requests} == {str(d) for d in (first, second, third, unprocessed)}
    for new_id, original in replays.items():
        assert (str(original), 200) in receiver.requests
    assert await receiver.processed() == {str(d): 1 for d in (first, second, third, unprocessed)}
    # The originals died and were refunded; the five replays are charged, as any delivery.
    assert balance == 1000 - len(replays) * PRICE
    report = await audit(pool)
    assert report.clean, report.violations
