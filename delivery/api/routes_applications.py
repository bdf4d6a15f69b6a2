"""Applications: an account's customers, each with its own endpoints; a message sent to one goes
only to its endpoints, and the account pays for every delivery.

`{app}` in a path is an application's id or its uid (a uid is never shaped like an id, so the two
cannot be confused). Another account's application answers 404, as a missing one does. The
account's default application (its id is the account's) is what the routes without an
application use: POST /v1/messages, POST and GET /v1/endpoints. It cannot be deleted.

Limits: applications per account (delivery.store.applications.APPLICATIONS_PER_ACCOUNT_MAX) and
endpoints per application (delivery.store.endpoints.ENDPOINTS_PER_APPLICATION_MAX), each named in
its 409 limit-reached.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from typing import Annotated

import msgspec
from aiohttp import web

from billing import usage as billing_usage
from billing.database import Executor
from billing.errors import ApplicationNotFound
from billing.ids import parse_id
from billing.messages import MessageRequest
from billing.tables import APPLICATION_METADATA_BYTES_MAX, APPLICATION_RATE_LIMIT_MAX, APPLICATION_UID_LENGTH_MAX
from delivery.api import event_catalog, idempotency, responses, routes_endpoints
from delivery.api.context import ApiContext, context
from delivery.api.problems import FieldError, Problem, not_found, validation
from delivery.api.routes_messages import accepted, body_bytes_max, message_idempotency_key, submit
from delivery.api.validation import PATTERN_WORDS, Empty, Name, Query, decode, decode_message, in_utc, path_id
from delivery.store import applications as store
from delivery.store import endpoints as endpoint_store
from delivery.store import portal

routes = web.RouteTableDef()

_UID_PATTERN = r"^[A-Za-z0-9_.:\-]+$(?!\n)"  # validation's identifier: letters, digits and _ . : -
PATTERN_WORDS.setdefault(_UID_PATTERN, "may contain only letters, digits and _ . : - (like invoice.paid)")
METADATA_PAIRS_MAX = 50
# A send names its application by id or uid. An id is taken as it is (the write checks that it is a
# live application of the account, in the same statement); a uid is looked up, and the answer kept
# by the process (ctx.uids, delivery.api.application_uids), so sending by uid costs no query either.
# A change to a uid reaches every process's cache at its commit, and this process forgets a uid it
# changes or deletes at once. Should an entry still be stale, the write checks that the application
# still has the uid (MessageRequest.application_uid), and a send it refuses looks the uid up afresh
# once: a uid moved to another application meanwhile sends there.
_REFERENCE = re.compile(r"[A-Za-z0-9_.:\-]{1,%d}" % APPLICATION_UID_LENGTH_MAX)  # an id or a uid, nothing else

Uid = Annotated[str, msgspec.Meta(
    min_length=1, max_length=APPLICATION_UID_LENGTH_MAX, pattern=_UID_PATTERN,
    description="The account's own id for the application (its customer's id), unique among its live"
                " applications; letters, digits and _ . : -, not shaped like a UUID.")]
_NO_NUL = r"^[^\u0000]*$(?!\n)"  # PostgreSQL's jsonb holds no NUL character
PATTERN_WORDS.setdefault(_NO_NUL, "must not contain a NUL character")
MetadataText = Annotated[str, msgspec.Meta(max_length=1000, pattern=_NO_NUL)]
Metadata = Annotated[dict[MetadataText, MetadataText], msgspec.Meta(
    max_length=METADATA_PAIRS_MAX,
    description=f"Names and values of the account's own, at most {METADATA_PAIRS_MAX} pairs and"
                f" {APPLICATION_METADATA_BYTES_MAX} bytes as JSON.")]
RateLimit = Annotated[int, msgspec.Meta(
    ge=1, le=APPLICATION_RATE_LIMIT_MAX,
    description="The default limit of its endpoints: one without a rate_limit_per_second of its own is sent at"
                " most this many deliveries a second (each endpoint on its own, all workers together); null: none.")]


class ApplicationCreate(msgspec.Struct, forbid_unknown_fields=True):
    name: Name
    uid: Uid | None = None
    metadata: Metadata = msgspec.field(default_factory=dict)
    rate_limit_per_second: RateLimit | None = None


class ApplicationPatch(msgspec.Struct, forbid_unknown_fields=True):
    name: Name | msgspec.UnsetType = msgspec.UNSET
    uid: Uid | None | msgspec.UnsetType = msgspec.UNSET
    metadata: Metadata | msgspec.UnsetType = msgspec.UNSET
    rate_limit_per_second: RateLimit | None | msgspec.UnsetType = msgspec.UNSET


class Application(msgspec.Struct):
    id: uuid.UUID
    uid: str | None
    name: str
    metadata: dict[str, str]
    rate_limit_per_second: int | None
    is_default: bool
    created_at: datetime
    updated_at: datetime


class ApplicationPage(msgspec.Struct):
    data: list[Application]
    next_cursor: str | None


class ApplicationDeleted(msgspec.Struct):
    id: uuid.UUID
    deleted: bool
    endpoints_deleted: int
    refunded_now: int  # pending deliveries refunded at once; the rest die at their pre-send check


class ApplicationUsage(msgspec.Struct):
    application_id: uuid.UUID
    since: datetime | None
    until: datetime | None
    charges: int
    charged: int
    refunds: int
    refunded: int
    reclaims: int
    reclaimed: int
    net: Annotated[int, msgspec.Meta(description="Credits paid: charged - refunded + reclaimed.")]


class PortalLink(msgspec.Struct):
    url: Annotated[str, msgspec.Meta(description=(
        "Hand it to the application's customer: it signs in once, within 15 minutes, to a session of at most"
        " 8 hours that sees this application only."))]
    expires_at: datetime


REQUEST_BODIES = (ApplicationCreate, ApplicationPatch)
RESPONSE_BODIES = (Application, ApplicationPage, ApplicationDeleted, ApplicationUsage, PortalLink)


def _application(application: store.Application) -> Application:
    return Application(application.id, application.uid, application.name, application.metadata,
                       application.rate_limit_per_second, application.is_default, application.created_at,
                       application.updated_at)


def _listed(record) -> Application:
    """An application of a list page straight from its record (store.page_records). Its metadata is
    the database's JSON text, written into the answer as it is (msgspec.Raw) rather than parsed
    and encoded again: a page of 100 cost 1.5 ms of this process's CPU the other way, 0.15 this
    way. The text is jsonb's, so it only differs from an encoded dict in its spaces."""
    application_id, account_id, uid, name, metadata, rate_limit_per_second, created_at, updated_at = record
    return Application(application_id, uid, name, msgspec.Raw(metadata), rate_limit_per_second,  # type: ignore[arg-type]
                       application_id == account_id, created_at, updated_at)


def _check(uid: str | None, metadata: dict | None) -> None:
    errors = []
    if uid is not None and store.uid_is_id_shaped(uid):
        errors.append(FieldError("uid", "must not be shaped like a UUID (it would read as an application's id)"))
    if metadata is not None and len(json.dumps(metadata).encode()) > APPLICATION_METADATA_BYTES_MAX:
        errors.append(FieldError("metadata", f"must be at most {APPLICATION_METADATA_BYTES_MAX} bytes as JSON"))
    if errors:
        raise validation(errors)


async def _found(request: web.Request) -> tuple[ApiContext, uuid.UUID, store.Application]:
    """The context, the caller's account and its live application named by {app}; 404 otherwise."""
    ctx = context(request)
    account_id = await ctx.account(request)
    reference = request.match_info["app"]
    application = None
    if _REFERENCE.fullmatch(reference):
        application = await store.find(ctx.pool, account_id, reference)
    if application is None:
        raise not_found("application")
    return ctx, account_id, application


def _id_or_none(reference: str) -> uuid.UUID | None:
    try:
        return parse_id(reference)
    except ValueError:
        return None


async def _send_target(ctx: ApiContext, account_id: uuid.UUID, reference: str) -> uuid.UUID:
    """The id of the application a send names, without a query for an id or a recently seen uid."""
    application_id = _id_or_none(reference)
    if application_id is not None:
        return application_id
    if _REFERENCE.fullmatch(reference):
        application_id = await ctx.uids.id_of(account_id, reference)
    if application_id is None:
        raise not_found("application")
    return application_id


@routes.post("/v1/applications")
async def create_application(request: web.Request) -> web.Response:
    ctx = context(request)
    account_id = await ctx.account(request)
    body = decode(await request.read(), ApplicationCreate)
    _check(body.uid, body.metadata)
    return await idempotency.once(request, str(account_id), lambda executor: _create(ctx, executor, account_id, body))


async def _create(ctx: ApiContext, executor: Executor, account_id: uuid.UUID, body: ApplicationCreate) -> web.Response:
    try:
        application = await store.create_application(
            executor, account_id, body.name, uid=body.uid, metadata=body.metadata,
            rate_limit_per_second=body.rate_limit_per_second,
            outcome_wait_seconds=ctx.settings.api.commit_outcome_wait_seconds)
    except store.ApplicationLimitReached as error:
        raise Problem(409, str(error), "limit-reached") from None
    except store.UidTaken as error:
        raise Problem(409, str(error), "uid-taken") from None
    return responses.json(_application(application), 201)


@routes.get("/v1/applications")
async def list_applications(request: web.Request) -> web.Response:
    """Oldest first (the default application first of all); `cursor` is the previous page's next_cursor."""
    ctx = context(request)
    account_id = await ctx.account(request)
    query = Query(request.query)
    limit = query.limit()
    cursor = query.cursor()
    after = None
    if cursor is not None:
        after = path_id(cursor)
        if after is None:
            query.errors.append(FieldError("cursor", "is not a cursor this API returned"))
    query.check()
    records = await store.page_records(ctx.pool, account_id, after=after, limit=limit)
    data = [_listed(record) for record in records[:limit]]
    return responses.json(ApplicationPage(data, str(data[-1].id) if len(records) > limit else None))


@routes.get("/v1/applications/{app}")
async def get_application(request: web.Request) -> web.Response:
    _, _, application = await _found(request)
    return responses.json(_application(application))


@routes.patch("/v1/applications/{app}")
async def patch_application(request: web.Request) -> web.Response:
    ctx, account_id, application = await _found(request)
    body = decode(await request.read(), ApplicationPatch)
    changes = {name: value for name, value in msgspec.structs.asdict(body).items() if value is not msgspec.UNSET}
    _check(changes.get("uid"), changes.get("metadata"))
    try:
        updated = await store.update_application(ctx.pool, account_id, application.id, changes)
    except store.UidTaken as error:
        raise Problem(409, str(error), "uid-taken") from None
    if "uid" in changes:  # here at once; the other processes at the notice of its commit
        ctx.uids.forget(account_id)
    if updated is None:
        raise not_found("application")
    return responses.json(_application(updated))


@routes.delete("/v1/applications/{app}")
async def delete_application(request: web.Request) -> web.Response:
    """Deletes the application and its endpoints; their pending deliveries are refunded as when an
    endpoint is deleted. 409 for the default application."""
    ctx, account_id, application = await _found(request)
    try:
        endpoint_ids = await store.delete_application(ctx.pool, account_id, application.id)
    except store.DefaultApplication as error:
        raise Problem(409, str(error), "default-application") from None
    if application.uid is not None:  # here at once; the other processes at the notice of its commit
        ctx.uids.forget(account_id, application.uid)
    if endpoint_ids is None:
        raise not_found("application")
    refunded = 0
    for endpoint_id in endpoint_ids:  # at most ENDPOINTS_PER_APPLICATION_MAX
        refunded += await endpoint_store.delete_endpoint(ctx.pool, account_id, endpoint_id) or 0
    return responses.json(ApplicationDeleted(application.id, True, len(endpoint_ids), refunded))


@routes.post("/v1/applications/{app}/messages")
async def create_message(request: web.Request) -> web.Response:
    """As POST /v1/messages, fanned out to this application's subscribed endpoints only."""
    ctx = context(request)
    account_id = await ctx.account(request)
    reference = request.match_info["app"]
    application_id = await _send_target(ctx, account_id, reference)
    limit = ctx.settings.api.payload_bytes_max
    if request.content_length is not None and request.content_length > body_bytes_max(limit):
        raise Problem(413, f"the payload is larger than {limit} bytes", "payload-too-large")
    key = message_idempotency_key(request)
    body, payload = decode_message(await request.read())
    if len(payload) > limit:
        raise Problem(413, f"the payload is larger than {limit} bytes", "payload-too-large")
    channels = event_catalog.channels_of(body.channels)
    await ctx.catalog.check_message(account_id, body.event_type, payload)
    uid = None if application_id == _id_or_none(reference) else reference
    # A send by uid may be refused because the cached application was deleted, or lost the uid
    # (another API process changed it): the uid may name another application now, so it is looked
    # up afresh, once, and the message sent there; a refusal then is the answer.
    for last_try in (uid is None, True):
        try:
            return accepted(await submit(ctx, MessageRequest(account_id, body.event_type, payload, key,
                                                             application_id=application_id, channels=channels,
                                                             application_uid=uid)))
        except ApplicationNotFound:
            ctx.uids.forget(account_id, reference)
            if last_try:
                raise not_found("application") from None
        application_id = await _send_target(ctx, account_id, reference)
    raise AssertionError("unreachable: the last try returns or raises")


@routes.post("/v1/applications/{app}/endpoints")
async def create_endpoint(request: web.Request) -> web.Response:
    ctx, account_id, application = await _found(request)
    return await routes_endpoints.create_in(request, ctx, account_id, application.id)


@routes.get("/v1/applications/{app}/endpoints")
async def list_endpoints(request: web.Request) -> web.Response:
    ctx, account_id, application = await _found(request)
    return await routes_endpoints.list_in(ctx, account_id, application.id)


@routes.post("/v1/applications/{app}/portal-links")
async def create_portal_link(request: web.Request) -> web.Response:
    """A single-use magic link into the application's portal (/portal/): its token is shown once
    and kept only as a hash; it signs in within 15 minutes."""
    ctx, account_id, application = await _found(request)
    decode(await request.read(), Empty, optional=True)
    token, expires_at = await portal.create_link(ctx.pool, account_id, application.id)
    url = f"{request.scheme}://{request.host}/portal/sign-in?token={token}"
    return responses.json(PortalLink(url, expires_at), 201)


@routes.get("/v1/applications/{app}/usage")
async def application_usage(request: web.Request) -> web.Response:
    """The application's charges, refunds and reclaims in [since, until) (either end open when
    absent), summed from the ledger entries of its deliveries."""
    ctx, account_id, application = await _found(request)
    query = Query(request.query)
    since, until = query.timestamp("since"), query.timestamp("until")
    if since is not None and until is not None and in_utc(until) <= in_utc(since):
        query.errors.append(FieldError("until", "must be after since"))
    query.check()
    usage = await billing_usage.application_usage(ctx.pool, account_id, application.id, since, until)
    return responses.json(ApplicationUsage(
        application.id, since, until, usage.charges, usage.charged, usage.refunds, usage.refunded,
        usage.reclaims, usage.reclaimed, usage.net))


_APPLICATION = uuid.UUID("0190c5f2-4b7e-7c1a-9d1e-6f3a2b1c0d08")
_AT = datetime(2026, 1, 31, 12, 0, 0, tzinfo=UTC)
_APPLICATION_BODY = Application(id=_APPLICATION, uid="customer-4821", name="Globex", metadata={"plan": "pro"},
                                rate_limit_per_second=None, is_default=False, created_at=_AT, updated_at=_AT)
# Schema name -> an example (delivery.api.openapi shows them).
EXAMPLES: dict[str, object] = {type(instance).__name__: msgspec.json.decode(msgspec.json.encode(instance)) for instance in (
    ApplicationCreate(name="Globex", uid="customer-4821", metadata={"plan": "pro"}),
    ApplicationPatch(name="Globex Corporation"),
    _APPLICATION_BODY,
    ApplicationPage(data=[_APPLICATION_BODY], next_cursor=None),
    ApplicationDeleted(id=_APPLICATION, deleted=True, endpoints_deleted=2, refunded_now=1),
    ApplicationUsage(application_id=_APPLICATION, since=_AT, until=None, charges=120, charged=120, refunds=3,
                     refunded=3, reclaims=1, reclaimed=1, net=118),
    PortalLink(url="https://hooks.example.com/portal/sign-in?token=Xq3v0bM1r7cQ2nK8yT5wZ9aB4dF6gH0jL2pS4uV6xY8",
               expires_at=_AT),
)}
