"""Dashboard sign-in sessions: server-side rows in `dashboard_sessions`, a random token in a cookie.

The browser holds the token; the database holds only its SHA-256, so a leaked table signs
nobody in. An account session names the API key it signed in with and ends when that key is
revoked (account deletion revokes every key); every session ends after SESSION_SECONDS or
when it signs out (its row is deleted). The cookie is HttpOnly, SameSite=Strict, scoped to
/dashboard, and Secure whenever the request came over https.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass

import asyncpg
from aiohttp import web

from delivery.api import api_keys

COOKIE_NAME = "hookledger_session"
COOKIE_PATH = "/dashboard"
SESSION_SECONDS = 8 * 3600  # an absolute lifetime: a sign-in lasts a working day at most
TOKEN_BYTES = 32
TOKEN_LENGTH_MAX = 64  # a cookie longer than this is not one of ours
EXPIRED_PURGED_PER_SIGN_IN_MAX = 1000

# Create a session ($5: its lifetime in seconds).
_CREATE = (
    "INSERT INTO dashboard_sessions (token_hash, role, account_id, api_key_id, expires_at)"
    " VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))"
)
# The live session of a token: not expired and, for an account, its key not revoked.
_LOOKUP = (
    "SELECT s.role, s.account_id, a.name AS account_name FROM dashboard_sessions s"
    " LEFT JOIN api_keys k ON k.id = s.api_key_id LEFT JOIN accounts a ON a.id = s.account_id"
    " WHERE s.token_hash = $1 AND s.expires_at > now() AND (s.role = 'operator' OR k.revoked_at IS NULL)"
)
# Sign out: the row goes, so the cookie means nothing any more.
_DELETE = "DELETE FROM dashboard_sessions WHERE token_hash = $1"
# Expired sessions, a bounded batch at a time (run at each sign-in).
_PURGE_EXPIRED = (
    "DELETE FROM dashboard_sessions WHERE token_hash IN"
    " (SELECT token_hash FROM dashboard_sessions WHERE expires_at <= now() LIMIT $1)"
)
# The live API key behind a key hash: which account, and which key (the session remembers it).
_LIVE_KEY = "SELECT id, account_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL"


@dataclass(frozen=True)
class Session:
    token: str  # from the cookie; the CSRF token is derived from it (csrf.py)
    role: str  # account | operator
    account_id: uuid.UUID | None
    account_name: str | None

    @property
    def is_operator(self) -> bool:
        return self.role == "operator"


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode("ascii", "replace")).digest()


async def sign_in(pool: asyncpg.Pool, key: str, operator_digest_check) -> Session | None:
    """A new session for an account key or the operator key; None when the key is not valid.

    `operator_digest_check(digest) -> bool` is the API authenticator's constant-time check.
    """
    if not key or len(key) > api_keys.KEY_LENGTH_MAX:
        return None
    digest = api_keys.key_hash(key)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    await pool.execute(_PURGE_EXPIRED, EXPIRED_PURGED_PER_SIGN_IN_MAX)
    if operator_digest_check(digest):
        await pool.execute(_CREATE, token_hash(token), "operator", None, None, float(SESSION_SECONDS))
        return Session(token, "operator", None, None)
    row = await pool.fetchrow(_LIVE_KEY, digest)
    if row is None:
        return None
    await pool.execute(_CREATE, token_hash(token), "account", row["account_id"], row["id"], float(SESSION_SECONDS))
    return Session(token, "account", row["account_id"], None)


async def lookup(pool: asyncpg.Pool, request: web.Request) -> Session | None:
    token = request.cookies.get(COOKIE_NAME)
    if not token or len(token) > TOKEN_LENGTH_MAX or not token.isascii():
        return None
    row = await pool.fetchrow(_LOOKUP, token_hash(token))
    if row is None:
        return None
    return Session(token, row["role"], row["account_id"], row["account_name"])


async def sign_out(pool: asyncpg.Pool, session: Session) -> None:
    await pool.execute(_DELETE, token_hash(session.token))


def is_https(request: web.Request) -> bool:
    # Behind a TLS-terminating proxy the request reaches us over http; the proxy says so.
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return request.secure or forwarded == "https"


def set_cookie(response: web.StreamResponse, request: web.Request, name: str, value: str, *,
               path: str = COOKIE_PATH, max_age: int = SESSION_SECONDS) -> None:
    response.set_cookie(name, value, path=path, max_age=max_age, httponly=True, samesite="Strict",
                        secure=is_https(request))


def clear_cookie(response: web.StreamResponse, request: web.Request, name: str = COOKIE_NAME,
                 path: str = COOKIE_PATH) -> None:
    response.del_cookie(name, path=path, secure=is_https(request), httponly=True, samesite="Strict")
