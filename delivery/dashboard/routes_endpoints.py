"""Endpoints: list with health, create, edit (event types, rate limit, custom headers), disable/enable,
rotate (to either signing key type) and reveal the secret.

Input goes through the API's own checks: the body Structs of delivery.api.validation (lengths,
event type syntax, timeouts), the SSRF policy of delivery.engine.ssrf, and for the rate limit,
custom headers and signing key type delivery.dashboard.endpoint_controls (the API's rules, read
from form text); a refused form lists every error and writes nothing. Writes go through
delivery.store.endpoints. Revealing or rotating a secret is a POST behind a confirmation page, so a
secret never sits in a URL or the history, and no link or prefetch can show or change one.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

import msgspec
from aiohttp import web

from billing.errors import AccountNotActive
from delivery.store import endpoints as store
from delivery.store import signing_keys
from delivery.api.problems import Problem, not_found
from delivery.api.validation import EndpointCreate, EndpointPatch, decode, path_id
from delivery.dashboard import endpoint_controls, pages, queries
from delivery.errors import InvalidEndpointUrlError
from delivery.engine.ssrf import validate_endpoint_url

routes = web.RouteTableDef()

_SEPARATORS = re.compile(r"[\s,]+")


@dataclass(frozen=True)
class Health:
    endpoint: store.Endpoint
    attempts: int  # in the last 24 hours
    succeeded: int
    last_at: object

    @property
    def success_percent(self) -> int | None:
        return None if not self.attempts else round(100 * self.succeeded / self.attempts)


async def endpoint_health(pool, account_id: uuid.UUID, endpoints: list[store.Endpoint]) -> list[Health]:
    """Each endpoint with its attempts of the last 24 hours (one query for all of them)."""
    counts = await queries.endpoint_attempts(pool, account_id)
    health = []
    for endpoint in endpoints:
        row = counts.get(endpoint.id)
        health.append(Health(endpoint, row["attempts"] if row else 0, row["succeeded"] if row else 0,
                             row["last_at"] if row else None))
    return health


def _event_types(raw: object) -> list[str] | None:
    """The form's event types (comma or space separated, repeats dropped); none given means every type."""
    names = [name for name in _SEPARATORS.split(raw if isinstance(raw, str) else "") if name]
    return list(dict.fromkeys(names)) or None


LABELS = {"url": "URL", "description": "Description", "event_types": "Event type"}


def _errors(problem: Problem, fields: dict) -> list[str]:
    return pages.error_lines(problem, LABELS, fields)


async def _endpoint(request: web.Request) -> tuple[uuid.UUID, store.Endpoint]:
    account_id = pages.account_id(request)
    endpoint_id = path_id(request.match_info["id"])
    endpoint = None if endpoint_id is None else await store.get_endpoint(pages.api(request).pool, account_id, endpoint_id)
    if endpoint is None:
        raise not_found("endpoint")
    return account_id, endpoint


@routes.get("/endpoints")
async def list_endpoints(request: web.Request) -> web.Response:
    account_id = pages.account_id(request)
    pool = pages.api(request).pool
    health = await endpoint_health(pool, account_id, await store.list_endpoints(pool, account_id))
    return pages.render(request, "endpoints.html", {"health": health, "form": {}, "errors": []})


@routes.post("/endpoints")
async def create_endpoint(request: web.Request) -> web.Response:
    account_id = pages.account_id(request)
    ctx = pages.api(request)
    form = await pages.form(request)
    fields = {"url": str(form.get("url", "")).strip(), "description": str(form.get("description", "")).strip(),
              "event_types": _event_types(form.get("event_types"))}
    # Every error at once: the body's checks, the URL policy, then the controls'.
    body, errors = _checked(fields, ctx.policy)
    rate_limit, rate_limit_errors = endpoint_controls.rate_limit(form.get("rate_limit_per_second"))
    headers, header_errors = endpoint_controls.headers(form.get("headers"))
    key_type, key_type_errors = endpoint_controls.key_type(form.get("signing_key_type"), signing_keys.HMAC)
    errors += rate_limit_errors + header_errors + key_type_errors
    if body is not None and not errors:
        try:
            endpoint = await store.create_endpoint(
                ctx.pool, account_id, body.url, secret=signing_keys.new_key(key_type), keyring=ctx.keyring,
                event_types=body.event_types, description=body.description, timeout_ms=body.timeout_ms,
                headers=headers, rate_limit_per_second=rate_limit,
                outcome_wait_seconds=ctx.settings.api.commit_outcome_wait_seconds,
            )
        except (store.EndpointLimitReached, AccountNotActive) as error:
            errors = [str(error)]
    if errors:
        health = await endpoint_health(ctx.pool, account_id, await store.list_endpoints(ctx.pool, account_id))
        return pages.render(request, "endpoints.html", {
            "health": health, "errors": errors, "form": {**fields, **_typed(form)},
        }, status=422)
    raise pages.redirect(f"/dashboard/endpoints/{endpoint.id}?created=1")


def _typed(form) -> dict[str, str]:
    """What was typed in the text fields, to show again beside the errors."""
    names = ("event_types", "rate_limit_per_second", "headers", "signing_key_type")
    return {name: str(form.get(name, "")) for name in names if name in form}


def _checked(fields: dict, policy) -> tuple[EndpointCreate | None, list[str]]:
    """The new endpoint's body, or None and every reason it is refused."""
    body, errors = None, []
    try:
        body = decode(msgspec.json.encode(fields), EndpointCreate)
    except Problem as problem:
        errors = _errors(problem, fields)
    if fields["url"] and not any(line.startswith("URL ") for line in errors):
        try:
            validate_endpoint_url(fields["url"], policy)
        except InvalidEndpointUrlError as error:
            errors.insert(0, f"URL: {error}")
    return (body if not errors else None), errors


@routes.get("/endpoints/{id}")
async def show_endpoint(request: web.Request) -> web.Response:
    _, endpoint = await _endpoint(request)
    return pages.render(request, "endpoint.html", {
        "endpoint": endpoint, "errors": [], "notice": _notice(request.query), "form": _shown(endpoint),
    })


def _shown(endpoint: store.Endpoint) -> dict[str, str]:
    """The edit form's fields as the endpoint has them now."""
    return {
        "description": endpoint.description,
        "event_types": ", ".join(endpoint.event_types) if endpoint.event_types else "",
        "rate_limit_per_second": "" if endpoint.rate_limit_per_second is None else str(endpoint.rate_limit_per_second),
        "headers": endpoint_controls.headers_text(endpoint.headers),
    }


def _notice(query) -> str | None:
    return {"created": "Endpoint created. Reveal its signing secret below to verify what it receives.",
            "saved": "Saved.", "enabled": "Endpoint enabled.", "disabled": "Endpoint disabled: its pending"
            " deliveries are refunded when their turn comes."}.get(next(iter(query), ""))


@routes.post("/endpoints/{id}")
async def edit_endpoint(request: web.Request) -> web.Response:
    """Change the description, the event types the endpoint receives, and (when the form carries
    them) its rate limit and custom headers; an empty one of those two clears it."""
    account_id, endpoint = await _endpoint(request)
    form = await pages.form(request)
    changes = {"description": str(form.get("description", "")).strip(),
               "event_types": _event_types(form.get("event_types"))}
    errors: list[str] = []
    if "rate_limit_per_second" in form:
        changes["rate_limit_per_second"], found = endpoint_controls.rate_limit(form.get("rate_limit_per_second"))
        errors += found
    if "headers" in form:
        changes["headers"], found = endpoint_controls.headers(form.get("headers"))
        errors += found
    try:
        body = decode(msgspec.json.encode(changes), EndpointPatch)
    except Problem as problem:
        errors = _errors(problem, changes) + errors
    if errors:
        return pages.render(request, "endpoint.html", {
            "endpoint": endpoint, "errors": errors, "notice": None,
            "form": {**_shown(endpoint), "description": changes["description"], **_typed(form)},
        }, status=422)
    updated = await store.update_endpoint(pages.api(request).pool, account_id, endpoint.id,
                                          {name: getattr(body, name) for name in changes})
    if updated is None:
        raise not_found("endpoint")
    raise pages.redirect(f"/dashboard/endpoints/{endpoint.id}?saved=1")


@routes.post("/endpoints/{id}/enabled")
async def set_enabled(request: web.Request) -> web.Response:
    account_id, endpoint = await _endpoint(request)
    enabled = (await pages.form(request)).get("enabled") == "true"
    if await store.update_endpoint(pages.api(request).pool, account_id, endpoint.id, {"enabled": enabled}) is None:
        raise not_found("endpoint")
    raise pages.redirect(f"/dashboard/endpoints/{endpoint.id}?{'enabled' if enabled else 'disabled'}=1")


@routes.get("/endpoints/{id}/secret/{action:reveal|rotate}")
async def confirm_secret(request: web.Request) -> web.Response:
    _, endpoint = await _endpoint(request)
    return _confirm_page(request, endpoint, request.match_info["action"], [], endpoint.signing_key_type)


def _confirm_page(request: web.Request, endpoint: store.Endpoint, action: str, errors: list[str],
                  key_type: str) -> web.Response:
    overlap_hours = pages.api(request).settings.api.secret_rotation_overlap_seconds / 3600
    return pages.render(request, "secret_confirm.html", {
        "endpoint": endpoint, "action": action, "overlap_hours": overlap_hours, "errors": errors,
        "key_type": key_type, "key_types": endpoint_controls.KEY_TYPE_LABELS,
    }, status=422 if errors else 200)


@routes.post("/endpoints/{id}/secret/reveal")
async def reveal_secret(request: web.Request) -> web.Response:
    account_id, endpoint = await _endpoint(request)
    ctx = pages.api(request)
    secret = await store.read_secret(ctx.pool, account_id, endpoint.id, ctx.keyring)
    if secret is None:
        raise not_found("endpoint secret")
    return pages.render(request, "secret.html", {"endpoint": endpoint, "secret": secret, "rotated": False})


@routes.post("/endpoints/{id}/secret/rotate")
async def rotate_secret(request: web.Request) -> web.Response:
    """A new signing key now, of the kind chosen (absent: the kind it has); the old one keeps signing
    beside it for the configured overlap, across kinds too. An Ed25519 key shows its whpk_ only."""
    account_id, endpoint = await _endpoint(request)
    ctx = pages.api(request)
    form = await pages.form(request)
    key_type, errors = endpoint_controls.key_type(form.get("signing_key_type"), endpoint.signing_key_type)
    if errors:
        return _confirm_page(request, endpoint, "rotate", errors, endpoint.signing_key_type)
    secret = signing_keys.new_key(key_type)
    rotated = await store.rotate_secret(ctx.pool, account_id, endpoint.id, secret=secret, keyring=ctx.keyring,
                                        overlap_seconds=ctx.settings.api.secret_rotation_overlap_seconds)
    if not rotated:
        raise not_found("endpoint")
    return pages.render(request, "secret.html",
                        {"endpoint": endpoint, "secret": signing_keys.shown(secret), "rotated": True})
