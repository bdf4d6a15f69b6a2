"""Operational webhooks: the account's operational endpoints, its events, and its balance threshold.

    POST/GET /v1/operational-endpoints, GET/PATCH/DELETE /v1/operational-endpoints/{id},
    GET /v1/operational-endpoints/{id}/secret     where the account's operational events go
    GET /v1/operational-events[?type=&cursor=&limit=], GET /v1/operational-events/{id}
    GET/PATCH /v1/account                          low_balance_threshold (balance.low; null: off)

An operational endpoint is checked as an endpoint is (the SSRF policy, a whsec_ secret given or
made, sealed at rest), and its create takes an Idempotency-Key as an endpoint's does. Every statement is scoped by the caller's account: another account's id
answers 404, as a missing one does. The events and their payloads are billing.operational_outbox's.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any

import msgspec
from aiohttp import web

from billing.tables import OPERATIONAL_EVENT_TYPES
from billing.database import Executor
from delivery.api import idempotency, responses
from delivery.api.context import ApiContext, context
from delivery.api.problems import FieldError, Problem, not_found, validation
from delivery.api.validation import Description, Query, SecretText, Url, decode, path_id
from delivery.engine.ssrf import validate_endpoint_url
from delivery.errors import InvalidEndpointUrlError
from delivery.store import operational as store
from delivery.store import signing_keys
from signing import SigningError, parse_signing_key

routes = web.RouteTableDef()

OperationalEventTypes = Annotated[
    list[Annotated[str, msgspec.Meta(extra_json_schema={"enum": list(OPERATIONAL_EVENT_TYPES)})]],
    msgspec.Meta(min_length=1, max_length=len(OPERATIONAL_EVENT_TYPES),
                 description="The operational event types wanted; null: every type."),
]


class OperationalEndpointCreate(msgspec.Struct, forbid_unknown_fields=True):
    url: Url
    description: Description = ""
    event_types: OperationalEventTypes | None = None
    enabled: bool = True
    secret: SecretText | None = None


class OperationalEndpointPatch(msgspec.Struct, forbid_unknown_fields=True):
    url: Url | msgspec.UnsetType = msgspec.UNSET
    description: Description | msgspec.UnsetType = msgspec.UNSET
    event_types: OperationalEventTypes | None | msgspec.UnsetType = msgspec.UNSET
    enabled: bool | msgspec.UnsetType = msgspec.UNSET


class OperationalEndpoint(msgspec.Struct):
    id: uuid.UUID
    url: str
    description: str
    event_types: list[str] | None
    enabled: bool
    # Why the worker switched it off: the receiver answered 410 Gone, or every attempt failed for as
    # long as the auto-disable policy allows. null while enabled, or when the account switched it off.
    disabled_reason: str | None
    created_at: datetime
    updated_at: datetime


class OperationalEndpointCreated(msgspec.Struct):
    endpoint: OperationalEndpoint
    secret: str  # shown here and by GET .../secret; what a receiver verifies with


class OperationalEndpointList(msgspec.Struct):
    data: list[OperationalEndpoint]


class OperationalSecret(msgspec.Struct):
    secret: str


class OperationalEvent(msgspec.Struct):
    """The event as its webhook carries it (type, timestamp, data), with its id (the webhook-id) and cursor."""
    id: uuid.UUID
    seq: int
    type: str
    timestamp: datetime
    data: dict[str, Any]


class OperationalEventPage(msgspec.Struct):
    data: list[OperationalEvent]
    next_cursor: str | None


REQUEST_BODIES = (OperationalEndpointCreate, OperationalEndpointPatch)
RESPONSE_BODIES = (OperationalEndpoint, OperationalEndpointCreated, OperationalEndpointList, OperationalSecret,
                   OperationalEvent, OperationalEventPage)


def _endpoint(endpoint: store.OperationalEndpoint) -> OperationalEndpoint:
    return OperationalEndpoint(endpoint.id, endpoint.url, endpoint.description, endpoint.event_types,
                               endpoint.enabled, endpoint.disabled_reason, endpoint.created_at, endpoint.updated_at)


def _event(event: store.OperationalEvent) -> OperationalEvent:
    return OperationalEvent(event.id, event.seq, event.type, event.created_at, event.data)


def _check(ctx: ApiContext, url: str | None, event_types: list[str] | None, secret: str | None = None) -> None:
    errors = []
    if url is not None:
        try:
            validate_endpoint_url(url, ctx.policy)
        except InvalidEndpointUrlError as error:
            errors.append(FieldError("url", str(error)))
    if event_types is not None:
        unknown = [name for name in event_types if name not in OPERATIONAL_EVENT_TYPES]
        if unknown:
            errors.append(FieldError("event_types", f"{unknown[0][:64]!r} is not one of {', '.join(OPERATIONAL_EVENT_TYPES)}"))
        elif len(set(event_types)) != len(event_types):
            errors.append(FieldError("event_types", "lists an event type twice"))
    if secret is not None:
        try:
            parse_signing_key(secret)
        except SigningError as error:
            errors.append(FieldError("secret", str(error)))
    if errors:
        raise validation(errors, "the operational endpoint is not acceptable")


async def _ids(request: web.Request) -> tuple[ApiContext, uuid.UUID, uuid.UUID]:
    ctx = context(request)
    account_id = await ctx.account(request)
    endpoint_id = path_id(request.match_info["id"])
    if endpoint_id is None:
        raise not_found("operational endpoint")
    return ctx, account_id, endpoint_id


@routes.post("/v1/operational-endpoints")
async def create_endpoint(request: web.Request) -> web.Response:
    ctx = context(request)
    account_id = await ctx.account(request)
    body = decode(await request.read(), OperationalEndpointCreate)
    _check(ctx, body.url, body.event_types, body.secret)
    return await idempotency.once(request, str(account_id), lambda executor: _create(ctx, executor, account_id, body))


async def _create(ctx: ApiContext, executor: Executor, account_id: uuid.UUID,
                  body: OperationalEndpointCreate) -> web.Response:
    secret = body.secret if body.secret is not None else signing_keys.new_key(signing_keys.HMAC)
    try:
        endpoint = await store.create_endpoint(executor, account_id, body.url, secret=secret, keyring=ctx.keyring,
                                               event_types=body.event_types, description=body.description,
                                               enabled=body.enabled)
    except store.OperationalEndpointLimitReached as error:
        raise Problem(409, str(error), "limit-reached") from None
    return responses.json(OperationalEndpointCreated(_endpoint(endpoint), secret), 201)


@routes.get("/v1/operational-endpoints")
async def list_endpoints(request: web.Request) -> web.Response:
    ctx = context(request)
    account_id = await ctx.account(request)
    found = await store.list_endpoints(ctx.pool, account_id)
    return responses.json(OperationalEndpointList([_endpoint(endpoint) for endpoint in found]))


@routes.get("/v1/operational-endpoints/{id}")
async def get_endpoint(request: web.Request) -> web.Response:
    ctx, account_id, endpoint_id = await _ids(request)
    endpoint = await store.get_endpoint(ctx.pool, account_id, endpoint_id)
    if endpoint is None:
        raise not_found("operational endpoint")
    return responses.json(_endpoint(endpoint))


@routes.patch("/v1/operational-endpoints/{id}")
async def patch_endpoint(request: web.Request) -> web.Response:
    ctx, account_id, endpoint_id = await _ids(request)
    body = decode(await request.read(), OperationalEndpointPatch)
    changes = {name: value for name, value in msgspec.structs.asdict(body).items() if value is not msgspec.UNSET}
    _check(ctx, changes.get("url"), changes.get("event_types"))
    endpoint = await store.update_endpoint(ctx.pool, account_id, endpoint_id, changes)
    if endpoint is None:
        raise not_found("operational endpoint")
    return responses.json(_endpoint(endpoint))


@routes.delete("/v1/operational-endpoints/{id}")
async def delete_endpoint(request: web.Request) -> web.Response:
    ctx, account_id, endpoint_id = await _ids(request)
    if not await store.delete_endpoint(ctx.pool, account_id, endpoint_id):
        raise not_found("operational endpoint")
    return web.Response(status=204)


@routes.get("/v1/operational-endpoints/{id}/secret")
async def read_secret(request: web.Request) -> web.Response:
    ctx, account_id, endpoint_id = await _ids(request)
    secret = await store.read_secret(ctx.pool, account_id, endpoint_id, ctx.keyring)
    if secret is None:
        raise not_found("operational endpoint")
    return responses.json(OperationalSecret(secret))


@routes.get("/v1/operational-events")
async def list_events(request: web.Request) -> web.Response:
    """The account's operational events, oldest first; `cursor` is the next_cursor of the previous page."""
    ctx = context(request)
    account_id = await ctx.account(request)
    query = Query(request.query)
    limit = query.limit()
    event_type = query.choice("type", OPERATIONAL_EVENT_TYPES)
    after = query.seq_cursor()
    query.check()
    found = await store.events_page(ctx.pool, account_id, after=after, limit=limit + 1, event_type=event_type)
    events = [_event(event) for event in found[:limit]]
    return responses.json(OperationalEventPage(events, str(events[-1].seq) if len(found) > limit else None))


@routes.get("/v1/operational-events/{id}")
async def get_event(request: web.Request) -> web.Response:
    ctx = context(request)
    account_id = await ctx.account(request)
    event_id = path_id(request.match_info["id"])
    event = None if event_id is None else await store.get_event(ctx.pool, account_id, event_id)
    if event is None:
        raise not_found("operational event")
    return responses.json(_event(event))
