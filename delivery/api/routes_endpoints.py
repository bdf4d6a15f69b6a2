"""Endpoints: create (URL checked against the SSRF policy, signing key sealed at rest, custom
headers checked), list, read, patch, soft-delete, rotate the signing key (to an HMAC secret or an
Ed25519 key) and read what a receiver verifies with."""

from __future__ import annotations

import uuid

import msgspec
from aiohttp import web

from billing.database import Executor
from delivery.store import endpoint_headers, signing_keys
from delivery.store import endpoints as store
from delivery.api import idempotency, responses
from delivery.api.context import ApiContext, context
from delivery.api.problems import FieldError, Problem, not_found, validation
from delivery.api.validation import EndpointCreate, EndpointPatch, SecretRotate, decode, path_id
from delivery.errors import InvalidEndpointUrlError
from delivery.engine.ssrf import validate_endpoint_url
from signing import SigningError, parse_signing_key

routes = web.RouteTableDef()


def _endpoint(endpoint: store.Endpoint) -> responses.Endpoint:
    return responses.from_row(responses.Endpoint, endpoint)


def _check_url(ctx: ApiContext, url: str) -> None:
    try:
        validate_endpoint_url(url, ctx.policy)
    except InvalidEndpointUrlError as error:
        raise validation([FieldError("url", str(error))], "the endpoint URL is not acceptable") from None


def _check_secret(secret: str | None) -> None:
    if secret is None:
        return
    try:
        parse_signing_key(secret)
    except SigningError as error:
        raise validation([FieldError("secret", str(error))], "the secret is not a valid whsec_ secret") from None


def _check_key_type(secret: str | None, key_type: str | None) -> None:
    """422 for an Ed25519 type with a secret: an Ed25519 private key is made here and never
    leaves (delivery.store.signing_keys); only an HMAC secret may be chosen."""
    if secret is not None and key_type is not None and key_type != signing_keys.key_type_of(secret):
        raise validation([FieldError("signing_key_type", (
            f"{key_type} takes no secret: an Ed25519 key is made by hookledger and only its whpk_ public key"
            " is shown; leave out secret"))], "the signing key type does not match the secret")


def _key_to_make(secret: str | None, key_type: str | None, current: str) -> str:
    """The signing key a create or a rotation sets: `secret` as given, else a new key of
    `key_type` (absent: `current`)."""
    return secret if secret is not None else signing_keys.new_key(key_type or current)


def _check_headers(headers: dict[str, str] | None) -> None:
    found = endpoint_headers.refusals(headers or {})
    if found:
        raise validation([FieldError(field, why) for field, why in found], "the custom headers are not acceptable")


def _check_event_types(event_types: list[str] | None, channels: list[str] | None = None) -> None:
    errors = []
    if event_types is not None and len(set(event_types)) != len(event_types):
        errors.append(FieldError("event_types", "lists an event type twice"))
    if channels is not None and len(set(channels)) != len(channels):
        errors.append(FieldError("channels", "lists a channel twice"))
    if errors:
        raise validation(errors)


async def endpoint_ids(request: web.Request) -> tuple[ApiContext, uuid.UUID, uuid.UUID]:
    """The context, the caller's account and the {id} of an /v1/endpoints/{id} route (404 when malformed)."""
    ctx = context(request)
    account_id = await ctx.account(request)
    endpoint_id = path_id(request.match_info["id"])
    if endpoint_id is None:
        raise not_found("endpoint")
    return ctx, account_id, endpoint_id


@routes.post("/v1/endpoints")
async def create_endpoint(request: web.Request) -> web.Response:
    """In the account's default application (POST /v1/applications/{app}/endpoints: in another)."""
    ctx = context(request)
    account_id = await ctx.account(request)
    return await create_in(request, ctx, account_id, None)


async def create_in(request: web.Request, ctx: ApiContext, account_id: uuid.UUID,
                    application_id: uuid.UUID | None) -> web.Response:
    """Create an endpoint from the request's body in an application of the account (None: its default)."""
    body = decode(await request.read(), EndpointCreate)
    _check_url(ctx, body.url)
    _check_event_types(body.event_types, body.channels)
    _check_secret(body.secret)
    _check_key_type(body.secret, body.signing_key_type)
    _check_headers(body.headers)
    return await idempotency.once(request, str(account_id),
                                  lambda executor: _create(ctx, executor, account_id, body, application_id))


async def _create(ctx: ApiContext, executor: Executor, account_id: uuid.UUID, body: EndpointCreate,
                  application_id: uuid.UUID | None) -> web.Response:
    secret = _key_to_make(body.secret, body.signing_key_type, signing_keys.HMAC)
    try:
        endpoint = await store.create_endpoint(
            executor, account_id, body.url, secret=secret, keyring=ctx.keyring,
            event_types=body.event_types, description=body.description, timeout_ms=body.timeout_ms,
            enabled=body.enabled, headers=body.headers or None, rate_limit_per_second=body.rate_limit_per_second,
            outcome_wait_seconds=ctx.settings.api.commit_outcome_wait_seconds, application_id=application_id,
            channels=body.channels,
        )
    except store.EndpointLimitReached as error:
        raise Problem(409, str(error), "limit-reached") from None
    except store.ApplicationGone:
        raise not_found("application") from None
    return responses.json(_endpoint(endpoint), 201)


@routes.get("/v1/endpoints")
async def list_endpoints(request: web.Request) -> web.Response:
    """The endpoints of the account's default application (GET /v1/applications/{app}/endpoints: another's)."""
    ctx = context(request)
    account_id = await ctx.account(request)
    return await list_in(ctx, account_id, None)


async def list_in(ctx: ApiContext, account_id: uuid.UUID, application_id: uuid.UUID | None) -> web.Response:
    endpoints = await store.list_endpoints(ctx.pool, account_id, application_id)
    return responses.json(responses.EndpointList([_endpoint(endpoint) for endpoint in endpoints]))


@routes.get("/v1/endpoints/{id}")
async def get_endpoint(request: web.Request) -> web.Response:
    ctx, account_id, endpoint_id = await endpoint_ids(request)
    endpoint = await store.get_endpoint(ctx.pool, account_id, endpoint_id)
    if endpoint is None:
        raise not_found("endpoint")
    return responses.json(_endpoint(endpoint))


@routes.patch("/v1/endpoints/{id}")
async def patch_endpoint(request: web.Request) -> web.Response:
    ctx, account_id, endpoint_id = await endpoint_ids(request)
    body = decode(await request.read(), EndpointPatch)
    changes = {name: value for name, value in msgspec.structs.asdict(body).items() if value is not msgspec.UNSET}
    if "url" in changes:
        _check_url(ctx, changes["url"])
    _check_event_types(changes.get("event_types"), changes.get("channels"))
    if "headers" in changes:
        _check_headers(changes["headers"])
        changes["headers"] = changes["headers"] or None  # {} and null both clear them
    endpoint = await store.update_endpoint(ctx.pool, account_id, endpoint_id, changes)
    if endpoint is None:
        raise not_found("endpoint")
    return responses.json(_endpoint(endpoint))


@routes.delete("/v1/endpoints/{id}")
async def delete_endpoint(request: web.Request) -> web.Response:
    ctx, account_id, endpoint_id = await endpoint_ids(request)
    refunded = await store.delete_endpoint(ctx.pool, account_id, endpoint_id)
    if refunded is None:
        raise not_found("endpoint")
    return responses.json(responses.EndpointDeleted(endpoint_id, True, refunded))


@routes.post("/v1/endpoints/{id}/secret/rotate")
async def rotate_secret(request: web.Request) -> web.Response:
    """The old key keeps signing beside the new one for the configured overlap (24 h by default),
    whatever the kinds of the two: an HMAC secret and an Ed25519 key then both sign (v1 and v1a)."""
    ctx, account_id, endpoint_id = await endpoint_ids(request)
    body = decode(await request.read(), SecretRotate, optional=True)
    _check_secret(body.secret)
    _check_key_type(body.secret, body.signing_key_type)
    return await idempotency.once(request, str(account_id),
                                  lambda executor: _rotate(ctx, executor, account_id, endpoint_id, body))


async def _rotate(ctx: ApiContext, executor: Executor, account_id: uuid.UUID, endpoint_id: uuid.UUID,
                  body: SecretRotate) -> web.Response:
    current = signing_keys.HMAC
    if body.secret is None and body.signing_key_type is None:
        endpoint = await store.get_endpoint(executor, account_id, endpoint_id)
        if endpoint is None:
            raise not_found("endpoint")
        current = endpoint.signing_key_type  # a rotation keeps the kind unless told otherwise
    secret = _key_to_make(body.secret, body.signing_key_type, current)
    rotated = await store.rotate_secret(
        executor, account_id, endpoint_id, secret=secret, keyring=ctx.keyring,
        overlap_seconds=ctx.settings.api.secret_rotation_overlap_seconds,
    )
    if not rotated:
        raise not_found("endpoint")
    return responses.json(_secret(signing_keys.shown(secret)))


@routes.get("/v1/endpoints/{id}/secret")
async def read_secret(request: web.Request) -> web.Response:
    ctx, account_id, endpoint_id = await endpoint_ids(request)
    shown = await store.read_secret(ctx.pool, account_id, endpoint_id, ctx.keyring)
    if shown is None:
        raise not_found("endpoint")
    return responses.json(_secret(shown))


def _secret(shown: str) -> responses.EndpointSecret:
    """What a receiver verifies with (a whsec_ secret or a whpk_ public key; never a whsk_)."""
    return responses.EndpointSecret(shown, signing_keys.shown_key_type(shown))
