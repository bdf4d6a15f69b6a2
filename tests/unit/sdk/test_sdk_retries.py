"""Retries: what is retried, how often, how long the client waits, and that a retried send charges once."""

from __future__ import annotations

import json

import httpx
import pytest
import respx
from sdk_unit_helpers import PROBLEM, problem

from delivery.client import (
    APIConnectionError,
    ConflictError,
    NotFoundError,
    PaymentRequiredError,
    ServerError,
    ValidationError,
)

ACCEPTED = {"id": "0190c2f4-0000-7000-8000-000000000001", "event_type": "invoice.paid", "total_charged": 2,
            "deliveries": [{"id": "0190c2f4-0000-7000-8000-0000000000d1",
                            "endpoint_id": "0190c2f4-0000-7000-8000-0000000000e1", "price": 2}]}
TOPUP = {"order_id": "o-1", "entry_id": "topup:o-1", "amount": 5, "balance": 5, "applied": True}
BALANCE = {"balance": 7, "in_flight": 1}


def _unavailable() -> httpx.Response:
    return httpx.Response(503, json=problem(503, "overloaded"), headers={"Content-Type": PROBLEM})


@respx.mock(base_url="http://hookledger.test")
def test_send_retried_after_503_reuses_one_generated_idempotency_key(respx_mock, client, sleeps):
    """Two 503s then 202: three requests with the same generated key and body, backoff between them."""
    route = respx_mock.post("/v1/messages").mock(side_effect=[_unavailable(), _unavailable(),
                                                              httpx.Response(202, json=ACCEPTED)])
    message = client.send("invoice.paid", {"invoice": "in_1"})
    keys = [call.request.headers["Idempotency-Key"] for call in route.calls]
    assert len(keys) == 3 and len(set(keys)) == 1 and len(keys[0]) >= 32
    assert {call.request.content for call in route.calls} == {b'{"event_type":"invoice.paid","payload":{"invoice":"in_1"}}'}
    assert sleeps == [0.5, 1.0]
    assert message.idempotency_key == keys[0]
    assert message.total_charged == 2 and message.deliveries[0].price == 2 and not message.replayed


@respx.mock(base_url="http://hookledger.test")
def test_each_logical_send_gets_its_own_key_and_a_given_key_is_used_as_is(respx_mock, client):
    route = respx_mock.post("/v1/messages").respond(202, json=ACCEPTED, headers={"Idempotent-Replayed": "true"})
    client.send("invoice.paid", {})
    client.send("invoice.paid", {})
    message = client.send("invoice.paid", {}, idempotency_key="order-42")
    keys = [call.request.headers["Idempotency-Key"] for call in route.calls]
    assert keys[0] != keys[1] and keys[2] == "order-42"
    assert message.replayed and message.idempotency_key == "order-42"


@respx.mock(base_url="http://hookledger.test")
def test_connection_errors_are_retried_then_succeed(respx_mock, client, sleeps):
    """A refused connection (nothing sent) is retried even for a create; a read timeout only when harmless."""
    route = respx_mock.get("/v1/balance").mock(side_effect=[httpx.ConnectError("refused"),
                                                            httpx.ReadTimeout("slow"), httpx.Response(200, json=BALANCE)])
    assert client.balance().balance == 7
    assert route.call_count == 3 and sleeps == [0.5, 1.0]

    created = {"id": "0190c2f4-0000-7000-8000-0000000000e1", "url": "https://example.com/h", "description": "",
               "event_types": None, "enabled": True, "disabled_reason": None, "timeout_ms": 15000,
               "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"}
    create = respx_mock.post("/v1/endpoints").mock(side_effect=[httpx.ConnectError("refused"),
                                                                httpx.Response(201, json=created)])
    assert client.endpoints.create("https://example.com/h").url == "https://example.com/h"
    assert create.call_count == 2


@respx.mock(base_url="http://hookledger.test")
def test_connection_errors_give_up_after_the_retry_budget(respx_mock, client, sleeps):
    route = respx_mock.get("/v1/balance").mock(side_effect=httpx.ConnectError("refused"))
    with pytest.raises(APIConnectionError) as raised:
        client.balance()
    assert route.call_count == 4  # one attempt and three retries
    assert sleeps == [0.5, 1.0, 2.0]
    assert isinstance(raised.value.__cause__, httpx.ConnectError)


@pytest.mark.parametrize(("status", "slug", "kind"), [
    (400, "malformed-json", ValidationError),
    (402, "insufficient-balance", PaymentRequiredError),
    (404, "not-found", NotFoundError),
    (409, "topup-conflict", ConflictError),
    (422, "idempotency-key-reused", ValidationError),
])
@respx.mock(base_url="http://hookledger.test")
def test_4xx_is_never_retried(respx_mock, client, sleeps, status, slug, kind):
    route = respx_mock.post("/v1/accounts/0190c2f4-0000-7000-8000-00000000000a/topups").respond(
        status, json=problem(status, slug), headers={"Content-Type": PROBLEM})
    with pytest.raises(kind):
        client.accounts.top_up("0190c2f4-0000-7000-8000-00000000000a", "o-1", 5)
    assert route.call_count == 1 and sleeps == []


@respx.mock(base_url="http://hookledger.test")
def test_retry_after_is_honoured_on_429_and_503(respx_mock, client, sleeps):
    """The API's Retry-After replaces the backoff: seconds as given, an HTTP date in the past as 0."""
    route = respx_mock.post("/v1/accounts/a/topups").mock(side_effect=[
        httpx.Response(429, json=problem(429, "rate-limited"), headers={"Retry-After": "7"}),
        httpx.Response(503, json=problem(503, "overloaded"), headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}),
        httpx.Response(201, json=TOPUP),
    ])
    assert client.accounts.top_up("a", "o-1", 5).applied
    assert route.call_count == 3 and sleeps == [7.0, 0.0]


@respx.mock(base_url="http://hookledger.test")
def test_a_retry_after_past_the_bound_raises_instead_of_blocking(respx_mock, client, sleeps):
    respx_mock.get("/v1/balance").respond(503, json=problem(503, "overloaded"), headers={"Retry-After": "3600"})
    with pytest.raises(ServerError) as raised:
        client.balance()
    assert raised.value.retry_after_seconds == 3600.0 and sleeps == []


@respx.mock(base_url="http://hookledger.test")
def test_409_key_in_progress_is_retried_with_the_same_key(respx_mock, client, sleeps):
    """The first request with this key is still in flight elsewhere: wait Retry-After, ask again, same key."""
    in_use = httpx.Response(409, json=problem(409, "idempotency-key-in-use"), headers={"Retry-After": "1"})
    route = respx_mock.post("/v1/messages").mock(side_effect=[in_use, httpx.Response(202, json=ACCEPTED,
                                                                                      headers={"Idempotent-Replayed": "true"})])
    message = client.send("invoice.paid", {"n": 1}, idempotency_key="k-1")
    assert [call.request.headers["Idempotency-Key"] for call in route.calls] == ["k-1", "k-1"]
    assert sleeps == [1.0] and message.replayed


ENDPOINT = {"id": "0190c2f4-0000-7000-8000-0000000000e1", "url": "https://example.com/h", "description": "",
            "event_types": None, "enabled": True, "disabled_reason": None, "timeout_ms": 15000,
            "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"}
NEW_KEY = {"id": "0190c2f4-0000-7000-8000-0000000000a1", "key": "hl_live_new", "prefix": "hl_live_ne",
           "created_at": "2026-01-01T00:00:00Z"}
ACCOUNT_CREATED = {"account": {"id": "0190c2f4-0000-7000-8000-0000000000c1", "name": "acme", "status": "active",
                               "price_per_delivery": 1, "balance": 0, "created_at": "2026-01-01T00:00:00Z"},
                   "api_key": NEW_KEY}


@pytest.mark.parametrize("method, path, create, answer", [
    ("post", "/v1/accounts", lambda c: c.accounts.create("acme"), ACCOUNT_CREATED),
    ("post", "/v1/accounts/a/api-keys", lambda c: c.accounts.create_api_key("a"), NEW_KEY),
    ("post", "/v1/api-keys", lambda c: c.api_keys.create(), NEW_KEY),
    ("post", "/v1/endpoints", lambda c: c.endpoints.create("https://example.com/h"), ENDPOINT),
    ("post", "/v1/endpoints/e/secret/rotate", lambda c: c.endpoints.rotate_secret("e"), {"secret": "whsec_x"}),
])
@respx.mock(base_url="http://hookledger.test")
def test_a_create_that_may_have_happened_is_retried_with_its_key(respx_mock, client, sleeps, method, path, create,
                                                                answer):
    """A read timeout and a 500 may each have created the thing: every create carries a generated
    Idempotency-Key, so its retries with that key answer the first create instead of a second one."""
    route = getattr(respx_mock, method)(path).mock(side_effect=[
        httpx.ReadTimeout("slow"), httpx.Response(500, json=problem(500, "internal"), headers={"Content-Type": PROBLEM}),
        httpx.Response(201, json=answer, headers={"Idempotent-Replayed": "true"})])
    create(client)
    keys = [call.request.headers.get("Idempotency-Key") for call in route.calls]
    assert len(keys) == 3 and keys[0] and len(set(keys)) == 1
    assert sleeps == [0.5, 1.0]


@respx.mock(base_url="http://hookledger.test")
def test_each_create_gets_its_own_key_and_a_given_key_is_used_as_is(respx_mock, client):
    route = respx_mock.post("/v1/endpoints").respond(201, json=ENDPOINT)
    client.endpoints.create("https://example.com/h")
    client.endpoints.create("https://example.com/h")
    client.endpoints.create("https://example.com/h", idempotency_key="endpoint-for-order-42")
    keys = [call.request.headers["Idempotency-Key"] for call in route.calls]
    assert keys[0] != keys[1] and keys[2] == "endpoint-for-order-42"


@respx.mock(base_url="http://hookledger.test")
def test_a_503_is_retried_even_for_a_replay_since_the_api_wrote_nothing(respx_mock, client, sleeps):
    route = respx_mock.post("/v1/deliveries/d/replay").mock(side_effect=[_unavailable(), httpx.Response(202, json=ACCEPTED)])
    assert client.deliveries.replay("d").total_charged == 2
    assert route.call_count == 2


@pytest.mark.parametrize("slug", ["write-outcome-unknown", "database-unavailable"])
@respx.mock(base_url="http://hookledger.test")
def test_a_503_that_may_have_written_is_retried_with_the_same_key_for_a_send_and_a_replay(respx_mock, client, sleeps, slug):
    """After a lost COMMIT the write may exist: a send and a replay are repeated with their key,
    which returns the first one's answer if it was written, so neither charges twice."""
    unknown = httpx.Response(503, json=problem(503, slug), headers={"Content-Type": PROBLEM, "Retry-After": "1"})
    replayed = httpx.Response(202, json=ACCEPTED, headers={"Idempotent-Replayed": "true"})
    replay = respx_mock.post("/v1/deliveries/d/replay").mock(side_effect=[unknown, replayed])
    assert client.deliveries.replay("d").replayed
    send = respx_mock.post("/v1/messages").mock(side_effect=[unknown, replayed])
    assert client.send("invoice.paid", {"n": 1}).replayed
    for route in (replay, send):
        keys = [call.request.headers["Idempotency-Key"] for call in route.calls]
        assert len(keys) == 2 and keys[0] == keys[1]
    assert sleeps == [1.0, 1.0]


@respx.mock(base_url="http://hookledger.test")
def test_requests_carry_the_key_and_json_and_patch_sends_only_given_fields(respx_mock, client):
    route = respx_mock.patch("/v1/endpoints/e").respond(200, json={
        "id": "0190c2f4-0000-7000-8000-0000000000e1", "url": "https://example.com/h", "description": "",
        "event_types": None, "enabled": False, "disabled_reason": None, "timeout_ms": 15000,
        "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z"})
    endpoint = client.endpoints.update("e", enabled=False, event_types=None)
    request = route.calls.last.request
    assert request.headers["Authorization"] == "Bearer hl_live_test"
    assert json.loads(request.content) == {"enabled": False, "event_types": None}
    assert endpoint.enabled is False and endpoint.event_types is None


async def test_async_send_retries_503_with_one_key(async_client, async_sleeps):
    with respx.mock(base_url="http://hookledger.test") as respx_mock:
        route = respx_mock.post("/v1/messages").mock(side_effect=[httpx.ConnectError("refused"), _unavailable(),
                                                                  httpx.Response(202, json=ACCEPTED)])
        message = await async_client.send("invoice.paid", {"n": 1})
    keys = {call.request.headers["Idempotency-Key"] for call in route.calls}
    assert route.call_count == 3 and keys == {message.idempotency_key}
    assert async_sleeps == [0.5, 1.0]


def _in_use() -> httpx.Response:
    return httpx.Response(409, json=problem(409, "idempotency-key-in-use"), headers={"Content-Type": PROBLEM,
                                                                                       "Retry-After": "1"})


@respx.mock(base_url="http://hookledger.test")
def test_a_keyed_create_in_doubt_is_asked_again_past_the_retry_count_until_its_answer_is_known(respx_mock, client,
                                                                                           sleeps):
    """A COMMIT held past the API's outcome wait: 503 write-outcome-unknown, then 409 while the first
    request still holds its key, then the first request's own answer. More answers in doubt than
    `retries` (3): the call goes on within `in_doubt_seconds` and returns the one endpoint made."""
    unknown = httpx.Response(503, json=problem(503, "write-outcome-unknown"), headers={"Content-Type": PROBLEM,
                                                                                        "Retry-After": "1"})
    route = respx_mock.post("/v1/endpoints").mock(side_effect=[
        unknown, _in_use(), _in_use(), _in_use(), _in_use(),
        httpx.Response(201, json=ENDPOINT, headers={"Idempotent-Replayed": "true"})])
    assert client.endpoints.create("https://example.com/h").url == "https://example.com/h"
    keys = {call.request.headers["Idempotency-Key"] for call in route.calls}
    assert route.call_count == 6 and len(keys) == 1 and sleeps == [1.0] * 5


@respx.mock(base_url="http://hookledger.test")
def test_a_create_still_in_doubt_after_its_wait_raises_with_its_key(respx_mock, client, sleeps):
    """Past `in_doubt_seconds` (30) of waiting the error is raised, carrying the generated key: the
    caller asks again with it (and gets the first request's answer) instead of making a second one."""
    route = respx_mock.post("/v1/api-keys").mock(return_value=httpx.Response(
        409, json=problem(409, "idempotency-key-in-use"), headers={"Content-Type": PROBLEM, "Retry-After": "10"}))
    with pytest.raises(ConflictError) as raised:
        client.api_keys.create()
    assert sleeps == [10.0, 10.0, 10.0] and route.call_count == 4
    assert raised.value.idempotency_key == route.calls.last.request.headers["Idempotency-Key"]


@respx.mock(base_url="http://hookledger.test")
def test_failures_not_in_doubt_keep_the_retry_count_and_carry_the_key(respx_mock, client, sleeps):
    """A 500 says nothing of the outcome: `retries` (3) bound it as before; the error and a broken
    connection's carry the call's key too."""
    route = respx_mock.post("/v1/endpoints").respond(500, json=problem(500, "internal"), headers={"Content-Type": PROBLEM})
    with pytest.raises(ServerError) as raised:
        client.endpoints.create("https://example.com/h", idempotency_key="ep-7")
    assert route.call_count == 4 and sleeps == [0.5, 1.0, 2.0] and raised.value.idempotency_key == "ep-7"
    respx_mock.post("/v1/messages").mock(side_effect=httpx.ReadError("reset"))
    with pytest.raises(APIConnectionError) as broken:
        client.send("invoice.paid", {"n": 1}, idempotency_key="send-7")
    assert broken.value.idempotency_key == "send-7"
    respx_mock.get("/v1/balance").respond(500, json=problem(500, "internal"), headers={"Content-Type": PROBLEM})
    with pytest.raises(ServerError) as unkeyed:
        client.balance()
    assert unkeyed.value.idempotency_key is None
