"""The SDK reads what the API says of webhook-ids and endpoint controls: each delivery's
webhook_id (a replay's is the replayed delivery's), and an endpoint's signing kind and headers."""

from __future__ import annotations

from billing.settle import DeadReason, settle


async def test_deliveries_and_endpoints_carry_the_new_fields(sdk, pool):
    endpoint = await sdk.endpoints.create("https://example.com/hooks")
    assert (endpoint.signing_key_type, endpoint.headers) == ("hmac", None)
    message = await sdk.send("invoice.paid", {"n": 1})
    dead = message.deliveries[0].id
    owner = await pool.fetchval("SELECT account_id FROM deliveries WHERE id = $1", dead)
    await settle(pool, dead, DeadReason.OUT_OF_RETRIES, account_id=owner, attempt=0)  # as if every attempt failed
    replay = (await sdk.deliveries.replay(dead)).deliveries[0].id
    assert (await sdk.deliveries.get(dead)).webhook_id == dead
    detail = await sdk.deliveries.get(replay)
    assert (detail.webhook_id, detail.replay_of) == (dead, dead)
    page = await sdk.deliveries.list()
    assert {delivery.id: delivery.webhook_id for delivery in page} == {dead: dead, replay: dead}
