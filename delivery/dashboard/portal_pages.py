"""What every portal page shares: the signed-in session, rendering, the endpoint of this application
behind an {id}, the security headers with the account's frame-ancestors, and the session cookie.

Framing: the portal refuses to be framed (CSP `frame-ancestors 'none'`, X-Frame-Options DENY)
unless its account lists origins (accounts.portal_frame_ancestors, PATCH /v1/account); then its CSP
names exactly those origins, X-Frame-Options goes (it cannot name origins, and a browser that
knows frame-ancestors ignores it anyway), and the session cookie is SameSite=None; Secure;
Partitioned, so that it is sent inside the embedding page's iframe (and, partitioned, only there
and on the portal itself).

CSRF without SameSite=Strict: a cross-site page can then make the browser send the cookie, so the
form token (an HMAC of the session token, csrf.py, checked on every POST) is what stops a forged
POST; the Origin check stays a second line (a form inside the iframe posts with the portal's own
origin). Every GET is read-only, and revealing or rotating a secret is a POST behind a
confirmation page, so neither a link nor another site's framing of a page can show or change one.
"""

from __future__ import annotations

from http.cookies import SimpleCookie

import aiohttp_jinja2
from aiohttp import web

from delivery.api.problems import not_found
from delivery.api.validation import path_id
from delivery.dashboard import csrf, pages
from delivery.dashboard.session import is_https
from delivery.store import endpoints as endpoint_store
from delivery.store import portal

PREFIX = "/portal"
COOKIE_NAME = "hookledger_portal"
SESSION = web.RequestKey("portal_session", portal.PortalSession) if hasattr(web, "RequestKey") else "portal_session"
# The origins allowed to frame this answer (from the session, or from a sign-in link's account).
FRAME_ANCESTORS = (web.RequestKey("portal_frame_ancestors", tuple) if hasattr(web, "RequestKey")
                   else "portal_frame_ancestors")


def session(request: web.Request) -> portal.PortalSession:
    return request[SESSION]


def render(request: web.Request, template: str, context: dict | None = None, *, status: int = 200) -> web.Response:
    current = request.get(SESSION)
    page = {"portal": current, "csrf_token": csrf.session_token(current.token) if current else ""}
    page.update(context or {})
    return aiohttp_jinja2.render_template(template, request, page, status=status)


async def own_endpoint(request: web.Request) -> endpoint_store.Endpoint:
    """The {id} endpoint if it is this application's; 404 for any other (another application's, a
    deleted one, a malformed id)."""
    current = session(request)
    endpoint_id = path_id(request.match_info["id"])
    endpoint = None if endpoint_id is None else await endpoint_store.get_endpoint(
        pages.api(request).pool, current.account_id, endpoint_id)
    if endpoint is None or endpoint.application_id != current.application_id:
        raise not_found("endpoint")
    return endpoint


def content_security_policy(frame_ancestors: tuple[str, ...]) -> str:
    """The dashboard's policy, its frame-ancestors naming these origins ('none' for none)."""
    sources = " ".join(frame_ancestors) if frame_ancestors else "'none'"
    return pages.CONTENT_SECURITY_POLICY.replace("frame-ancestors 'none'", f"frame-ancestors {sources}")


def _headers_for(request: web.Request) -> dict[str, str]:
    headers = dict(pages.SECURITY_HEADERS)
    headers["Cache-Control"] = "no-store"
    frame_ancestors = request.get(FRAME_ANCESTORS, ())
    if frame_ancestors:
        headers["Content-Security-Policy"] = content_security_policy(frame_ancestors)
        del headers["X-Frame-Options"]
    return headers


# The dashboard's headers on every answer, framing allowed to the account's origins only.
security_headers = pages.headers_middleware(_headers_for)


def set_session_cookie(response: web.StreamResponse, request: web.Request, token: str,
                       frame_ancestors: tuple[str, ...], *, max_age: int = portal.PORTAL_SESSION_SECONDS) -> None:
    """Strict where nothing embeds the portal; SameSite=None; Secure; Partitioned where an origin may.
    max_age 0 clears it (a partitioned cookie is cleared only by a partitioned Set-Cookie)."""
    if frame_ancestors:
        # Written by hand: Python's http.cookies (before 3.14) knows no Partitioned attribute.
        cookie = SimpleCookie()
        cookie[COOKIE_NAME] = token
        morsel = cookie[COOKIE_NAME]
        morsel.update({"path": PREFIX, "httponly": True, "secure": True, "samesite": "None",
                       "max-age": str(max_age)})
        response.headers.add("Set-Cookie", morsel.OutputString() + "; Partitioned")
    else:
        response.set_cookie(COOKIE_NAME, token, path=PREFIX, httponly=True, samesite="Strict",
                            secure=is_https(request), max_age=max_age)
