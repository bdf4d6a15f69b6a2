"""The operator's reads across accounts, for `hookledger deliveries dead|show` and the like.

`GET /v1/operator/dead-deliveries` lists dead deliveries of every account with the filters an
operator sorts dead letters by (account, endpoint, reason, when it died), newest first; `GET
/v1/operator/deliveries/{id}` reads any account's delivery with its latest attempts and every
ledger entry tied to it (charge, refund, reclaim, adjustments). Both read through
delivery.operations.dead_letters, as the dashboard's operator pages do, and write nothing.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import msgspec
from aiohttp import web

from billing.tables import DEAD_REASONS
from delivery.api import responses
from delivery.api.context import context
from delivery.api.problems import FieldError, not_found
from delivery.api.validation import Query, path_id
from delivery.operations import dead_letters

routes = web.RouteTableDef()


class DeadDelivery(msgspec.Struct):
    id: uuid.UUID
    account_id: uuid.UUID
    endpoint_id: uuid.UUID
    message_id: uuid.UUID
    event_type: str
    url: str  # the endpoint's URL
    price: int
    dead_reason: str
    attempt: int
    created_at: datetime
    finished_at: datetime | None


class DeadDeliveryPage(msgspec.Struct):
    data: list[DeadDelivery]
    next_cursor: str | None


class InspectedLedgerEntry(msgspec.Struct):
    id: str
    kind: str
    amount: int
    note: str | None
    created_at: datetime


class InspectedDelivery(msgspec.Struct):
    """A delivery of any account, with its endpoint as it is now, its latest attempts and its ledger entries."""

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
    webhook_id: uuid.UUID  # what the receiver sees as webhook-id: the replayed delivery's, for a replay
    replay_of: uuid.UUID | None
    attempts: list[responses.Attempt]  # latest first, at most dead_letters.ATTEMPTS_SHOWN_MAX
    ledger_entries: list[InspectedLedgerEntry]


RESPONSE_BODIES = (DeadDeliveryPage, InspectedDelivery)


@routes.get("/v1/operator/dead-deliveries")
async def list_dead_deliveries(request: web.Request) -> web.Response:
    """Operator: dead deliveries of every account, newest first, filtered; `cursor` is the previous page's next_cursor."""
    ctx = context(request)
    await ctx.operator(request)
    query = Query(request.query)
    limit = query.limit()
    filters = dead_letters.DeadFilter(
        account_id=query.uuid("account_id"), endpoint_id=query.uuid("endpoint_id"),
        reason=query.choice("dead_reason", DEAD_REASONS),
        died_after=query.timestamp("died_after"), died_before=query.timestamp("died_before"),
    )
    cursor = query.cursor()
    if cursor is not None and path_id(cursor) is None:
        query.errors.append(FieldError("cursor", "is not a cursor this API returned"))
    query.check()
    page = await dead_letters.list_dead(ctx.pool, filters, cursor=cursor, limit=limit)
    data = [responses.from_row(DeadDelivery, row) for row in page.rows]
    return responses.json(DeadDeliveryPage(data, page.next_cursor))


@routes.get("/v1/operator/deliveries/{id}")
async def get_delivery(request: web.Request) -> web.Response:
    """Operator: any account's delivery (DeliveryNotFound answers 404)."""
    ctx = context(request)
    await ctx.operator(request)
    delivery_id = path_id(request.match_info["id"])
    if delivery_id is None:
        raise not_found("delivery")
    found = await dead_letters.inspect(ctx.pool, delivery_id)
    row = found["delivery"]
    detail = InspectedDelivery(
        **{name: row[name] for name in InspectedDelivery.__struct_fields__ if name in row},
        endpoint_enabled=row["enabled"],
        attempts=[responses.attempt_from_row(attempt) for attempt in found["attempts"]],
        ledger_entries=[responses.from_row(InspectedLedgerEntry, entry) for entry in found["ledger"]],
    )
    return responses.json(detail)


# ---- the OpenAPI document's examples of this module's bodies (delivery.api.openapi reads them) ------

_AT = datetime(2026, 1, 31, 12, 0, 0, tzinfo=UTC)
_DEAD = DeadDelivery(
    id=uuid.UUID("0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d05"), account_id=uuid.UUID("0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d01"),
    endpoint_id=uuid.UUID("0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d02"), message_id=uuid.UUID("0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d03"),
    event_type="invoice.paid", url="https://hooks.example.com/hookledger", price=1, dead_reason="out_of_retries",
    attempt=8, created_at=_AT, finished_at=_AT,
)
_INSPECTED = InspectedDelivery(
    **{name: getattr(_DEAD, name) for name in DeadDelivery.__struct_fields__},
    endpoint_enabled=True, endpoint_deleted_at=None, state="dead", attempts_max=8, payload_bytes=17,
    webhook_id=uuid.UUID("0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d05"), replay_of=None,
    attempts=[responses.Attempt(attempt=8, started_at=_AT, finished_at=_AT, status_code=503, latency_ms=41,
                                error=None, response_excerpt="upstream unavailable", stale=False,
                                sent_headers={"X-Tenant": "acme"})],
    ledger_entries=[InspectedLedgerEntry(id=f"charge:{_DEAD.id}", kind="charge", amount=-1, note=None, created_at=_AT),
                    InspectedLedgerEntry(id=f"refund:{_DEAD.id}", kind="refund", amount=1, note=None, created_at=_AT)],
)
EXAMPLES: dict[str, object] = {
    type(body).__name__: msgspec.json.decode(msgspec.json.encode(body))
    for body in (_DEAD, DeadDeliveryPage([_DEAD], None), _INSPECTED, *_INSPECTED.ledger_entries[:1])
}
