"""A portal endpoint's page: edit its URL, the event types it receives (from the account's catalog,
or wildcards) and its channels; disable or enable it; reveal or rotate its signing secret.

The edit goes through the API's own checks: each field decoded by delivery.api.validation's
EndpointPatch (lengths, event type and channel syntax, counts) and the URL through the SSRF policy
of delivery.engine.ssrf; a refused form lists every field's error in words and changes nothing.
Writes go through delivery.store.endpoints, the API's: a rotation keeps the old secret signing beside
the new one for the configured overlap (24 h by default). Revealing and rotating are POSTs behind a
confirmation page, so a secret never sits in a URL or a history. Only this application's endpoints
answer; any other id is a 404.
"""

from __future__ import annotations

import re

import msgspec
from aiohttp import web

from billing.tables import EVENT_TYPES_PER_ACCOUNT_MAX
from delivery.api.problems import Problem, not_found
from delivery.api.validation import EndpointPatch, decode
from delivery.dashboard import pages
from delivery.dashboard.portal_pages import PREFIX, own_endpoint, render, session
from delivery.engine.ssrf import validate_endpoint_url
from delivery.errors import InvalidEndpointUrlError
from delivery.store import endpoints as endpoint_store
from delivery.store import event_types as event_type_store
from delivery.store import signing_keys

routes = web.RouteTableDef()

_SEPARATORS = re.compile(r"[\s,]+")
LABELS = {"url": "URL", "event_types": "Event type", "channels": "Channel"}
NOTICES = {"saved": "Saved.", "enabled": "Endpoint enabled.",
           "disabled": "Endpoint disabled: it receives nothing until you enable it again."}


def _names(raw: object) -> list[str]:
    return [name for name in _SEPARATORS.split(raw if isinstance(raw, str) else "") if name]


async def _page(request: web.Request, endpoint, *, errors: list[str] | None = None, form: dict | None = None,
                status: int = 200) -> web.Response:
    current = session(request)
    catalog = await event_type_store.page(pages.api(request).pool, current.account_id, after=None,
                                          limit=EVENT_TYPES_PER_ACCOUNT_MAX, include_archived=False)
    chosen = form["event_types"] if form is not None else list(endpoint.event_types or [])
    names = [event_type.name for event_type in catalog]
    described = {event_type.name: event_type.description for event_type in catalog}
    # The catalog's types, and any exact type the endpoint has that the catalog no longer lists.
    listed = names + [name for name in chosen if name not in names and not name.endswith(".*")]
    others = [name for name in chosen if name not in listed]
    shown = form or {"url": endpoint.url, "channels": list(endpoint.channels or [])}
    return render(request, "portal_endpoint.html", {
        "endpoint": endpoint, "errors": errors or [], "listed": listed, "described": described,
        "chosen": set(chosen), "others": ", ".join(others), "url": shown["url"],
        "channels": ", ".join(shown["channels"] or []), "notice": NOTICES.get(next(iter(request.query), "")),
    }, status=status)


@routes.get("/endpoints/{id}")
async def show_endpoint(request: web.Request) -> web.Response:
    return await _page(request, await own_endpoint(request))


def checked_changes(fields: dict, policy) -> tuple[dict, list[str]]:
    """The changes an edit form asks for, and every reason it is refused: each field decoded on
    its own by the API's EndpointPatch (so one field's error does not hide another's), then the URL
    through the SSRF policy."""
    changes, errors = {}, []
    for name, value in fields.items():
        try:
            body = decode(msgspec.json.encode({name: value}), EndpointPatch)
        except Problem as problem:
            errors += pages.error_lines(problem, LABELS, fields)
            continue
        changes[name] = getattr(body, name)
    if "url" in changes:
        try:
            validate_endpoint_url(changes["url"], policy)
        except InvalidEndpointUrlError as error:
            errors.insert(0, f"URL: {error}")
    return (changes if not errors else {}), errors


@routes.post("/endpoints/{id}")
async def edit_endpoint(request: web.Request) -> web.Response:
    endpoint = await own_endpoint(request)
    ctx = pages.api(request)
    form = await request.post()
    event_types = list(dict.fromkeys(form.getall("event_type", []) + _names(form.get("more_event_types"))))
    fields = {"url": str(form.get("url", "")).strip(), "event_types": [str(name) for name in event_types] or None,
              "channels": list(dict.fromkeys(_names(form.get("channels")))) or None}
    changes, errors = checked_changes(fields, ctx.policy)
    if errors:
        shown = {"url": fields["url"], "event_types": fields["event_types"] or [], "channels": fields["channels"]}
        return await _page(request, endpoint, errors=errors, form=shown, status=422)
    if await endpoint_store.update_endpoint(ctx.pool, session(request).account_id, endpoint.id, changes) is None:
        raise not_found("endpoint")
    raise web.HTTPSeeOther(f"{PREFIX}/endpoints/{endpoint.id}?saved=1")


@routes.post("/endpoints/{id}/enabled")
async def set_enabled(request: web.Request) -> web.Response:
    endpoint = await own_endpoint(request)
    enabled = (await request.post()).get("enabled") == "true"
    if await endpoint_store.update_endpoint(pages.api(request).pool, session(request).account_id, endpoint.id,
                                            {"enabled": enabled}) is None:
        raise not_found("endpoint")
    raise web.HTTPSeeOther(f"{PREFIX}/endpoints/{endpoint.id}?{'enabled' if enabled else 'disabled'}=1")


@routes.get("/endpoints/{id}/secret/{action:reveal|rotate}")
async def confirm_secret(request: web.Request) -> web.Response:
    endpoint = await own_endpoint(request)
    overlap_hours = pages.api(request).settings.api.secret_rotation_overlap_seconds / 3600
    return render(request, "portal_secret.html", {"endpoint": endpoint, "action": request.match_info["action"],
                                                  "overlap_hours": overlap_hours, "secret": None})


@routes.post("/endpoints/{id}/secret/reveal")
async def reveal_secret(request: web.Request) -> web.Response:
    endpoint = await own_endpoint(request)
    ctx = pages.api(request)
    secret = await endpoint_store.read_secret(ctx.pool, session(request).account_id, endpoint.id, ctx.keyring)
    if secret is None:
        raise not_found("endpoint secret")
    return render(request, "portal_secret.html", {"endpoint": endpoint, "action": "reveal", "secret": secret})


@routes.post("/endpoints/{id}/secret/rotate")
async def rotate_secret(request: web.Request) -> web.Response:
    """A new secret of the endpoint's kind now; the old one keeps signing beside it for the overlap."""
    endpoint = await own_endpoint(request)
    ctx = pages.api(request)
    secret = signing_keys.new_key(endpoint.signing_key_type)
    rotated = await endpoint_store.rotate_secret(ctx.pool, session(request).account_id, endpoint.id, secret=secret,
                                                 keyring=ctx.keyring,
                                                 overlap_seconds=ctx.settings.api.secret_rotation_overlap_seconds)
    if not rotated:
        raise not_found("endpoint")
    return render(request, "portal_secret.html", {"endpoint": endpoint, "action": "rotate",
                                                  "secret": signing_keys.shown(secret)})
