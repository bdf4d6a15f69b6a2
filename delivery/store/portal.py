"""Portal links and sessions: an application's customer signs in with a single-use magic link and
then sees that application only.

A link's token and a session's token exist only in the customer's hands (the URL, the cookie); the
database keeps their SHA-256. A link signs in once, within PORTAL_LINK_SECONDS of its making, and
only while its application is live; the session it opens lasts PORTAL_SESSION_SECONDS at most and
ends at once when the application is deleted or its account stops being active.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime

from billing.database import Executor, transaction
from billing.tables import PORTAL_LINK_SECONDS, PORTAL_SESSION_SECONDS

TOKEN_BYTES = 32
TOKEN_LENGTH_MAX = 64  # what secrets.token_urlsafe(32) makes is 43 characters
EXPIRED_PURGED_MAX = 1000  # expired links and sessions deleted per sign-in, at most


@dataclass(frozen=True)
class PortalSession:
    token: str
    account_id: uuid.UUID
    application_id: uuid.UUID
    application_name: str
    frame_ancestors: tuple[str, ...] = ()  # the account's origins allowed to embed the portal


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode("ascii", "replace")).digest()


def well_formed(token: object) -> bool:
    return isinstance(token, str) and 1 <= len(token) <= TOKEN_LENGTH_MAX and token.isascii()


async def create_link(executor: Executor, account_id: uuid.UUID, application_id: uuid.UUID) -> tuple[str, datetime]:
    """A new link's token (shown once) and when it stops signing in."""
    token = secrets.token_urlsafe(TOKEN_BYTES)
    expires_at = await executor.fetchval(
        "INSERT INTO portal_links (token_hash, account_id, application_id, expires_at)"
        " VALUES ($1, $2, $3, now() + make_interval(secs => $4)) RETURNING expires_at",
        token_hash(token), account_id, application_id, float(PORTAL_LINK_SECONDS))
    return token, expires_at


async def sign_in(executor: Executor, link_token: str) -> str | None:
    """Use a link once: a new session's token, or None for a link that is unknown, used, expired,
    or whose application was deleted (or its account is not active). Two sign-ins with one link at
    once: the row lock lets one through."""
    if not well_formed(link_token):
        return None
    session_token = secrets.token_urlsafe(TOKEN_BYTES)
    async with transaction(executor) as connection:
        await connection.execute(
            "DELETE FROM portal_links WHERE token_hash IN (SELECT token_hash FROM portal_links"
            " WHERE expires_at <= now() - interval '1 day' LIMIT $1)", EXPIRED_PURGED_MAX)
        await connection.execute(
            "DELETE FROM portal_sessions WHERE token_hash IN (SELECT token_hash FROM portal_sessions"
            " WHERE expires_at <= now() LIMIT $1)", EXPIRED_PURGED_MAX)
        used = await connection.fetchrow(
            "UPDATE portal_links l SET used_at = now() FROM applications ap, accounts a"
            " WHERE l.token_hash = $1 AND l.used_at IS NULL AND l.expires_at > now()"
            "   AND ap.id = l.application_id AND ap.account_id = l.account_id AND ap.deleted_at IS NULL"
            "   AND a.id = l.account_id AND a.status = 'active'"
            " RETURNING l.account_id, l.application_id", token_hash(link_token))
        if used is None:
            return None
        await connection.execute(
            "INSERT INTO portal_sessions (token_hash, account_id, application_id, expires_at)"
            " VALUES ($1, $2, $3, now() + make_interval(secs => $4))",
            token_hash(session_token), used["account_id"], used["application_id"], float(PORTAL_SESSION_SECONDS))
    return session_token


async def lookup(executor: Executor, session_token: str | None) -> PortalSession | None:
    """The live session of a cookie's token: not expired, its application live, its account active."""
    if not well_formed(session_token):
        return None
    row = await executor.fetchrow(
        "SELECT s.account_id, s.application_id, ap.name, a.portal_frame_ancestors FROM portal_sessions s"
        " JOIN applications ap ON ap.id = s.application_id AND ap.account_id = s.account_id"
        " JOIN accounts a ON a.id = s.account_id"
        " WHERE s.token_hash = $1 AND s.expires_at > now() AND ap.deleted_at IS NULL AND a.status = 'active'",
        token_hash(session_token))
    if row is None:
        return None
    return PortalSession(session_token, row["account_id"], row["application_id"], row["name"],
                         tuple(row["portal_frame_ancestors"]))


async def link_frame_ancestors(executor: Executor, link_token: str) -> tuple[str, ...]:
    """The origins allowed to frame the pages a link opens (its sign-in page, and the refusal of a
    used or expired one, so that the customer reads it inside the embedding iframe); none for a
    token that is no link. Reading does not spend the link."""
    if not well_formed(link_token):
        return ()
    origins = await executor.fetchval(
        "SELECT a.portal_frame_ancestors FROM portal_links l JOIN accounts a ON a.id = l.account_id"
        " WHERE l.token_hash = $1", token_hash(link_token))
    return tuple(origins or ())


async def sign_out(executor: Executor, session_token: str) -> None:
    await executor.execute("DELETE FROM portal_sessions WHERE token_hash = $1", token_hash(session_token))


async def deliveries(executor: Executor, account_id: uuid.UUID, application_id: uuid.UUID, limit: int) -> list:
    """The application's newest deliveries (to any endpoint it ever had), with their state and event
    type. Ordered by the account too: the order of the account's own indexes."""
    return await executor.fetch(
        "SELECT d.id, d.endpoint_id, e.url, m.event_type, d.state, d.attempt, d.attempts_max, d.price, d.created_at,"
        "   d.dead_reason"
        " FROM endpoints e JOIN LATERAL (SELECT * FROM deliveries d WHERE d.endpoint_id = e.id AND d.account_id = $2"
        "   ORDER BY d.account_id DESC, d.id DESC LIMIT $3) d ON true JOIN messages m ON m.account_id = d.account_id AND m.id = d.message_id"
        " WHERE e.application_id = $1 AND e.account_id = $2 ORDER BY d.account_id DESC, d.id DESC LIMIT $3",
        application_id, account_id, limit)


async def delivery_of(executor: Executor, account_id: uuid.UUID, application_id: uuid.UUID,
                      delivery_id: uuid.UUID):
    """One delivery of the application, with what a replay needs; None for any other."""
    return await executor.fetchrow(
        "SELECT d.id, d.state, d.endpoint_id, d.price, m.event_type, m.payload, m.payload_erased_at"
        " FROM deliveries d JOIN messages m ON m.account_id = d.account_id AND m.id = d.message_id JOIN endpoints e ON e.account_id = d.account_id AND e.id = d.endpoint_id"
        " WHERE d.id = $1 AND d.account_id = $2 AND e.application_id = $3", delivery_id, account_id, application_id)
