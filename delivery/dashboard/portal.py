"""The customer portal at /portal/: an application's customer, signed in with a magic link from
POST /v1/applications/{app}/portal-links, sees that application only.

It lists the application's endpoints (add one, delete one, send it a test event) and its newest
deliveries, and replays a dead one; a test event and a replay are real deliveries, charged to the
account, their price shown on the button. An endpoint's page edits it and shows or rotates its
secret (portal_endpoints.py); a delivery's page shows its attempts, payload and headers
(portal_deliveries.py). It shows nothing of the account's balance or ledger. Pages are served as
the dashboard's are: the same security headers (CSP; framing only by the origins the account
lists, portal_pages.py), errors as pages, and a CSRF token derived from the session on every form;
the session cookie is HttpOnly and scoped to /portal. Another application's or account's id
answers 404; a session whose application was deleted signs out.

The sign-in link is a GET that shows a button, and only the button's POST uses the link: a mail
scanner that fetches the link does not spend it.
"""

from __future__ import annotations

import aiohttp_jinja2
import jinja2
import msgspec
from aiohttp import web

from billing.errors import BillingError
from billing.messages import MessageRequest
from delivery.api import problems
from delivery.api.problems import Problem, not_found
from delivery.api.routes_messages import submit
from delivery.api.validation import EndpointCreate, decode, path_id
from delivery.dashboard import csrf, pages, portal_deliveries, portal_endpoints, portal_pages
from delivery.dashboard.portal_pages import FRAME_ANCESTORS, PREFIX, SESSION
from delivery.engine.ssrf import validate_endpoint_url
from delivery.errors import InvalidEndpointUrlError
from delivery.store import endpoints as endpoint_store
from delivery.store import portal
from signing import generate_secret

DELIVERIES_SHOWN = 50
TEST_EVENT_TYPE = "webhook.test"
TEST_PAYLOAD = b'{"test":true,"sent_from":"the webhook portal"}'

routes = web.RouteTableDef()
_session = portal_pages.session
_render = portal_pages.render
_own_endpoint = portal_pages.own_endpoint


@web.middleware
async def _errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Problem as problem:
        return _render(request, "portal_error.html", {"problem": problem}, status=problem.status)
    except BillingError as error:  # a test event or a replay the account's balance cannot cover, say
        problem = problems.from_billing(error)
        return _render(request, "portal_error.html", {"problem": problem}, status=problem.status)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        problem = Problem(error.status, "there is no such page" if error.status == 404 else error.reason)
        return _render(request, "portal_error.html", {"problem": problem}, status=error.status)


@web.middleware
async def _authenticate(request: web.Request, handler) -> web.StreamResponse:
    if request.path.startswith(f"{PREFIX}/sign-in"):
        return await handler(request)
    session = await portal.lookup(pages.api(request).pool, request.cookies.get(portal_pages.COOKIE_NAME))
    if session is None:
        raise Problem(401, "sign in with the link you were given; a link works once, within 15 minutes",
                      "unauthorized")
    request[SESSION] = session
    request[FRAME_ANCESTORS] = session.frame_ancestors
    if request.method == "POST":
        submitted = (await request.post()).get(csrf.FIELD)
        if not csrf.same_origin(request) or not csrf.matches(csrf.session_token(session.token), submitted):
            raise Problem(403, "the form's security token is missing or wrong; reload the page and try again", "csrf")
    return await handler(request)


@routes.get("/sign-in")
async def sign_in_page(request: web.Request) -> web.Response:
    token = request.query.get("token", "")
    if not portal.well_formed(token):
        raise not_found("sign-in link")
    request[FRAME_ANCESTORS] = await portal.link_frame_ancestors(pages.api(request).pool, token)
    return _render(request, "portal_sign_in.html", {"token": token})


@routes.post("/sign-in")
async def sign_in(request: web.Request) -> web.Response:
    if not csrf.same_origin(request):
        raise Problem(403, "sign in from the page the link opens", "csrf")
    form = await request.post()
    link_token = str(form.get("token", ""))
    request[FRAME_ANCESTORS] = await portal.link_frame_ancestors(pages.api(request).pool, link_token)
    session_token = await portal.sign_in(pages.api(request).pool, link_token)
    if session_token is None:
        raise Problem(404, "this link was used already, has expired, or its application no longer exists;"
                      " ask for a new one", "not-found")
    session = await portal.lookup(pages.api(request).pool, session_token)
    frame_ancestors = session.frame_ancestors if session is not None else ()
    request[FRAME_ANCESTORS] = frame_ancestors
    response = web.HTTPSeeOther(f"{PREFIX}/")
    portal_pages.set_session_cookie(response, request, session_token, frame_ancestors)
    raise response


@routes.post("/sign-out")
async def sign_out(request: web.Request) -> web.Response:
    await portal.sign_out(pages.api(request).pool, _session(request).token)
    response = web.HTTPSeeOther(f"{PREFIX}/signed-out")
    portal_pages.set_session_cookie(response, request, "", _session(request).frame_ancestors, max_age=0)
    raise response


@routes.get("/")
async def home(request: web.Request, *, errors: list[str] | None = None, status: int = 200) -> web.Response:
    session = _session(request)
    pool = pages.api(request).pool
    endpoints = await endpoint_store.list_endpoints(pool, session.account_id, session.application_id)
    deliveries = await portal.deliveries(pool, session.account_id, session.application_id, DELIVERIES_SHOWN)
    price = await pool.fetchval("SELECT price_per_delivery FROM accounts WHERE id = $1", session.account_id)
    return _render(request, "portal_home.html", {"endpoints": endpoints, "deliveries": deliveries, "price": price,
                                                 "errors": errors or []}, status=status)


@routes.post("/endpoints")
async def add_endpoint(request: web.Request) -> web.Response:
    session = _session(request)
    ctx = pages.api(request)
    form = await request.post()
    fields = {"url": str(form.get("url", "")).strip()}
    types = [name for name in str(form.get("event_types", "")).replace(",", " ").split() if name]
    if types:
        fields["event_types"] = list(dict.fromkeys(types))
    try:
        body = decode(msgspec.json.encode(fields), EndpointCreate)
        validate_endpoint_url(body.url, ctx.policy)
    except Problem as problem:
        return await home(request, errors=pages.error_lines(problem, {"url": "URL", "event_types": "Event type"},
                                                            fields), status=422)
    except InvalidEndpointUrlError as error:
        return await home(request, errors=[f"URL {error}"], status=422)
    try:
        await endpoint_store.create_endpoint(
            ctx.pool, session.account_id, body.url, secret=generate_secret(), keyring=ctx.keyring,
            event_types=body.event_types, application_id=session.application_id,
            outcome_wait_seconds=ctx.settings.api.commit_outcome_wait_seconds)
    except (endpoint_store.EndpointLimitReached, endpoint_store.ApplicationGone) as error:
        return await home(request, errors=[str(error)], status=409)
    raise web.HTTPSeeOther(f"{PREFIX}/")


@routes.post("/endpoints/{id}/delete")
async def delete_endpoint(request: web.Request) -> web.Response:
    endpoint = await _own_endpoint(request)
    await endpoint_store.delete_endpoint(pages.api(request).pool, _session(request).account_id, endpoint.id)
    raise web.HTTPSeeOther(f"{PREFIX}/")


@routes.post("/endpoints/{id}/test")
async def send_test_event(request: web.Request) -> web.Response:
    """A webhook.test event to one endpoint of this application: a real delivery, charged to the account."""
    endpoint = await _own_endpoint(request)
    session = _session(request)
    await submit(pages.api(request), MessageRequest(session.account_id, TEST_EVENT_TYPE, TEST_PAYLOAD,
                                                    endpoint_ids=(endpoint.id,), application_id=session.application_id))
    raise web.HTTPSeeOther(f"{PREFIX}/")


@routes.post("/deliveries/{id}/replay")
async def replay(request: web.Request) -> web.Response:
    """A dead delivery of this application, sent again: a new delivery, charged to the account."""
    session = _session(request)
    ctx = pages.api(request)
    delivery_id = path_id(request.match_info["id"])
    row = None if delivery_id is None else await portal.delivery_of(ctx.pool, session.account_id,
                                                                    session.application_id, delivery_id)
    if row is None:
        raise not_found("delivery")
    if row["state"] != "dead" or row["payload"] is None:
        raise Problem(409, "only a dead delivery whose payload is kept can be replayed", "not-replayable")
    await submit(ctx, MessageRequest(session.account_id, row["event_type"], bytes(row["payload"]),
                                     endpoint_ids=(row["endpoint_id"],), replay_of=delivery_id,
                                     application_id=session.application_id))
    raise web.HTTPSeeOther(f"{PREFIX}/")


@routes.get("/signed-out")
async def signed_out(request: web.Request) -> web.Response:
    return _render(request, "portal_error.html", {"problem": Problem(200, "you have signed out")})


def setup(app: web.Application) -> web.Application:
    """Mount the portal on the API app at /portal."""
    portal_app = web.Application(middlewares=[portal_pages.security_headers, _errors, _authenticate],
                                 client_max_size=pages.FORM_BYTES_MAX)
    aiohttp_jinja2.setup(portal_app, loader=jinja2.PackageLoader("delivery.dashboard", "templates"), autoescape=True,
                         undefined=jinja2.StrictUndefined, filters=pages.FILTERS)
    for table in (routes, portal_endpoints.routes, portal_deliveries.routes):
        portal_app.add_routes(table)
    app.add_subapp(PREFIX, portal_app)
    return portal_app
