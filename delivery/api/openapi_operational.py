"""The OpenAPI document's part for operational webhooks: examples of the bodies of
delivery.api.routes_operational, and the `webhooks` section: one entry per operational event
type, with the payload each carries (`{"type", "timestamp", "data"}`) and an example of it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import msgspec

from delivery.api import routes_operational as operational

_ENDPOINT = "0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d02"
_OPERATIONAL_ENDPOINT = uuid.UUID("0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d11")
_EVENT = uuid.UUID("0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d12")
_AT = datetime(2026, 1, 31, 12, 0, 0, tzinfo=UTC)
_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
_URL = "https://ops.example.com/hookledger"

# The data of each event type, as the outbox writes it (billing.operational_outbox).
EVENT_DATA: dict[str, dict] = {
    "endpoint.disabled": {"endpoint_id": _ENDPOINT, "url": "https://hooks.example.com/hookledger", "reason": "gone",
                          "detail": "the endpoint answered 410 Gone", "refunds": {"deliveries": 12, "amount": 12}},
    "endpoint.enabled": {"endpoint_id": _ENDPOINT, "url": "https://hooks.example.com/hookledger"},
    "endpoint.failing": {"endpoint_id": _ENDPOINT, "failures": 9, "first_failure_at": "2026-01-29T08:00:00+00:00",
                         "last_failure_at": "2026-01-31T12:00:00+00:00",
                         "detail": "every attempt failed from 2026-01-29T08:00:00+00:00 to 2026-01-31T12:00:00+00:00"
                                   " (9 failures over 2.2 days)"},
    "delivery.dead": {"endpoint_id": _ENDPOINT, "deliveries": [
        {"delivery_id": "0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d05", "message_id": "0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d03",
         "reason": "out_of_retries", "attempts": 8, "last_status_code": 503, "refund_amount": 1}]},
    "delivery.recovered": {"delivery_id": "0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d05", "endpoint_id": _ENDPOINT,
                           "message_id": "0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d03", "reclaimed_amount": 1,
                           "balance": 9_997},
    "balance.low": {"balance": 99, "threshold": 100},
    "balance.exhausted": {"balance": 0, "price_per_delivery": 1},
    "topup.applied": {"order_id": "order-1042", "amount": 10_000, "balance": 10_099},
    "topup.reversed": {"order_id": "order-1042", "amount": -10_000, "balance": 99},
}
EVENT_DESCRIPTIONS = {
    "endpoint.disabled": "An endpoint was switched off: reason gone (it answered 410), failing (it failed too long),"
                         " account (by you) or operator; refunds: its live deliveries, refunded as they come due",
    "endpoint.enabled": "An endpoint was switched on again",
    "endpoint.failing": "An endpoint's failure streak passed half of what disables it (once per streak)",
    "delivery.dead": "Deliveries to one endpoint died and were refunded: one event carries up to 100 of them",
    "delivery.recovered": "A late 2xx arrived for a dead, refunded delivery: it is delivered and its refund taken back",
    "balance.low": "The balance fell below low_balance_threshold (once per crossing; a top-up above it re-arms it)",
    "balance.exhausted": "A message was refused for its balance (402): the first refusal since a message was accepted",
    "topup.applied": "Credits were added (amount) for an order",
    "topup.reversed": "A top-up was taken back (amount is negative)",
}

_ENDPOINT_BODY = operational.OperationalEndpoint(_OPERATIONAL_ENDPOINT, _URL, "Ops alerts",
                                                 ["endpoint.disabled", "balance.low"], True, None, _AT, _AT)
_EVENT_BODY = operational.OperationalEvent(_EVENT, 42, "balance.low", _AT, EVENT_DATA["balance.low"])
_INSTANCES = (
    operational.OperationalEndpointCreate(url=_URL, description="Ops alerts",
                                          event_types=["endpoint.disabled", "balance.low"]),
    operational.OperationalEndpointPatch(enabled=False),
    _ENDPOINT_BODY,
    operational.OperationalEndpointCreated(_ENDPOINT_BODY, _SECRET),
    operational.OperationalEndpointList([_ENDPOINT_BODY]),
    operational.OperationalSecret(_SECRET),
    _EVENT_BODY,
    operational.OperationalEventPage([_EVENT_BODY], "42"),
)
EXAMPLES: dict[str, object] = {type(instance).__name__: msgspec.json.decode(msgspec.json.encode(instance))
                               for instance in _INSTANCES}

_SIGNED_HEADERS = [
    {"name": "webhook-id", "in": "header", "required": True, "description": "The event's id: deduplicate on it.",
     "schema": {"type": "string", "format": "uuid"}},
    {"name": "webhook-timestamp", "in": "header", "required": True, "description": "Unix seconds when it was sent.",
     "schema": {"type": "string", "pattern": "^[0-9]+$"}},
    {"name": "webhook-signature", "in": "header", "required": True,
     "description": "v1,<base64 HMAC-SHA256> of {webhook-id}.{webhook-timestamp}.{body} with the operational"
                    " endpoint's whsec_ secret (Standard Webhooks).", "schema": {"type": "string"}},
]


def webhooks() -> dict:
    """The `webhooks` section: what hookledger sends to an operational endpoint, one entry per event type."""
    section = {}
    for event_type, data in EVENT_DATA.items():
        example = {"type": event_type, "timestamp": "2026-01-31T12:00:00+00:00", "data": data}
        schema = {"type": "object", "required": ["type", "timestamp", "data"], "properties": {
            "type": {"const": event_type}, "timestamp": {"type": "string", "format": "date-time"},
            "data": {"type": "object"}}}
        section[event_type] = {"post": {
            "operationId": "receive" + "".join(part.capitalize() for part in event_type.replace(".", "_").split("_")),
            "tags": ["Operational webhooks"], "summary": event_type, "description": EVENT_DESCRIPTIONS[event_type] + ".",
            "parameters": _SIGNED_HEADERS,
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema, "example": example}}},
            "responses": {"2XX": {"description": "Received; any other answer is retried on the schedule"}},
        }}
    return section
