"""Every problem+json the API answers becomes its exception, carrying the fields as they arrived."""

from __future__ import annotations

import pytest
import respx

from delivery.client import (
    AuthenticationError,
    ConflictError,
    FieldError,
    HookledgerError,
    NotFoundError,
    PayloadTooLargeError,
    PaymentRequiredError,
    PermissionDeniedError,
    RateLimitError,
    ResponseDecodeError,
    ServerError,
    ValidationError,
)

from sdk_unit_helpers import BASE_URL, PROBLEM, problem


@pytest.mark.parametrize(
    ("status", "slug", "kind"),
    [
        (400, "malformed-json", ValidationError),
        (401, "unauthorized", AuthenticationError),
        (402, "insufficient-balance", PaymentRequiredError),
        (403, "forbidden", PermissionDeniedError),
        (404, "not-found", NotFoundError),
        (409, "topup-conflict", ConflictError),
        (413, "payload-too-large", PayloadTooLargeError),
        (422, "idempotency-key-reused", ValidationError),
        (418, "teapot", HookledgerError),
    ],
)
@respx.mock(base_url=BASE_URL)
def test_each_status_raises_its_exception_with_the_problem_fields(respx_mock, client, status, slug, kind):
    """A refusal is one exception class per status, with type, title, status, detail and the request id."""
    respx_mock.get("/v1/balance").respond(status, json=problem(status, slug, "the reason"),
                                          headers={"Content-Type": PROBLEM, "X-Request-Id": "req-1"})
    with pytest.raises(kind) as raised:
        client.balance()
    error = raised.value
    assert type(error) is kind
    assert isinstance(error, HookledgerError)
    assert (error.status, error.type, error.title, error.detail) == (
        status, f"https://hookledger.dev/problems/{slug}", "Title", "the reason")
    assert error.slug == slug
    assert error.request_id == "req-1"
    assert error.errors == ()
    assert str(error) == f"{status} Title: the reason"


@respx.mock(base_url=BASE_URL)
def test_validation_errors_list_each_field(respx_mock, client):
    """422 `errors` arrive as FieldError tuples and show in the message."""
    body = problem(422, "invalid-request", "the request is not valid",
                   errors=[{"field": "url", "message": "must be http(s)"}, {"field": "event_types.0", "message": "bad"}])
    respx_mock.post("/v1/endpoints").respond(422, json=body, headers={"Content-Type": PROBLEM})
    with pytest.raises(ValidationError) as raised:
        client.endpoints.create("ftp://x")
    assert raised.value.errors == (FieldError("url", "must be http(s)"), FieldError("event_types.0", "bad"))
    assert "url: must be http(s)" in str(raised.value)


@respx.mock(base_url=BASE_URL)
def test_server_errors_and_rate_limits(respx_mock, client):
    """5xx is ServerError and 429 RateLimitError once retries run out; Retry-After is kept on the error."""
    respx_mock.get("/v1/balance").respond(500, json=problem(500, "internal"), headers={"Content-Type": PROBLEM})
    with pytest.raises(ServerError) as raised:
        client.balance()
    assert raised.value.status == 500
    respx_mock.get("/v1/ledger").respond(429, json=problem(429, "rate-limited"), headers={"Retry-After": "2"})
    with pytest.raises(RateLimitError) as limited:
        client.ledger()
    assert limited.value.retry_after_seconds == 2.0


@respx.mock(base_url=BASE_URL)
def test_a_non_problem_error_body_still_raises_with_what_is_known(respx_mock, client):
    """A proxy's HTML 502 has no problem+json: the status class, the reason phrase and a cut of the text."""
    respx_mock.get("/v1/balance").respond(502, text="<html>bad gateway</html>" + "x" * 2000)
    with pytest.raises(ServerError) as raised:
        client.balance()
    error = raised.value
    assert error.status == 502 and error.title == "Bad Gateway" and error.type == "about:blank"
    assert error.detail.startswith("<html>bad gateway") and len(error.detail) <= 500


@respx.mock(base_url=BASE_URL)
def test_an_unreadable_success_body_is_a_decode_error_not_a_crash(respx_mock, client):
    respx_mock.get("/v1/balance").respond(200, json={"unexpected": True})
    with pytest.raises(ResponseDecodeError) as raised:
        client.balance()
    assert raised.value.status == 200


async def test_the_async_client_raises_the_same_exceptions(async_client):
    """Same table, asyncio: a 402 on send is PaymentRequiredError with its detail."""
    with respx.mock(base_url=BASE_URL) as respx_mock:
        respx_mock.post("/v1/messages").respond(402, json=problem(402, "insufficient-balance", "need 2, have 1"),
                                                headers={"Content-Type": PROBLEM})
        with pytest.raises(PaymentRequiredError) as raised:
            await async_client.send("invoice.paid", {"n": 1})
    assert raised.value.detail == "need 2, have 1"


@pytest.mark.parametrize(("base_url", "api_key"), [("ftp://hookledger.test", "k"), ("hookledger.test", "k"),
                                                   ("http://", "k"), (BASE_URL, ""), (BASE_URL, "bad\nkey")])
def test_a_client_refuses_a_bad_base_url_or_key_before_any_request(base_url, api_key):
    from delivery.client import AsyncClient, Client

    with pytest.raises(ValueError):
        Client(base_url, api_key)
    with pytest.raises(ValueError):
        AsyncClient(base_url, api_key)
