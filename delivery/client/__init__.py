"""The hookledger Python SDK: `Client` (blocking) and `AsyncClient` (asyncio), on httpx.

    from delivery.client import Client

    with Client("http://127.0.0.1:8000", "hl_live_...") as hookledger:
        endpoint = hookledger.endpoints.create("https://example.com/hooks", event_types=["invoice.paid"])
        message = hookledger.send("invoice.paid", {"invoice": "in_1"})   # 202: one charged delivery per endpoint
        page = hookledger.deliveries.list(message_id=message.id)
        print(hookledger.balance().balance)

After a receiver outage, `endpoints.recover_plan(endpoint_id, since)` shows what recovering the
endpoint's dead deliveries would charge, and `endpoints.recover(endpoint_id, since,
confirm_total=plan.total_charge)` replays them as new charged deliveries (200 a call; `more`).

`messages.expunge(message_id)` erases a finished message's payload and its attempts' response
excerpts now; `account()` and `update_account(payload_retention_days=...)` read and set how many days
they are kept before the retention job erases them.

An operator (holding the operator key) has `accounts.create/get/update/top_up/reverse_top_up/delete/deletion`
and `deliveries.list_dead/list_dead_letters/inspect`. Every refusal raises a `HookledgerError` subclass carrying the API's
problem+json fields (`status`, `type`, `title`, `detail`, `errors`). Every create (`send`, a
replay, a recovery, an account, an API key, an endpoint, a secret rotation) carries an Idempotency-Key
(generated when not given) reused by its retries, so a retry never charges twice, nor makes a
second endpoint or key; what is retried, and when, is in `retry.py`.

This package imports nothing of the server (no aiohttp, no asyncpg): an app can depend on it alone.
"""

from delivery.client.aio import AsyncClient
from delivery.client.calls import UNSET
from delivery.client.errors import (
    APIConnectionError,
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
from delivery.client.models import (
    Account,
    AccountCreated,
    AccountDeletion,
    ApiKey,
    Application,
    ApplicationDeleted,
    ApplicationUsage,
    Attempt,
    Balance,
    CreatedDelivery,
    DeadDelivery,
    Delivery,
    DeliveryDetail,
    Endpoint,
    EndpointDeleted,
    EventType,
    InspectedDelivery,
    InspectedLedgerEntry,
    LedgerEntry,
    Message,
    MessageErased,
    NewApiKey,
    Page,
    PortalLink,
    RecoverPlan,
    RecoverRefusal,
    Recovered,
    RecoveredDelivery,
    Topup,
)
from delivery.client.retry import RetryPolicy
from delivery.client.sync import Client

__all__ = [
    "APIConnectionError",
    "Account",
    "AccountCreated",
    "AccountDeletion",
    "ApiKey",
    "Application",
    "ApplicationDeleted",
    "ApplicationUsage",
    "AsyncClient",
    "Attempt",
    "AuthenticationError",
    "Balance",
    "Client",
    "ConflictError",
    "CreatedDelivery",
    "DeadDelivery",
    "Delivery",
    "DeliveryDetail",
    "Endpoint",
    "EndpointDeleted",
    "EventType",
    "FieldError",
    "HookledgerError",
    "InspectedDelivery",
    "InspectedLedgerEntry",
    "LedgerEntry",
    "Message",
    "MessageErased",
    "NewApiKey",
    "NotFoundError",
    "Page",
    "PayloadTooLargeError",
    "PaymentRequiredError",
    "PermissionDeniedError",
    "PortalLink",
    "RateLimitError",
    "RecoverPlan",
    "RecoverRefusal",
    "Recovered",
    "RecoveredDelivery",
    "ResponseDecodeError",
    "RetryPolicy",
    "ServerError",
    "Topup",
    "UNSET",
    "ValidationError",
]
