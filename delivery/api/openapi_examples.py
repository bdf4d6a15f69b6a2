"""One example of every body in the OpenAPI document, built as the Structs themselves.

Each example is a real instance of the Struct its schema comes from, encoded the way the API
encodes it, so an example cannot drift from what the decoder accepts or the encoder writes
(tests/unit/delivery/test_openapi_examples.py decodes every request example and checks every
example against its schema).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import msgspec

from delivery.api import (openapi_operational, responses as r, routes_applications, routes_event_types,
                          routes_recover as recover, validation as v)
from delivery.api.problems import TYPE_BASE, FieldError, ProblemBody, response, Problem

_ACCOUNT = uuid.UUID("0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d01")
_ENDPOINT = uuid.UUID("0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d02")
_MESSAGE = uuid.UUID("0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d03")
_DELIVERY = uuid.UUID("0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d04")
_DEAD = uuid.UUID("0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d05")
_KEY = uuid.UUID("0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d06")
_JOB = uuid.UUID("0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d07")
_AT = datetime(2026, 1, 31, 12, 0, 0, tzinfo=UTC)
_LATER = datetime(2026, 1, 31, 12, 0, 1, 250000, tzinfo=UTC)
_PUBLIC_KEY = "whpk_Lbp3Xl3Wc+9KDSTuy1PPv7DNnTC7Ni2vQ9gCbqDTYfU="
_HEADERS = {"X-Tenant": "acme-eu"}

_ACCOUNT_BODY = r.Account(id=_ACCOUNT, name="Acme", status="active", balance=9_998, price_per_delivery=1,
                          payload_retention_days=30, low_balance_threshold=None,
                          portal_frame_ancestors=["https://app.acme.example"])
_KEY_CREATED = r.ApiKeyCreated(id=_KEY, prefix="hl_live_3kQ9", created_at=_AT,
                               key="hl_live_3kQ9Zb7xW2mN5pR8sT1vY4aC6dE0fG")
_ENDPOINT_BODY = r.Endpoint(id=_ENDPOINT, url="https://hooks.example.com/hookledger", description="Orders",
                            event_types=["invoice.paid", "invoice.failed"], enabled=True, disabled_reason=None,
                            timeout_ms=15_000, created_at=_AT, updated_at=_AT, signing_key_type="hmac",
                            headers=_HEADERS, rate_limit_per_second=50, application_id=_ACCOUNT)
_DELIVERY_BODY = r.Delivery(id=_DELIVERY, account_id=_ACCOUNT, message_id=_MESSAGE, endpoint_id=_ENDPOINT,
                            event_type="invoice.paid", state="delivered", attempt=1, attempts_max=8, price=1,
                            next_attempt_at=_AT, dead_reason=None, created_at=_AT, finished_at=_LATER,
                            replay_of=None, webhook_id=_DELIVERY)
_CHARGE = r.LedgerEntry(id=f"charge:{_DELIVERY}", seq=41, kind="charge", amount=-1, delivery_id=_DELIVERY, note=None,
                        created_at=_AT)
_RECOVERED = recover.RecoveredDelivery(dead_delivery_id=_DEAD, delivery_id=_DELIVERY)

_INSTANCES: tuple[msgspec.Struct, ...] = (
    v.AccountCreate(name="Acme", price_per_delivery=1, payload_retention_days=30),
    v.AccountPatch(payload_retention_days=90, low_balance_threshold=100,
                   portal_frame_ancestors=["https://app.acme.example"]),
    r.MessageErased(id=_MESSAGE, event_type="invoice.paid", payload_erased_at=_LATER,
                    payload_erased_by=f"api_key:{_KEY}"),
    v.TopupCreate(order_id="order-2026-0131", amount=10_000),
    v.EndpointCreate(url="https://hooks.example.com/hookledger", description="Orders",
                     event_types=["invoice.paid", "invoice.failed"], timeout_ms=15_000, headers=_HEADERS),
    v.EndpointPatch(enabled=False),
    v.SecretRotate(signing_key_type="ed25519"),
    v.MessageCreate(event_type="invoice.paid", payload=msgspec.Raw(b'{"invoice_id":"in_1042","amount_cents":4900}')),
    v.Empty(),
    recover.RecoverCreate(since=_AT, confirm_total=3),
    _ACCOUNT_BODY,
    _KEY_CREATED,
    r.AccountCreated(account=_ACCOUNT_BODY, api_key=_KEY_CREATED),
    r.ApiKey(id=_KEY, prefix="hl_live_3kQ9", created_at=_AT, revoked_at=None),
    r.ApiKeyList(data=[r.ApiKey(id=_KEY, prefix="hl_live_3kQ9", created_at=_AT, revoked_at=None)]),
    r.Topup(order_id="order-2026-0131", entry_id="topup:order-2026-0131", amount=10_000, balance=19_998, applied=True),
    r.Balance(balance=9_998, in_flight=2),
    _CHARGE,
    r.LedgerPage(data=[_CHARGE], next_cursor="41"),
    _ENDPOINT_BODY,
    r.EndpointList(data=[_ENDPOINT_BODY]),
    r.EndpointSecret(secret=_PUBLIC_KEY, signing_key_type="ed25519"),
    r.EndpointDeleted(id=_ENDPOINT, deleted=True, refunded_now=2),
    r.CreatedDelivery(id=_DELIVERY, endpoint_id=_ENDPOINT, price=1),
    r.MessageAccepted(id=_MESSAGE, event_type="invoice.paid",
                      deliveries=[r.CreatedDelivery(id=_DELIVERY, endpoint_id=_ENDPOINT, price=1)], total_charged=1),
    _DELIVERY_BODY,
    r.Attempt(attempt=1, started_at=_AT, finished_at=_LATER, status_code=200, latency_ms=1250, error=None,
              response_excerpt="ok", stale=False, sent_headers=_HEADERS),
    r.DeliveryDetail(**msgspec.structs.asdict(_DELIVERY_BODY),
                     attempts=[r.Attempt(attempt=1, started_at=_AT, finished_at=_LATER, status_code=200,
                                         latency_ms=1250, error=None, response_excerpt="ok", stale=False,
                                         sent_headers=_HEADERS)],
                     ledger_entries=[_CHARGE], endpoint_headers=_HEADERS, payload_erased_at=None),
    r.DeliveryPage(data=[_DELIVERY_BODY], next_cursor=str(_DELIVERY)),
    r.Health(status="ok"),
    r.Readiness(status="ready", postgres=True, redis=True),
    r.AccountDeletion(id=_JOB, account_id=_ACCOUNT, status="done", step="closed_out",
                      report={"locked": 3, "refunds_inserted": 3, "marked_dead": 3, "owed_to_customer": 9_995}),
    recover.RecoverPlan(endpoint_id=_ENDPOINT, endpoint_enabled=True, since=_AT, until=_LATER, count=1,
                        total_charge=1, more=False, dead_delivery_ids=[_DEAD]),
    _RECOVERED,
    recover.RecoverRefusal(dead_delivery_id=_DEAD, reason="endpoint_deleted"),
    recover.Recovered(endpoint_id=_ENDPOINT, since=_AT, until=_LATER, replayed_count=1, replayed=[_RECOVERED],
                      already_replayed_count=0, already_replayed=[], refused_count=0, refused=[], total_charged=1,
                      more=False),
    FieldError(field="event_type", message="must be 1 to 200 letters, digits, or . _ : -"),
    ProblemBody(type=TYPE_BASE + "invalid-request", title="Unprocessable request", status=422,
                detail="the request is invalid",
                errors=[FieldError(field="event_type", message="must be 1 to 200 letters, digits, or . _ : -")]),
)

# Schema name (the Struct's name) -> its example as JSON-ready builtins.
EXAMPLES: dict[str, object] = {**{type(instance).__name__: msgspec.json.decode(msgspec.json.encode(instance))
                                  for instance in _INSTANCES}, **openapi_operational.EXAMPLES}
EXAMPLES.update(routes_applications.EXAMPLES)
EXAMPLES.update(routes_event_types.EXAMPLES)


# A typical problem of each error status, as the API writes it.
_PROBLEMS = {
    400: Problem(400, "the body is not valid JSON: input data was truncated", "malformed-json"),
    401: Problem(401, "missing API key: send Authorization: Bearer <key>", "unauthorized"),
    402: Problem(402, "the balance (1) cannot cover 2 deliveries at 1 credit each", "insufficient-balance"),
    403: Problem(403, "this route is for the operator", "forbidden"),
    404: Problem(404, "no such endpoint", "not-found"),
    409: Problem(409, "a request with this Idempotency-Key is still in progress; retry shortly", "idempotency-key-in-use"),
    413: Problem(413, "the payload is larger than 262144 bytes", "payload-too-large"),
    415: Problem(415, "the body must be JSON, sent with Content-Type: application/json; got 'text/plain'",
                 "unsupported-media-type"),
    422: Problem(422, "the request is invalid", "invalid-request",
                 [FieldError(field="event_type", message="must be 1 to 200 letters, digits, or . _ : -")]),
    503: Problem(503, "too many requests are waiting to be written; retry shortly", "overloaded"),
}


def problem(status: int) -> object:
    """An example problem+json body for an error status, encoded as the API encodes it."""
    return msgspec.json.decode(response(_PROBLEMS[status]).body)
