"""The SDK's retention calls against a respx-mocked API: expunge, the account's own retention, and the
operator's. Each test says what goes on the wire and what comes back, in both clients."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
import respx

from delivery.client import ConflictError, MessageErased, NotFoundError, ServerError, ValidationError
from sdk_unit_helpers import BASE_URL, PROBLEM, problem

MESSAGE_ID = "0190c2f4-0000-7000-8000-00000000f001"
ERASED = {"id": MESSAGE_ID, "event_type": "invoice.paid", "payload_erased_at": "2026-01-02T03:04:05Z",
          "payload_erased_by": "api_key:0190c2f4-0000-7000-8000-0000000000a1"}
ACCOUNT = {"id": "0190c2f4-0000-7000-8000-0000000000c1", "name": "acme", "status": "active", "balance": 7,
           "price_per_delivery": 1, "payload_retention_days": 7}
NEW_KEY = {"id": "0190c2f4-0000-7000-8000-0000000000a1", "key": "hl_live_new", "prefix": "hl_live_ne",
           "created_at": "2026-01-01T00:00:00Z"}


@respx.mock(base_url=BASE_URL)
def test_expunge_posts_no_body_and_reads_the_erasure(respx_mock, client):
    route = respx_mock.post(f"/v1/messages/{MESSAGE_ID}/expunge").respond(200, json=ERASED)
    erased = client.messages.expunge(uuid.UUID(MESSAGE_ID))
    assert isinstance(erased, MessageErased)
    assert str(erased.id) == MESSAGE_ID and erased.payload_erased_by == ERASED["payload_erased_by"]
    assert erased.payload_erased_at.year == 2026 and erased.payload_erased_at.tzinfo is not None
    assert route.call_count == 1 and route.calls[0].request.content == b""


@respx.mock(base_url=BASE_URL)
def test_expunge_of_a_live_message_raises_conflict_with_when_to_ask_again_and_is_not_retried(respx_mock, client,
                                                                                              sleeps):
    """409 message-live is an answer about the message, not a failure of the call: raised at once, with
    the Retry-After the API gave, never slept on by the SDK."""
    route = respx_mock.post("/v1/messages/m/expunge").respond(
        409, json=problem(409, "message-live", "1 deliveries of the message are still pending or sending"),
        headers={"Content-Type": PROBLEM, "Retry-After": "42"})
    with pytest.raises(ConflictError) as raised:
        client.messages.expunge("m")
    assert raised.value.slug == "message-live" and raised.value.retry_after_seconds == 42.0
    assert route.call_count == 1 and sleeps == []


@respx.mock(base_url=BASE_URL)
def test_expunge_is_retried_after_a_5xx_since_a_repeat_answers_the_same(respx_mock, client, sleeps):
    route = respx_mock.post("/v1/messages/m/expunge").mock(side_effect=[
        httpx.Response(500, json=problem(500, "internal"), headers={"Content-Type": PROBLEM}),
        httpx.ReadTimeout("slow"), httpx.Response(200, json=ERASED)])
    assert client.messages.expunge("m").event_type == "invoice.paid"
    assert route.call_count == 3 and sleeps == [0.5, 1.0]


@respx.mock(base_url=BASE_URL)
def test_expunge_of_an_unknown_id_raises_not_found_and_the_id_is_quoted_in_the_path(respx_mock, client):
    route = respx_mock.post("/v1/messages/a%2Fb/expunge").respond(
        404, json=problem(404, "not-found", "no such message"), headers={"Content-Type": PROBLEM})
    with pytest.raises(NotFoundError):
        client.messages.expunge("a/b")
    assert route.call_count == 1


@respx.mock(base_url=BASE_URL)
def test_the_account_reads_and_sets_its_own_retention(respx_mock, client):
    read = respx_mock.get("/v1/account").respond(200, json=ACCOUNT)
    patch = respx_mock.patch("/v1/account").respond(200, json={**ACCOUNT, "payload_retention_days": 90})
    assert client.account().payload_retention_days == 7
    assert client.update_account(payload_retention_days=90).payload_retention_days == 90
    assert read.call_count == 1 and json.loads(patch.calls[0].request.content) == {"payload_retention_days": 90}


@respx.mock(base_url=BASE_URL)
def test_a_refused_retention_raises_validation_error_naming_the_field(respx_mock, client, sleeps):
    respx_mock.patch("/v1/account").respond(
        422, json=problem(422, "validation", "invalid", errors=[
            {"field": "payload_retention_days", "message": "Expected `int` >= 1"}]),
        headers={"Content-Type": PROBLEM})
    with pytest.raises(ValidationError) as raised:
        client.update_account(payload_retention_days=0)
    assert [error.field for error in raised.value.errors] == ["payload_retention_days"] and sleeps == []


@respx.mock(base_url=BASE_URL)
def test_the_operator_sets_retention_on_create_and_by_patch(respx_mock, client):
    create = respx_mock.post("/v1/accounts").respond(201, json={"account": ACCOUNT, "api_key": NEW_KEY})
    patch = respx_mock.patch(f"/v1/accounts/{ACCOUNT['id']}").respond(200, json=ACCOUNT)
    created = client.accounts.create("acme", payload_retention_days=7)
    assert created.account.payload_retention_days == 7
    client.accounts.create("acme")
    bodies = [json.loads(call.request.content) for call in create.calls]
    assert bodies == [{"name": "acme", "payload_retention_days": 7}, {"name": "acme"}]
    assert client.accounts.update(ACCOUNT["id"], payload_retention_days=7).payload_retention_days == 7
    assert json.loads(patch.calls[0].request.content) == {"payload_retention_days": 7}


@respx.mock(base_url=BASE_URL)
def test_an_account_from_an_api_that_does_not_say_its_retention_reads_as_none(respx_mock, client):
    respx_mock.get("/v1/account").respond(200, json={key: value for key, value in ACCOUNT.items()
                                                     if key != "payload_retention_days"})
    assert client.account().payload_retention_days is None


@respx.mock(base_url=BASE_URL)
async def test_the_async_client_has_the_same_calls(respx_mock, async_client, async_sleeps):
    expunge = respx_mock.post(f"/v1/messages/{MESSAGE_ID}/expunge").mock(side_effect=[
        httpx.Response(503, json=problem(503, "overloaded"), headers={"Content-Type": PROBLEM, "Retry-After": "2"}),
        httpx.Response(200, json=ERASED)])
    respx_mock.get("/v1/account").respond(200, json=ACCOUNT)
    patch = respx_mock.patch("/v1/account").respond(200, json={**ACCOUNT, "payload_retention_days": 1})
    operator_patch = respx_mock.patch("/v1/accounts/a").respond(200, json=ACCOUNT)
    assert (await async_client.messages.expunge(MESSAGE_ID)).payload_erased_by.startswith("api_key:")
    assert expunge.call_count == 2 and async_sleeps == [2.0]
    assert (await async_client.account()).balance == 7
    assert (await async_client.update_account(payload_retention_days=1)).payload_retention_days == 1
    assert json.loads(patch.calls[0].request.content) == {"payload_retention_days": 1}
    await async_client.accounts.update("a", payload_retention_days=3650)
    assert json.loads(operator_patch.calls[0].request.content) == {"payload_retention_days": 3650}
    respx_mock.post("/v1/messages/gone/expunge").respond(500, json=problem(500, "internal"),
                                                          headers={"Content-Type": PROBLEM})
    with pytest.raises(ServerError):
        await async_client.messages.expunge("gone")
