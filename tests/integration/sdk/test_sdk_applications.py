"""The SDK's applications against the real API, async and blocking: create, page, read by id and
uid, update, send to one application, its endpoints and usage, delete; errors typed."""

from __future__ import annotations

import asyncio

import pytest

from delivery.client import (
    Application,
    ApplicationUsage,
    Client,
    ConflictError,
    EventType,
    NotFoundError,
    ValidationError,
)


async def test_applications_through_the_async_client(sdk, account):
    """Every application call, as an app uses them to serve its customers."""
    created, _ = account
    app = await sdk.applications.create("Globex", uid="customer-1", metadata={"plan": "pro"})
    assert isinstance(app, Application) and (app.uid, app.metadata, app.is_default) == ("customer-1", {"plan": "pro"}, False)
    assert await sdk.applications.get("customer-1") == app
    second = await sdk.applications.create("Initech")
    page = await sdk.applications.list(limit=2)
    assert [a.id for a in page.data] == [created.account.id, app.id] and page.next_cursor == str(app.id)
    assert [a.id async for a in sdk.applications.iterate(page_size=1)] == [created.account.id, app.id, second.id]
    updated = await sdk.applications.update("customer-1", name="Globex Corp", rate_limit_per_second=10)
    assert (updated.name, updated.rate_limit_per_second, updated.uid) == ("Globex Corp", 10, "customer-1")

    endpoint = await sdk.applications.create_endpoint("customer-1", "https://example.com/globex")
    assert endpoint.application_id == app.id
    await sdk.endpoints.create("https://example.com/default")
    assert [e.id for e in await sdk.applications.list_endpoints(app.id)] == [endpoint.id]
    message = await sdk.applications.send("customer-1", "invoice.paid", {"n": 1})
    assert [d.endpoint_id for d in message.deliveries] == [endpoint.id] and message.total_charged == 2
    usage = await sdk.applications.usage("customer-1")
    assert isinstance(usage, ApplicationUsage) and (usage.charges, usage.charged, usage.net) == (1, 2, 2)
    assert (await sdk.applications.usage(second.id)).net == 0

    with pytest.raises(ValidationError):
        await sdk.applications.create("", uid="x")
    with pytest.raises(ConflictError):
        await sdk.applications.create("again", uid="customer-1")
    with pytest.raises(ConflictError):
        await sdk.applications.delete(created.account.id)
    link = await sdk.applications.portal_link("customer-1")
    assert "/portal/sign-in?token=" in link.url and link.expires_at is not None
    deleted = await sdk.applications.delete("customer-1")
    assert (deleted.deleted, deleted.endpoints_deleted) == (True, 1)
    with pytest.raises(NotFoundError):
        await sdk.applications.send("customer-1", "invoice.paid", {})


async def test_applications_through_the_blocking_client(base_url, account):
    """The blocking client has the same calls (run in a thread, beside the server's loop)."""
    _, key = account

    def use() -> tuple:
        with Client(base_url, key, retries=0) as client:
            app = client.applications.create("Blocking", uid="b-1")
            client.applications.create_endpoint("b-1", "https://example.com/b")
            message = client.applications.send("b-1", "a.b", [1, 2])
            return app, [a.uid for a in client.applications.iterate()], message, client.applications.usage(app.id)

    app, uids, message, usage = await asyncio.to_thread(use)
    assert uids == [None, "b-1"] and len(message.deliveries) == 1 and usage.charges == 1 and app.uid == "b-1"


async def test_event_catalog_and_channels_through_the_async_client(sdk):
    """Event types (create, page, read, update, archive) and a send with channels, typed; a payload
    failing its type's schema raises ValidationError naming the path."""
    created = await sdk.event_types.create("invoice.paid", description="Paid",
                                           schema={"type": "object", "required": ["amount"]})
    assert isinstance(created, EventType) and created.schema == {"type": "object", "required": ["amount"]}
    assert [e.name for e in (await sdk.event_types.list()).data] == ["invoice.paid"]
    with pytest.raises(ValidationError) as refused:
        await sdk.send("invoice.paid", {"n": 1})
    assert [error.field for error in refused.value.errors] == ["payload"]
    updated = await sdk.event_types.update("invoice.paid", schema=None, description="Paid in full")
    assert (updated.schema, updated.description) == (None, "Paid in full")
    assert (await sdk.event_types.update("invoice.paid", archived=True)).archived
    assert (await sdk.event_types.list()).data == () and len((await sdk.event_types.list(include_archived=True)).data) == 1
    unfiltered = await sdk.endpoints.create("https://example.com/all")
    message = await sdk.send("user.created", {}, channels=["us"])
    assert [d.endpoint_id for d in message.deliveries] == [unfiltered.id]
