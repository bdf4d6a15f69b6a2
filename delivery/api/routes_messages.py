"""POST /v1/messages: accept an event, fan it out, charge every delivery, through the group commit.

Idempotency-Key (Stripe semantics): the same key and body again answer the stored response with
`Idempotent-Replayed: true`; another body with that key is 422; the key while its first request
is still in flight in this process is 409 (see group_commit.py for the cross-process case).
Keys are kept as long as their message (forever, in `messages`), so at least 24 hours.
"""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime

from aiohttp import web

from billing.errors import BillingError
from billing.messages import MessageCreated, MessageRequest
from delivery import tracing
from delivery.api import api_keys, event_catalog, group_commit, problems, responses
from delivery.operations.dead_letters import REPLAY_KEY_PREFIX
from delivery.api.context import ApiContext, context
from delivery.api.idempotency import idempotency_key
from delivery.api.problems import FieldError, Problem, validation
from delivery.api.problems import not_found
from delivery.api.validation import Empty, decode, decode_message, path_id
from delivery.operations import retention

routes = web.RouteTableDef()

RETRY_AFTER_SECONDS = "1"
ENVELOPE_BYTES_MAX = 16 * 1024  # what a body may hold besides the payload (event type, keys, spaces)


def body_bytes_max(payload_bytes_max: int) -> int:
    """The largest request body the app reads (its client_max_size)."""
    return payload_bytes_max + ENVELOPE_BYTES_MAX


def accepted(created: MessageCreated) -> web.Response:
    body = responses.MessageAccepted(
        id=created.message_id,
        event_type=created.event_type,
        deliveries=[responses.CreatedDelivery(d.id, d.endpoint_id, d.price) for d in created.deliveries],
        total_charged=created.total_charged,
    )
    headers = {"Idempotent-Replayed": "true"} if created.replayed else None
    return responses.json(body, 202, headers)


async def submit(ctx: ApiContext, request: MessageRequest) -> MessageCreated:
    """Run one create through the coalescer; its refusal or failure as a Problem."""
    try:
        result = await ctx.coalescer.submit(request)
    except group_commit.KeyInProgress:
        raise problems.key_in_use() from None
    except group_commit.Overloaded:
        raise Problem(503, "too many requests are waiting to be written; retry shortly", "overloaded",
                      headers={"Retry-After": RETRY_AFTER_SECONDS}) from None
    except group_commit.ShuttingDown:
        raise Problem(503, "the server is shutting down; retry", "shutting-down",
                      headers={"Retry-After": RETRY_AFTER_SECONDS}) from None
    except group_commit.BatchFailed:
        raise problems.write_failed() from None
    except group_commit.BatchOutcomeUnknown:
        raise problems.write_outcome_unknown(request.idempotency_key is not None) from None
    finally:
        if tracing.ENABLED:
            tracing.link_batch(request.trace_context)
    if isinstance(result, BillingError):
        raise result
    return result


def message_idempotency_key(request: web.Request) -> str | None:
    """The request's Idempotency-Key (delivery.api.idempotency's rule), not in the replays' space."""
    key = idempotency_key(request)
    if key is not None and key.startswith(REPLAY_KEY_PREFIX):
        # The operator's dead-letter replays key themselves so; a customer's key there would
        # make `hookledger deliveries replay` refuse that delivery as a reused key.
        raise validation([FieldError("Idempotency-Key", f"may not start with {REPLAY_KEY_PREFIX!r} (reserved)")])
    return key


def _too_large(limit: int) -> Problem:
    return Problem(413, f"the payload is larger than {limit} bytes", "payload-too-large")


@routes.post("/v1/messages/{id}/expunge")
async def expunge_message(request: web.Request) -> web.Response:
    """Erase a message's payload and its attempts' response excerpts and custom headers sent now
    (delivery.operations.retention).

    409 while any of its deliveries is pending or sending, with Retry-After and the time the
    soonest of them is next tried; 404 for an id that is not one of the account's messages. Twice:
    the same answer. The erasure is recorded (when, and the API key that asked), not what was erased.
    """
    ctx = context(request)
    account_id: uuid.UUID = await ctx.account(request)
    message_id = path_id(request.match_info["id"])
    decode(await request.read(), Empty, optional=True)
    if message_id is None:
        raise not_found("message")
    key_id = await api_keys.key_id(ctx.pool, account_id, ctx.auth.digest(request))
    erased_by = f"api_key:{key_id}" if key_id is not None else f"account:{account_id}"
    try:
        erased = await retention.expunge(ctx.pool, account_id, message_id, erased_by)
    except retention.MessageNotFound:
        raise not_found("message") from None
    except retention.MessageLive as live:
        when = live.next_change_at
        wait_seconds = max(1, math.ceil((when - datetime.now(UTC)).total_seconds())) if when else 1
        raise Problem(409, f"{live.live} deliveries of the message are still pending or sending; it can be expunged"
                      f" once they have finished (delivered or dead); the soonest is next tried at"
                      f" {when.isoformat() if when else 'once claimed'}", "message-live",
                      headers={"Retry-After": str(wait_seconds)}) from None
    return responses.json(responses.MessageErased(erased.message_id, erased.event_type, erased.payload_erased_at,
                                                  erased.payload_erased_by))


@routes.post("/v1/messages")
async def create_message(request: web.Request) -> web.Response:
    ctx = context(request)
    account_id: uuid.UUID = await ctx.account(request)
    limit = ctx.settings.api.payload_bytes_max
    # Refuse on the declared length before reading; the app's client_max_size bounds the read
    # for bodies that do not declare it, and the payload itself is measured after parsing.
    if request.content_length is not None and request.content_length > body_bytes_max(limit):
        raise _too_large(limit)
    key = message_idempotency_key(request)
    body, payload = decode_message(await request.read())
    if len(payload) > limit:
        raise _too_large(limit)
    channels = event_catalog.channels_of(body.channels)
    await ctx.catalog.check_message(account_id, body.event_type, payload)
    trace_context = None
    if tracing.ENABLED:
        tracing.set_attributes(account_id=account_id)
        trace_context = tracing.traceparent()
    created = await submit(ctx, MessageRequest(account_id, body.event_type, payload, key, trace_context=trace_context,
                                               channels=channels))
    return accepted(created)
