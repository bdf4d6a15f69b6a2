"""CSRF protection: every form carries a token that a cross-site page cannot know.

Signed in: the token is an HMAC of the session token (one per session, nothing stored), sent
in a hidden field and checked on every POST. Signing in (no session yet): a double-submit
token, a random value in a short-lived cookie and the same value in the form, so another site
cannot sign a browser into an account of its choosing. SameSite=Strict cookies and the Origin
check below are a second line, not the first.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from aiohttp import web

FIELD = "csrf_token"
SIGN_IN_COOKIE = "hookledger_sign_in"
SIGN_IN_COOKIE_PATH = "/dashboard/sign-in"
SIGN_IN_SECONDS = 3600
TOKEN_LENGTH_MAX = 128


def session_token(session_secret: str) -> str:
    digest = hmac.new(session_secret.encode("ascii", "replace"), b"hookledger dashboard csrf", hashlib.sha256)
    return base64.urlsafe_b64encode(digest.digest()).decode().rstrip("=")


def new_sign_in_token() -> str:
    return secrets.token_urlsafe(32)


def matches(expected: str | None, given: object) -> bool:
    if not expected or not isinstance(given, str) or not given or len(given) > TOKEN_LENGTH_MAX:
        return False
    return hmac.compare_digest(expected.encode(), given.encode("utf-8", "replace"))


def same_origin(request: web.Request) -> bool:
    """A browser's Origin header, when sent, must name this host (a form posted from elsewhere does not)."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    if origin == "null":
        return False
    return origin.split("://", 1)[-1].rstrip("/") == request.host
