"""What the SDK returns: frozen msgspec Structs mirroring the API's response bodies.

Unknown fields in a response are ignored, so a newer API that adds a field does not break an
older SDK. Money is an integer number of credits. Times are timezone-aware datetimes.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Generic, TypeVar

import msgspec

T = TypeVar("T")


class Account(msgspec.Struct, frozen=True):
    id: uuid.UUID
    name: str
    status: str  # active | closing | deleted
    balance: int
    price_per_delivery: int
    # Days a finished message's payload and its attempts' response excerpts are kept (1 to 3,650);
    # None only from an API that does not say.
    payload_retention_days: int | None = None
    low_balance_threshold: int | None = None  # balance.low below it; None: off (or an API that does not say)
    # https origins that may embed the customer portal in an iframe; None only from an API that does not say.
    portal_frame_ancestors: list[str] | None = None


class MessageErased(msgspec.Struct, frozen=True):
    """A message whose payload and attempts' response excerpts are erased: when, and by whom
    (`api_key:<id>`, `retention` or `account_deletion`); never what."""

    id: uuid.UUID
    event_type: str
    payload_erased_at: datetime
    payload_erased_by: str


class ApiKey(msgspec.Struct, frozen=True):
    id: uuid.UUID
    prefix: str
    created_at: datetime
    revoked_at: datetime | None = None


class NewApiKey(msgspec.Struct, frozen=True):
    """A key just created: `key` is shown this once and never again."""

    id: uuid.UUID
    prefix: str
    created_at: datetime
    key: str


class AccountCreated(msgspec.Struct, frozen=True):
    account: Account
    api_key: NewApiKey


class Topup(msgspec.Struct, frozen=True):
    """A top-up or its reversal. `applied` False: this order was already applied (or reversed) before,
    which is also what a retry of a call whose first answer was lost sees."""

    order_id: str
    entry_id: str
    amount: int
    balance: int
    applied: bool


class Balance(msgspec.Struct, frozen=True):
    balance: int
    in_flight: int  # credits charged for deliveries not yet delivered or refunded


class LedgerEntry(msgspec.Struct, frozen=True):
    id: str  # derived: charge:<delivery>, refund:<delivery>, topup:<order>, ...
    seq: int
    kind: str
    amount: int  # signed credits
    delivery_id: uuid.UUID | None
    note: str | None
    created_at: datetime


class Endpoint(msgspec.Struct, frozen=True):
    id: uuid.UUID
    url: str
    description: str
    event_types: tuple[str, ...] | None  # None: every event type
    enabled: bool
    disabled_reason: str | None
    timeout_ms: int
    created_at: datetime
    updated_at: datetime
    signing_key_type: str = "hmac"  # hmac (a whsec_ secret, v1) | ed25519 (receivers verify v1a with a whpk_ key)
    headers: dict[str, str] | None = None  # custom headers sent with every request, outside the signature
    rate_limit_per_second: int | None = None  # the most requests a second all workers send it; None: no limit
    application_id: uuid.UUID | None = None  # its application; the account's own id for the default one


class EndpointDeleted(msgspec.Struct, frozen=True):
    id: uuid.UUID
    deleted: bool
    refunded_now: int  # pending deliveries refunded at once; the rest die at their pre-send check


class Application(msgspec.Struct, frozen=True):
    """One customer of the account's app: its own endpoints; a message sent to it reaches only those."""

    id: uuid.UUID
    uid: str | None  # the account's own id for it, usable wherever an application id is
    name: str
    metadata: dict[str, str]
    rate_limit_per_second: int | None  # the default limit of its endpoints (each on its own); None: none
    is_default: bool  # the account's default application (its id is the account's): where send() goes
    created_at: datetime
    updated_at: datetime


class ApplicationDeleted(msgspec.Struct, frozen=True):
    id: uuid.UUID
    deleted: bool
    endpoints_deleted: int
    refunded_now: int


class ApplicationUsage(msgspec.Struct, frozen=True):
    """What an application's deliveries moved on the account's ledger in [since, until)."""

    application_id: uuid.UUID
    since: datetime | None
    until: datetime | None
    charges: int
    charged: int
    refunds: int
    refunded: int
    reclaims: int
    reclaimed: int
    net: int  # credits paid: charged - refunded + reclaimed


class PortalLink(msgspec.Struct, frozen=True):
    """A single-use sign-in link into an application's portal; hand `url` to its customer."""

    url: str
    expires_at: datetime  # it signs in once, before this


class EventType(msgspec.Struct, frozen=True):
    """An entry of the account's event catalog; with a schema, every payload of the type must pass it."""

    id: uuid.UUID
    name: str
    description: str
    schema: dict[str, Any] | bool | None
    archived: bool  # no new messages of it
    created_at: datetime
    updated_at: datetime


class CreatedDelivery(msgspec.Struct, frozen=True):
    id: uuid.UUID
    endpoint_id: uuid.UUID
    price: int


class Message(msgspec.Struct, frozen=True):
    """An accepted event: one delivery per subscribed endpoint, each charged `price`.

    `replayed` True: the API answered a stored response for this idempotency key, nothing new was
    charged. `idempotency_key` is the key this call sent (generated when the caller gave none), so a
    caller who lost the answer can send again with it.
    """

    id: uuid.UUID
    event_type: str
    deliveries: tuple[CreatedDelivery, ...]
    total_charged: int
    replayed: bool = False
    idempotency_key: str | None = None


class RecoverPlan(msgspec.Struct, frozen=True):
    """What a recovery of an endpoint's dead deliveries would do now; nothing was written.

    Pass `total_charge` as `confirm_total`, and `since`/`until` as given here, to `recover`: it
    replays only if that is still the total. `more`: more match than one call replays (200).
    """

    endpoint_id: uuid.UUID
    endpoint_enabled: bool  # False: recover answers 409 endpoint-disabled until it is enabled again
    since: datetime
    until: datetime
    count: int
    total_charge: int
    more: bool
    dead_delivery_ids: tuple[uuid.UUID, ...] = ()


class RecoveredDelivery(msgspec.Struct, frozen=True):
    dead_delivery_id: uuid.UUID
    delivery_id: uuid.UUID  # the new delivery (for already_replayed: the earlier replay)


class RecoverRefusal(msgspec.Struct, frozen=True):
    dead_delivery_id: uuid.UUID
    reason: str


class Recovered(msgspec.Struct, frozen=True):
    """A recovery: each dead delivery replayed as a new pending delivery, charged once.

    `more` True: call again (plan, then recover) for the rest. `idempotent_replayed` True: the API
    answered the stored answer of this idempotency key (nothing new charged). `idempotency_key` is
    the key this call sent (generated when the caller gave none).
    """

    endpoint_id: uuid.UUID
    since: datetime
    until: datetime
    replayed_count: int
    replayed: tuple[RecoveredDelivery, ...]
    already_replayed_count: int
    already_replayed: tuple[RecoveredDelivery, ...]
    refused_count: int
    refused: tuple[RecoverRefusal, ...]
    total_charged: int
    more: bool
    idempotent_replayed: bool = False
    idempotency_key: str | None = None


class Attempt(msgspec.Struct, frozen=True):
    attempt: int
    started_at: datetime
    finished_at: datetime
    status_code: int | None
    latency_ms: int | None
    error: str | None
    response_excerpt: str | None
    stale: bool  # recorded after the lease expired (a slow worker)
    # The endpoint's custom headers this attempt was sent with (None: none, or erased with the excerpt).
    sent_headers: dict[str, str] | None = None


class Delivery(msgspec.Struct, frozen=True):
    id: uuid.UUID
    account_id: uuid.UUID
    message_id: uuid.UUID
    endpoint_id: uuid.UUID
    event_type: str
    state: str  # pending | sending | delivered | dead
    attempt: int
    attempts_max: int
    price: int
    next_attempt_at: datetime
    dead_reason: str | None
    created_at: datetime
    finished_at: datetime | None
    replay_of: uuid.UUID | None = None  # the delivery this one replays; None for a message's own
    # What it is sent under (receivers dedupe on it): its own id, or a replay's replayed delivery's.
    webhook_id: uuid.UUID | None = None


class DeliveryDetail(Delivery, frozen=True):
    attempts: tuple[Attempt, ...] = ()
    ledger_entries: tuple[LedgerEntry, ...] = ()
    payload_erased_at: datetime | None = None  # when its message's payload and excerpts were erased


class DeadDelivery(msgspec.Struct, frozen=True):
    """A dead delivery of any account, as the operator lists them, with its endpoint's URL."""

    id: uuid.UUID
    account_id: uuid.UUID
    endpoint_id: uuid.UUID
    message_id: uuid.UUID
    event_type: str
    url: str
    price: int
    dead_reason: str
    attempt: int
    created_at: datetime
    finished_at: datetime | None


class InspectedLedgerEntry(msgspec.Struct, frozen=True):
    id: str
    kind: str
    amount: int
    note: str | None
    created_at: datetime


class InspectedDelivery(msgspec.Struct, frozen=True):
    """Any account's delivery as the operator reads it: its endpoint now, latest attempts first, and
    every ledger entry tied to it (adjustments too)."""

    id: uuid.UUID
    account_id: uuid.UUID
    endpoint_id: uuid.UUID
    message_id: uuid.UUID
    event_type: str
    url: str
    endpoint_enabled: bool
    endpoint_deleted_at: datetime | None
    state: str
    dead_reason: str | None
    attempt: int
    attempts_max: int
    price: int
    payload_bytes: int | None  # None: the payload was erased
    created_at: datetime
    finished_at: datetime | None
    attempts: tuple[Attempt, ...] = ()
    ledger_entries: tuple[InspectedLedgerEntry, ...] = ()
    webhook_id: uuid.UUID | None = None  # the webhook-id receivers see: the replayed delivery's, for a replay
    replay_of: uuid.UUID | None = None


class AccountDeletion(msgspec.Struct, frozen=True):
    """An account's deletion job: `status` running, waiting_repair, done or failed; `report` its counts."""

    id: uuid.UUID
    account_id: uuid.UUID
    status: str
    step: str
    report: dict


class Page(msgspec.Struct, Generic[T], frozen=True):
    """One page of a list; pass `next_cursor` as `cursor` for the next one (None: this was the last)."""

    data: tuple[T, ...]
    next_cursor: str | None = None

    def __iter__(self):
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


class _DataList(msgspec.Struct, Generic[T], frozen=True):
    """An unpaged list answer ({"data": [...]}), unwrapped by the client into a tuple."""

    data: tuple[T, ...]


class _Secret(msgspec.Struct, frozen=True):
    secret: str
