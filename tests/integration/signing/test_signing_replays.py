"""What signing/RECEIVING.md says of replays, with each store: a replay (the same webhook-id, a
new timestamp and signature) of a webhook the receiver processed is answered 200 and dropped;
once its id is forgotten as the guide says (the receipt deleted, or `release`), it is processed
again."""

from __future__ import annotations

import json
import time

from signing import (MemoryDedupeStore, PostgresDedupe, RedisDedupeStore, generate_secret, webhook_handler,
                     webhook_headers)
from signing.dedupe_postgres import PostgresDedupeStore

WEBHOOK_ID = "01a2b3c4-0000-7000-8000-000000000001"  # the replayed delivery's id, on every copy


async def _forget(dedupe, webhook_id: str, pool=None) -> None:
    """Forget one id, as RECEIVING.md tells each store's user to."""
    if isinstance(dedupe, PostgresDedupe):
        await pool.execute("DELETE FROM webhook_receipts WHERE webhook_id = $1", webhook_id)
    else:
        assert isinstance(dedupe, (MemoryDedupeStore, RedisDedupeStore))
        await dedupe.release(webhook_id)


async def test_a_replay_is_dropped_until_its_id_is_forgotten(dedupe, dedupe_backend, serve, http):
    kind, server = dedupe_backend
    secret = generate_secret()
    processed: list[str] = []

    async def on_webhook(event) -> None:
        processed.append(event.id)

    url = await serve(webhook_handler(on_webhook, keys=[secret], dedupe=dedupe))
    body = json.dumps({"type": "invoice.paid"}).encode()

    async def send(timestamp: int) -> dict:
        headers = webhook_headers(WEBHOOK_ID, timestamp, body, [secret])
        async with http.post(url, data=body, headers=headers) as response:
            assert response.status == 200
            return await response.json()

    now = int(time.time())
    assert await send(now) == {"id": WEBHOOK_ID, "received": True}
    assert (await send(now + 1)).get("duplicate") is True  # the replay: another attempt, the same id
    await _forget(dedupe, WEBHOOK_ID, server if kind == "postgres" else None)
    assert (await send(now + 2)).get("received") is True
    assert processed == [WEBHOOK_ID, WEBHOOK_ID]
    if kind == "postgres":
        async with server.acquire() as connection:
            assert await PostgresDedupeStore(connection).is_complete(WEBHOOK_ID)
