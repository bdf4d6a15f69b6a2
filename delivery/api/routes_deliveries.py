"""Deliveries: list with filters, read one with its attempts and ledger entries, replay one;
and the operator's view of dead deliveries across accounts."""

from __future__ import annotations

import uuid

from aiohttp import web

from billing.messages import MessageRequest
from billing.tables import DELIVERY_STATES
from delivery import tracing
from delivery.api import reads, responses
from delivery.api.context import context
from delivery.api.problems import FieldError, Problem, not_found
from delivery.api.routes_messages import accepted, message_idempotency_key, submit
from delivery.api.validation import Empty, Query, decode, path_id
from delivery.store import endpoint_headers

routes = web.RouteTableDef()

REPLAYABLE_STATES = ("dead", "delivered")


def _page(rows, limit: int) -> responses.DeliveryPage:
    data = [responses.from_row(responses.Delivery, row) for row in rows[:limit]]
    next_cursor = str(data[-1].id) if len(rows) > limit else None
    return responses.DeliveryPage(data, next_cursor)


def _cursor_id(query: Query) -> uuid.UUID | None:
    cursor = query.cursor()
    if cursor is None:
        return None
    cursor_id = path_id(cursor)
    if cursor_id is None:
        query.errors.append(FieldError("cursor", "is not a cursor this API returned"))
    return cursor_id


@routes.get("/v1/deliveries")
async def list_deliveries(request: web.Request) -> web.Response:
    """Newest first; `cursor` is the next_cursor of the previous page."""
    ctx = context(request)
    account_id = await ctx.account(request)
    query = Query(request.query)
    limit = query.limit()
    filters = dict(
        state=query.choice("state", DELIVERY_STATES),
        endpoint_id=query.uuid("endpoint_id"),
        message_id=query.uuid("message_id"),
        created_after=query.timestamp("created_after"),
        created_before=query.timestamp("created_before"),
        before_id=_cursor_id(query),
    )
    query.check()
    rows = await reads.deliveries_page(ctx.pool, account_id, limit=limit, **filters)
    return responses.json(_page(rows, limit))


@routes.get("/v1/deliveries/{id}")
async def get_delivery(request: web.Request) -> web.Response:
    ctx = context(request)
    account_id = await ctx.account(request)
    delivery_id = path_id(request.match_info["id"])
    row = None if delivery_id is None else await reads.delivery(ctx.pool, account_id, delivery_id)
    if row is None:
        raise not_found("delivery")
    attempts = await reads.attempts(ctx.pool, account_id, delivery_id)
    entries = await reads.delivery_ledger(ctx.pool, account_id, delivery_id)
    headers = endpoint_headers.loaded(await reads.endpoint_headers(ctx.pool, account_id, row["endpoint_id"]))
    detail = responses.DeliveryDetail(
        **{name: row[name] for name in responses.Delivery.__struct_fields__},
        attempts=[responses.attempt_from_row(attempt) for attempt in attempts],
        ledger_entries=[responses.from_row(responses.LedgerEntry, entry) for entry in entries],
        endpoint_headers=headers,
        payload_erased_at=row["payload_erased_at"],
    )
    return responses.json(detail)


@routes.post("/v1/deliveries/{id}/replay")
async def replay_delivery(request: web.Request) -> web.Response:
    """Send a dead or delivered delivery's message again to its endpoint: a NEW delivery, charged anew.

    The old delivery keeps its state and its refund (if any); the new one has its own id, attempts
    and charge, so a replay is never silently ignored (hookdeck/outpost #670), but is sent under
    the old one's webhook-id (its webhook_id), as Standard Webhooks asks: a receiver deduping on
    webhook-id drops it if it processed the old one (an answer lost to a timeout), and processes
    it otherwise. Its replay_of names the old one: a recovery (routes_recover) or an operator's
    bulk replay then leaves the old one out instead of replaying and charging it again. An Idempotency-Key makes a
    retried replay answer the first one's response (as POST /v1/messages); without one, each call
    replays again, a delivery that a recovery replayed already too: asked for by id, one more
    replay is what the caller wants. The body is empty or `{}`.
    """
    ctx = context(request)
    account_id = await ctx.account(request)
    delivery_id = path_id(request.match_info["id"])
    key = message_idempotency_key(request)
    decode(await request.read(), Empty, optional=True)
    row = None if delivery_id is None else await reads.message_of_delivery(ctx.pool, account_id, delivery_id)
    if row is None:
        raise not_found("delivery")
    if row["state"] not in REPLAYABLE_STATES:
        raise Problem(409, f"the delivery is {row['state']}; only dead or delivered deliveries can be replayed", "not-replayable")
    if row["payload"] is None:
        raise Problem(409, f"the message's payload was {reads.erased_text(row['payload_erased_at'])};"
                      " it cannot be replayed", "not-replayable")
    request_ = MessageRequest(account_id, row["event_type"], bytes(row["payload"]), key,
                              endpoint_ids=(row["endpoint_id"],), replay_of=delivery_id,
                              trace_context=tracing.traceparent())  # the replay's request's trace
    return accepted(await submit(ctx, request_))


@routes.get("/v1/dead-deliveries")
async def dead_deliveries(request: web.Request) -> web.Response:
    """Operator: dead deliveries across every account, newest first."""
    ctx = context(request)
    await ctx.operator(request)
    query = Query(request.query)
    limit = query.limit()
    before_id = _cursor_id(query)
    query.check()
    return responses.json(_page(await reads.dead_page(ctx.pool, before_id=before_id, limit=limit), limit))
