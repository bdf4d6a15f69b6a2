"""What every dashboard page shares: rendering, security headers, errors as pages, sign-in and CSRF checks.

Middlewares, outermost first:
    security_headers   CSP (`default-src 'self'`, no inline script or style), no framing,
                       no caching of pages, no referrer to other sites, no MIME sniffing; on every answer.
    errors_as_pages    a Problem, a billing error or an HTTP error becomes an HTML page with its
                       status: errors are shown, not swallowed; unexpected ones are logged.
    authenticate       finds the session for every route but sign-in and static files (no
                       session: to the sign-in page), and checks the CSRF token on every POST.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import aiohttp_jinja2
import structlog
from aiohttp import web

from billing.errors import BillingError
from billing.database import NotWritten, OutcomeUnknown
from delivery.store import connection_loss
from delivery.api import problems
from delivery.api.context import CONTEXT, ApiContext
from delivery.api.problems import Problem
from delivery.dashboard import csrf, session as sessions
from delivery.dashboard.session import Session

log = structlog.get_logger("hookledger.dashboard")

PREFIX = "/dashboard"
PUBLIC_PATHS = (f"{PREFIX}/sign-in", f"{PREFIX}/static/")
FORM_BYTES_MAX = 64 * 1024
# The request's Session, set by `authenticate` (a typed key where aiohttp has them).
SESSION = web.RequestKey("dashboard_session", Session) if hasattr(web, "RequestKey") else "dashboard_session"

CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self';"
    " form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: under no-referrer browsers send `Origin: null` on our own
    # form posts, and the Origin check (csrf.same_origin) must tell ours from a foreign one.
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def api(request: web.Request) -> ApiContext:
    """The API's context (pool, settings, keyring, queue): the dashboard is one more client of it."""
    return request.config_dict[CONTEXT]


def current(request: web.Request) -> Session:
    return request[SESSION]


def account_id(request: web.Request) -> uuid.UUID:
    """The signed-in account; the operator has no account pages (403)."""
    session = current(request)
    if session.account_id is None:
        raise Problem(403, "this page is for an account; the operator key has its own pages", "forbidden")
    return session.account_id


def require_operator(request: web.Request) -> None:
    if not current(request).is_operator:
        raise Problem(403, "this page is for the operator", "forbidden")


def render(request: web.Request, template: str, context: dict | None = None, *, status: int = 200) -> web.Response:
    """A page, with the session and its CSRF token (for the forms) always at hand."""
    session = request.get(SESSION)
    page = {
        "session": session,
        "csrf_token": csrf.session_token(session.token) if session is not None else "",
        "path": request.path,
    }
    page.update(context or {})
    return aiohttp_jinja2.render_template(template, request, page, status=status)


def redirect(location: str) -> web.HTTPSeeOther:
    return web.HTTPSeeOther(location)


def error_lines(problem: Problem, labels: dict[str, str], values: dict[str, object] | None = None) -> list[str]:
    """A refusal's field errors as sentences a form can show, every one: "URL must not be empty",
    "Event type “a b” may contain only letters, ...". An item of a list is named by its value."""
    lines = []
    for error in problem.errors:
        name, bracket, rest = error.field.partition("[")
        label = labels.get(name, name)
        if bracket:
            index = int(rest.split("]", 1)[0]) if rest.split("]", 1)[0].isdigit() else -1
            items = (values or {}).get(name) or []
            label = f"{label} “{items[index]}”" if 0 <= index < len(items) else f"{label} {index + 1}"
        lines.append(f"{label} {error.message.replace(' or null,', ',')}")  # a form's empty field is its null
    return lines or [problem.detail]


async def form(request: web.Request):
    """The posted form (read once: the CSRF check has already read it)."""
    return await request.post()


def headers_middleware(headers_for):
    """A middleware that puts `headers_for(request)` on every answer, errors raised as answers too."""

    @web.middleware
    async def with_headers(request: web.Request, handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as error:
            error.headers.update(headers_for(request))
            raise
        response.headers.update(headers_for(request))
        return response

    return with_headers


def _headers_for(request: web.Request) -> dict[str, str]:
    headers = dict(SECURITY_HEADERS)
    if not request.path.startswith(f"{PREFIX}/static/"):
        headers["Cache-Control"] = "no-store"
    return headers


security_headers = headers_middleware(_headers_for)


@web.middleware
async def errors_as_pages(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Problem as problem:
        return _error_page(request, problem)
    except BillingError as error:
        return _error_page(request, problems.from_billing(error))
    except web.HTTPException as error:
        if error.status < 400:
            raise
        detail = "there is no such page" if error.status == 404 else (error.text or error.reason)
        return _error_page(request, Problem(error.status, detail))
    except OutcomeUnknown as error:  # a COMMIT answer lost, and no way to check it in time
        log.error("write outcome unknown", method=request.method, path=request.path, error=repr(error))
        return _error_page(request, problems.write_outcome_unknown(keyed=False, look_for=error.look_for))
    except NotWritten as error:  # a COMMIT answer lost, and the database says it did not take effect
        log.warning("write not committed", method=request.method, path=request.path, error=repr(error))
        return _error_page(request, problems.write_failed())
    except connection_loss.UNAVAILABLE as error:
        log.warning("database unavailable", method=request.method, path=request.path, error=repr(error))
        return _error_page(request, Problem(503, "the database is unavailable; try again in a moment",
                                            "database-unavailable", headers={"Retry-After": "1"}))
    except Exception:
        log.exception("unhandled dashboard error", method=request.method, path=request.path)
        return _error_page(request, Problem(500, "an unexpected error occurred; it was logged", "internal"))


def _error_page(request: web.Request, problem: Problem) -> web.Response:
    title = problems._TITLES.get(problem.status, "Error")
    response = render(request, "error.html", {"problem": problem, "title": title}, status=problem.status)
    if problem.headers:
        response.headers.update(problem.headers)
    return response


@web.middleware
async def authenticate(request: web.Request, handler) -> web.StreamResponse:
    if request.path.startswith(PUBLIC_PATHS) or request.path == PREFIX:
        return await handler(request)
    session = await sessions.lookup(api(request).pool, request)
    if session is None:
        if request.method in ("GET", "HEAD"):
            raise redirect(f"{PREFIX}/sign-in")
        raise Problem(401, "your session has ended; sign in again", "unauthorized")
    request[SESSION] = session
    if request.method == "POST":
        submitted = (await request.post()).get(csrf.FIELD)
        if not csrf.same_origin(request) or not csrf.matches(csrf.session_token(session.token), submitted):
            raise Problem(403, "the form's security token is missing or wrong; reload the page and try again",
                          "csrf")
    return await handler(request)


# ---- template filters -----------------------------------------------------------------------------

def credits(value: int | None) -> str:
    return "—" if value is None else f"{value:,}".replace(",", "\u202f")


def timestamp(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def short_id(value: object) -> str:
    return str(value)[-12:] if value is not None else "—"


def header_pairs(stored: str | dict | None) -> list[tuple[str, str]]:
    """Custom headers (a jsonb column's text, or already a dict) as (name, value) pairs sorted by name."""
    if stored is None:
        return []
    headers = json.loads(stored) if isinstance(stored, str) else stored
    return sorted(headers.items(), key=lambda pair: pair[0].lower()) if isinstance(headers, dict) else []


FILTERS = {"credits": credits, "timestamp": timestamp, "short_id": short_id, "header_pairs": header_pairs}
