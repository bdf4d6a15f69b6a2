"""The SDK covers the operational routes: endpoints, events (paged, filtered, iterated), the low
balance threshold; the blocking client too; another account's ids raise NotFoundError."""

from __future__ import annotations

import asyncio

import pytest

from delivery.client import AsyncClient, Client, NotFoundError, ValidationError


async def test_operational_endpoints_events_and_threshold(sdk, operator, account, base_url):
    created = await sdk.operational.create_endpoint("https://ops.example.com/hook", event_types=["balance.low"])
    assert created.secret.startswith("whsec_") and created.endpoint.event_types == ("balance.low",)
    endpoint_id = created.endpoint.id
    assert await sdk.operational.get_secret(endpoint_id) == created.secret
    assert [e.id for e in await sdk.operational.list_endpoints()] == [endpoint_id]
    updated = await sdk.operational.update_endpoint(endpoint_id, event_types=None, enabled=False)
    assert (updated.event_types, updated.enabled) == (None, False)
    own = await sdk.operational.set_low_balance_threshold(50)
    assert (own.low_balance_threshold, own.balance) == (50, 100)
    for number in range(3):
        await operator.accounts.top_up(account[0].account.id, f"order-more-{number}", 10)
    page = await sdk.operational.events(limit=2)
    assert [event.type for event in page] == ["topup.applied"] * 2 and page.next_cursor is not None
    everything = [event async for event in sdk.operational.iterate_events(page_size=2)]
    assert [event.data["order_id"] for event in everything] == ["order-1"] + [f"order-more-{n}" for n in range(3)]
    assert (await sdk.operational.get_event(everything[0].id)).seq == everything[0].seq
    assert (await sdk.operational.events(type="balance.low")).data == ()
    with pytest.raises(ValidationError):
        await sdk.operational.events(type="nope")
    other = await operator.accounts.create("other")
    async with AsyncClient(base_url, other.api_key.key, retries=0) as stranger:
        with pytest.raises(NotFoundError):
            await stranger.operational.get_endpoint(endpoint_id)
        with pytest.raises(NotFoundError):
            await stranger.operational.get_event(everything[0].id)
    await sdk.operational.delete_endpoint(endpoint_id)
    with pytest.raises(NotFoundError):
        await sdk.operational.get_endpoint(endpoint_id)

    def blocking() -> tuple:
        with Client(base_url, account[1], retries=0) as client:
            return client.account(), [event.type for event in client.operational.iterate_events()]

    own, types = await asyncio.to_thread(blocking)
    assert own.low_balance_threshold == 50 and types == ["topup.applied"] * 4
