"""Response bodies as msgspec Structs: encoded fast, and the OpenAPI schemas are generated from them."""

from __future__ import annotations

import uuid
from datetime import datetime

import msgspec
from aiohttp import web

from billing.tables import DEAD_REASONS, DELIVERY_STATES
from delivery.store.signing_keys import KeyTypeField
from typing import Annotated, Literal

DeliveryState = Literal[DELIVERY_STATES]  # type: ignore[valid-type]
DeadReason = Literal[DEAD_REASONS]  # type: ignore[valid-type]
CustomHeaders = Annotated[dict[str, str] | None, msgspec.Meta(
    description="The endpoint's custom headers, sent with every request outside the signature; null: none.")]
RateLimitShown = Annotated[int | None, msgspec.Meta(description=(
    "The most requests per second all workers together send to the endpoint; null: no limit."))]
WebhookId = Annotated[uuid.UUID, msgspec.Meta(description=(
    "The webhook-id the delivery is sent under, the receiver's idempotency key: the delivery's own id, or for"
    " a replay that of the delivery it replays (the first of a chain of replays)."))]


class Account(msgspec.Struct):
    id: uuid.UUID
    name: str
    status: str
    balance: int
    price_per_delivery: int
    payload_retention_days: int
    low_balance_threshold: int | None
    portal_frame_ancestors: list[str]


class ApiKey(msgspec.Struct):
    id: uuid.UUID
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


class ApiKeyCreated(msgspec.Struct):
    id: uuid.UUID
    prefix: str
    created_at: datetime
    key: str  # shown once


class ApiKeyList(msgspec.Struct):
    data: list[ApiKey]


class AccountCreated(msgspec.Struct):
    account: Account
    api_key: ApiKeyCreated


class Topup(msgspec.Struct):
    order_id: str
    entry_id: str
    amount: int
    balance: int
    applied: bool  # false: this order was already applied (or reversed) before


class Balance(msgspec.Struct):
    balance: int
    in_flight: int


class LedgerEntry(msgspec.Struct):
    id: str
    seq: int
    kind: str
    amount: int
    delivery_id: uuid.UUID | None
    note: str | None
    created_at: datetime


class LedgerPage(msgspec.Struct):
    data: list[LedgerEntry]
    next_cursor: str | None


class Endpoint(msgspec.Struct):
    id: uuid.UUID
    url: str
    description: str
    event_types: list[str] | None
    enabled: bool
    disabled_reason: str | None
    timeout_ms: int
    created_at: datetime
    updated_at: datetime
    signing_key_type: KeyTypeField
    headers: CustomHeaders
    rate_limit_per_second: RateLimitShown = None
    application_id: Annotated[uuid.UUID | None, msgspec.Meta(description=(
        "The application it belongs to; the account's own id for its default application."))] = None
    channels: Annotated[list[str] | None, msgspec.Meta(description=(
        "It receives only messages with one of these channels; null: every message."))] = None


class EndpointList(msgspec.Struct):
    data: list[Endpoint]


class EndpointSecret(msgspec.Struct):
    secret: Annotated[str, msgspec.Meta(description=(
        "What a receiver verifies with: the whsec_ secret, or for an ed25519 key its whpk_ public key"
        " (the whsk_ private key is never shown)."))]
    signing_key_type: KeyTypeField


class EndpointDeleted(msgspec.Struct):
    id: uuid.UUID
    deleted: bool
    refunded_now: int  # pending deliveries refunded right away; the rest die at the pre-send check


class CreatedDelivery(msgspec.Struct):
    id: uuid.UUID
    endpoint_id: uuid.UUID
    price: int


class MessageAccepted(msgspec.Struct):
    id: uuid.UUID
    event_type: str
    deliveries: list[CreatedDelivery]
    total_charged: int


class Delivery(msgspec.Struct):
    id: uuid.UUID
    account_id: uuid.UUID
    message_id: uuid.UUID
    endpoint_id: uuid.UUID
    event_type: str
    state: DeliveryState
    attempt: int
    attempts_max: int
    price: int
    next_attempt_at: datetime
    dead_reason: DeadReason | None
    created_at: datetime
    finished_at: datetime | None
    # The delivery this one sends again (a replay: POST /v1/deliveries/{id}/replay, a recovery, an
    # operator's replay); null for a delivery of a message sent.
    replay_of: uuid.UUID | None
    webhook_id: WebhookId


class Attempt(msgspec.Struct):
    attempt: int
    started_at: datetime
    finished_at: datetime
    status_code: int | None
    latency_ms: int | None
    error: str | None
    response_excerpt: str | None
    stale: bool
    sent_headers: Annotated[dict[str, str] | None, msgspec.Meta(description=(
        "The endpoint's custom headers this attempt was sent with (null: it had none, or they were erased"
        " with the response excerpt by retention, an expunge or the account's deletion)."))] = None


def attempt_from_row(row) -> Attempt:
    """An Attempt from a delivery_attempts record (sent_headers is jsonb, read as its text)."""
    sent_headers = row["sent_headers"]
    return Attempt(**{name: row[name] for name in Attempt.__struct_fields__ if name != "sent_headers"},
                   sent_headers=None if sent_headers is None else msgspec.json.decode(sent_headers))


class DeliveryDetail(Delivery):
    attempts: list[Attempt]
    ledger_entries: list[LedgerEntry]
    endpoint_headers: Annotated[dict[str, str] | None, msgspec.Meta(description=(
        "The custom headers the endpoint carries now (null: none, or the endpoint is deleted); each attempt"
        " sends the endpoint's headers as they are when it starts, beside the Standard Webhooks headers, and"
        " keeps them (attempts[].sent_headers)."))]
    # When the message's payload and its attempts' response excerpts were erased (an expunge,
    # retention or the account's deletion); null while they are kept.
    payload_erased_at: datetime | None = None


class MessageErased(msgspec.Struct):
    """A message whose payload and response excerpts are erased: when, and by whom (an API key
    `api_key:<id>`, `retention`, or `account_deletion`)."""

    id: uuid.UUID
    event_type: str
    payload_erased_at: datetime
    payload_erased_by: str


class DeliveryPage(msgspec.Struct):
    data: list[Delivery]
    next_cursor: str | None


class Health(msgspec.Struct):
    status: str


class Readiness(msgspec.Struct):
    status: str
    postgres: bool
    redis: bool


class AccountDeletion(msgspec.Struct):
    """An account-deletion job: status running | waiting_repair | done | failed; report as it grows."""

    id: uuid.UUID
    account_id: uuid.UUID
    status: str
    step: str
    report: dict


RESPONSE_BODIES = (
    AccountDeletion, Account, AccountCreated, ApiKeyCreated, ApiKeyList, Topup, Balance, LedgerPage, Endpoint, EndpointList,
    EndpointSecret, EndpointDeleted, MessageAccepted, MessageErased, DeliveryDetail, DeliveryPage, Health, Readiness,
)

_ENCODER = msgspec.json.Encoder()


def json(body: msgspec.Struct, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=_ENCODER.encode(body), status=status, content_type="application/json", headers=headers)


def from_row(kind: type, row) -> msgspec.Struct:
    """A Struct from a database record (or a dataclass) with the Struct's fields."""
    if hasattr(row, "keys"):
        return kind(**{name: row[name] for name in kind.__struct_fields__})
    return kind(**{name: getattr(row, name) for name in kind.__struct_fields__})
