"""The event catalog: an account's event types, each with a description, an optional JSON Schema
that payloads of the type must pass (checked on every message create), and an archived flag
(archived: no new messages of the type). Addressed by name; another account's is a 404."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
from aiohttp import web

from billing.tables import EVENT_TYPE_DESCRIPTION_LENGTH_MAX, EVENT_TYPE_SCHEMA_BYTES_MAX
from delivery.api import event_catalog, responses
from delivery.api.context import context
from delivery.api.problems import FieldError, Problem, not_found, validation
from delivery.api.validation import EventType, Query, decode, path_id
from delivery.store import event_types as store

routes = web.RouteTableDef()
_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,256}")  # what an event type's name may be; any other path is a 404


def _name(request: web.Request) -> str:
    name = request.match_info["name"]
    if not _NAME.fullmatch(name):
        raise not_found("event type")
    return name

Description = Annotated[str, msgspec.Meta(max_length=EVENT_TYPE_DESCRIPTION_LENGTH_MAX, pattern=r"^[^\u0000]*$(?!\n)")]
Schema = Annotated[dict[str, Any] | bool | None, msgspec.Meta(description=(
    f"A JSON Schema (draft 2020-12; at most {EVENT_TYPE_SCHEMA_BYTES_MAX} bytes, references only within itself)"
    " that every payload of this type must pass; null: any payload."))]


class EventTypeCreate(msgspec.Struct, forbid_unknown_fields=True):
    name: EventType
    description: Description = ""
    schema: Schema = None
    archived: bool = False


class EventTypePatch(msgspec.Struct, forbid_unknown_fields=True):
    description: Description | msgspec.UnsetType = msgspec.UNSET
    schema: Schema | msgspec.UnsetType = msgspec.UNSET
    archived: bool | msgspec.UnsetType = msgspec.UNSET


class EventTypeBody(msgspec.Struct):
    id: uuid.UUID
    name: str
    description: str
    schema: dict[str, Any] | bool | None
    archived: bool
    created_at: datetime
    updated_at: datetime


class EventTypePage(msgspec.Struct):
    data: list[EventTypeBody]
    next_cursor: str | None


REQUEST_BODIES = (EventTypeCreate, EventTypePatch)
RESPONSE_BODIES = (EventTypeBody, EventTypePage)


def _body(event_type: store.EventType) -> EventTypeBody:
    return EventTypeBody(event_type.id, event_type.name, event_type.description, event_type.schema,
                         event_type.archived, event_type.created_at, event_type.updated_at)


def _check_schema(schema: object) -> None:
    if schema is None:
        return
    text = json.dumps(schema)
    if len(text.encode()) > EVENT_TYPE_SCHEMA_BYTES_MAX:
        raise validation([FieldError("schema", f"must be at most {EVENT_TYPE_SCHEMA_BYTES_MAX} bytes as JSON")])
    if "\\u0000" in text:  # PostgreSQL's jsonb holds no NUL character
        raise validation([FieldError("schema", "must not contain a NUL character")])
    errors = event_catalog.schema_errors(schema)
    if errors:
        raise validation(errors, "the schema is not a JSON Schema (draft 2020-12)")


@routes.post("/v1/event-types")
async def create_event_type(request: web.Request) -> web.Response:
    ctx = context(request)
    account_id = await ctx.account(request)
    body = decode(await request.read(), EventTypeCreate)
    _check_schema(body.schema)
    try:
        created = await store.create_event_type(ctx.pool, account_id, body.name, description=body.description,
                                                schema=body.schema, archived=body.archived)
    except store.EventTypeExists as error:
        raise Problem(409, str(error), "event-type-exists") from None
    except store.EventTypeLimitReached as error:
        raise Problem(409, str(error), "limit-reached") from None
    ctx.catalog.forget(account_id)
    return responses.json(_body(created), 201)


@routes.get("/v1/event-types")
async def list_event_types(request: web.Request) -> web.Response:
    """Oldest first; archived ones only with include_archived=true."""
    ctx = context(request)
    account_id = await ctx.account(request)
    query = Query(request.query)
    limit = query.limit()
    include_archived = query.choice("include_archived", ("true", "false")) == "true"
    cursor = query.cursor()
    after = None if cursor is None else path_id(cursor)
    if cursor is not None and after is None:
        query.errors.append(FieldError("cursor", "is not a cursor this API returned"))
    query.check()
    rows = await store.page(ctx.pool, account_id, after=after, limit=limit, include_archived=include_archived)
    data = [_body(row) for row in rows[:limit]]
    return responses.json(EventTypePage(data, str(data[-1].id) if len(rows) > limit else None))


@routes.get("/v1/event-types/{name}")
async def get_event_type(request: web.Request) -> web.Response:
    ctx = context(request)
    account_id = await ctx.account(request)
    found = await store.get(ctx.pool, account_id, _name(request))
    if found is None:
        raise not_found("event type")
    return responses.json(_body(found))


@routes.patch("/v1/event-types/{name}")
async def patch_event_type(request: web.Request) -> web.Response:
    ctx = context(request)
    account_id = await ctx.account(request)
    name = _name(request)
    body = decode(await request.read(), EventTypePatch)
    changes = {name: value for name, value in msgspec.structs.asdict(body).items() if value is not msgspec.UNSET}
    _check_schema(changes.get("schema"))
    updated = await store.update(ctx.pool, account_id, name, changes)
    if updated is None:
        raise not_found("event type")
    ctx.catalog.forget(account_id)
    return responses.json(_body(updated))


_AT = datetime(2026, 1, 31, 12, 0, 0, tzinfo=UTC)
_SCHEMA = {"type": "object", "required": ["amount"], "properties": {"amount": {"type": "integer", "minimum": 0}}}
_EXAMPLE = EventTypeBody(uuid.UUID("0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d09"), "invoice.paid", "An invoice was paid",
                         _SCHEMA, False, _AT, _AT)
EXAMPLES: dict[str, object] = {type(instance).__name__: msgspec.json.decode(msgspec.json.encode(instance)) for instance in (
    EventTypeCreate(name="invoice.paid", description="An invoice was paid", schema=_SCHEMA),
    EventTypePatch(archived=True),
    _EXAMPLE,
    EventTypePage(data=[_EXAMPLE], next_cursor=None),
)}
