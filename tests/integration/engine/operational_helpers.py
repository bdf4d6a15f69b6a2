"""Operational receivers on loopback that verify with the public `standardwebhooks` and `svix` libraries, and the
checks every operational test makes: each event received, signed, once in the database."""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass, field

from aiohttp import web
from standardwebhooks.webhooks import Webhook
from svix.webhooks import Webhook as SvixWebhook

from delivery.store import operational as store
from signing import Keyring, generate_secret


@dataclass
class OperationalReceiver:
    """Answers 2xx (or what `behaviour` says) and verifies each request with standardwebhooks and svix."""

    secret: str
    url: str = ""
    behaviour: object = None  # request number -> status (or a coroutine of one); None: 204
    received: list[dict] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {name.lower(): value for name, value in request.headers.items()}
        try:
            payload = Webhook(self.secret).verify(body, headers)
            SvixWebhook(self.secret).verify(body, headers)  # the svix library too
            verified = True
        except Exception:  # noqa: BLE001 - recorded, and the tests assert it never happens
            payload, verified = json.loads(body), False
        self.received.append({"webhook_id": headers.get("webhook-id"), "payload": payload, "verified": verified})
        status = 204 if self.behaviour is None else self.behaviour(len(self.received))
        if asyncio.iscoroutine(status):
            status = await status
        return web.Response(status=status)

    def of_type(self, event_type: str) -> list[dict]:
        return [entry for entry in self.received if entry["payload"]["type"] == event_type]


async def start_operational_receiver(runners: list, behaviour=None) -> OperationalReceiver:
    receiver = OperationalReceiver(secret=generate_secret(), behaviour=behaviour)
    app = web.Application()
    app.router.add_post("/ops", receiver.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    receiver.url = f"http://127.0.0.1:{runner.addresses[0][1]}/ops"
    runners.append(runner)
    return receiver


async def add_operational_endpoint(pool, account_id: uuid.UUID, receiver: OperationalReceiver, keyring: Keyring,
                                   event_types: list[str] | None = None) -> uuid.UUID:
    endpoint = await store.create_endpoint(pool, account_id, receiver.url, secret=receiver.secret, keyring=keyring,
                                           event_types=event_types, description="ops", enabled=True)
    return endpoint.id


async def events_of(pool, account_id: uuid.UUID, event_type: str | None = None) -> list:
    return await pool.fetch(
        "SELECT id, type, data::text AS data FROM operational_events WHERE account_id = $1"
        " AND ($2::text IS NULL OR type = $2) ORDER BY seq", account_id, event_type)


async def all_received(pool, account_id: uuid.UUID, receiver: OperationalReceiver) -> bool:
    """Every event of the account was dispatched and its deliveries have ended delivered."""
    row = await pool.fetchrow(
        "SELECT count(*) FILTER (WHERE dispatched_at IS NULL) AS waiting,"
        "   (SELECT count(*) FROM operational_deliveries WHERE account_id = $1 AND state <> 'delivered') AS open"
        " FROM operational_events WHERE account_id = $1", account_id)
    return row["waiting"] == 0 and row["open"] == 0 and len(receiver.received) > 0


async def check_each_received_once(pool, account_id: uuid.UUID, receiver: OperationalReceiver) -> None:
    """Each event of the account: one delivery in the database, delivered; received, verified with
    standardwebhooks, under webhook-id = the event's id, with the body the event holds."""
    events = await events_of(pool, account_id)
    deliveries = await pool.fetch("SELECT event_id, state FROM operational_deliveries WHERE account_id = $1",
                                  account_id)
    assert sorted(row["event_id"] for row in deliveries) == sorted(event["id"] for event in events)
    assert {row["state"] for row in deliveries} <= {"delivered"}
    assert all(entry["verified"] for entry in receiver.received), receiver.received
    by_id = {entry["webhook_id"]: entry for entry in receiver.received}
    assert set(by_id) == {str(event["id"]) for event in events}
    for event in events:
        payload = by_id[str(event["id"])]["payload"]
        assert payload["type"] == event["type"] and payload["data"] == json.loads(event["data"])
        assert set(payload) == {"type", "timestamp", "data"}


async def send_due(pool, keyring: Keyring) -> None:
    """One run of the operational sender (dispatch, claim, send, record), as the worker's cron does."""
    from delivery.engine.retry import RetrySettings
    from delivery.engine.sender import Sender, SenderSettings
    from delivery.operations.operational_sender import OperationalSender

    sender = Sender(SenderSettings(allow_loopback=True, timeout_ms_default=2000, timeout_ms_max=2000))
    try:
        await OperationalSender(pool, sender, keyring, RetrySettings()).run_once()
    finally:
        await sender.close()
