"""Operational endpoints and events: an account's own, every statement scoped by its account id.

An operational endpoint is where an account's operational events go (billing.operational_outbox
writes them): a URL checked as an endpoint's is (delivery.engine.ssrf, by the caller), the event
types it wants (NULL: all), and its own whsec_ secret, sealed at rest and bound to it by
`operational_secret_context`. Another account's endpoint or event is as invisible as a missing one.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime

from billing import accounts, ids
from billing.database import Executor, transaction
from billing.tables import OPERATIONAL_EVENT_TYPES
from signing import Keyring, decrypt_secret, encrypt_secret

OPERATIONAL_ENDPOINTS_PER_ACCOUNT_MAX = 10
EVENTS_PAGE_MAX = 200
EVENTS_PAGE_DEFAULT = 50
NOTICES_MAX = 10


class OperationalEndpointLimitReached(Exception):
    """The account already has the most operational endpoints allowed."""


def operational_secret_context(endpoint_id: uuid.UUID) -> bytes:
    """Associated data binding a secret's ciphertext to its operational endpoint (not to an endpoint)."""
    return b"operational_endpoint:" + str(endpoint_id).encode()


def seal_secret(secret: str, keyring: Keyring, endpoint_id: uuid.UUID) -> bytes:
    return encrypt_secret(secret, keyring, context=operational_secret_context(endpoint_id))


def open_secret(ciphertext: bytes, keyring: Keyring, endpoint_id: uuid.UUID) -> str:
    return decrypt_secret(bytes(ciphertext), keyring, context=operational_secret_context(endpoint_id))


@dataclass(frozen=True)
class OperationalEndpoint:
    id: uuid.UUID
    account_id: uuid.UUID
    url: str
    description: str
    event_types: list[str] | None
    enabled: bool
    # Why the worker switched it off (410 Gone, or failing past the auto-disable policy); None
    # while enabled or when the account switched it off (delivery.operations.operational_health).
    disabled_reason: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class OperationalEvent:
    id: uuid.UUID
    seq: int
    type: str
    created_at: datetime
    data: dict


_COLUMNS = "id, account_id, url, description, event_types, enabled, disabled_reason, created_at, updated_at"
_EVENT_COLUMNS = "id, seq, type, created_at, data"


def _event(row) -> OperationalEvent:
    return OperationalEvent(row["id"], row["seq"], row["type"], row["created_at"], json.loads(row["data"]))


async def create_endpoint(executor: Executor, account_id: uuid.UUID, url: str, *, secret: str, keyring: Keyring,
                          event_types: list[str] | None, description: str, enabled: bool) -> OperationalEndpoint:
    """Create one under the per-account bound (the account row locked first: two creates cannot both pass)."""
    endpoint_id = ids.new_id()
    ciphertext = seal_secret(secret, keyring, endpoint_id)
    async with transaction(executor) as connection:
        await accounts.lock_active(connection, account_id, "operational endpoints")
        count = await connection.fetchval(
            "SELECT count(*) FROM operational_endpoints WHERE account_id = $1 AND deleted_at IS NULL", account_id)
        if count >= OPERATIONAL_ENDPOINTS_PER_ACCOUNT_MAX:
            raise OperationalEndpointLimitReached(
                f"an account has at most {OPERATIONAL_ENDPOINTS_PER_ACCOUNT_MAX} operational endpoints")
        row = await connection.fetchrow(
            "INSERT INTO operational_endpoints (id, account_id, url, description, event_types, secret, enabled)"
            f" VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {_COLUMNS}",
            endpoint_id, account_id, url, description, event_types, ciphertext, enabled)
    return OperationalEndpoint(**dict(row))


async def list_endpoints(executor: Executor, account_id: uuid.UUID) -> list[OperationalEndpoint]:
    rows = await executor.fetch(
        f"SELECT {_COLUMNS} FROM operational_endpoints WHERE account_id = $1 AND deleted_at IS NULL ORDER BY account_id, id"
        " LIMIT $2", account_id, OPERATIONAL_ENDPOINTS_PER_ACCOUNT_MAX)
    return [OperationalEndpoint(**dict(row)) for row in rows]


async def get_endpoint(executor: Executor, account_id: uuid.UUID, endpoint_id: uuid.UUID) -> OperationalEndpoint | None:
    row = await executor.fetchrow(
        f"SELECT {_COLUMNS} FROM operational_endpoints WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL",
        endpoint_id, account_id)
    return None if row is None else OperationalEndpoint(**dict(row))


_UPDATABLE = ("url", "description", "event_types", "enabled")


async def update_endpoint(executor: Executor, account_id: uuid.UUID, endpoint_id: uuid.UUID,
                          changes: dict[str, object]) -> OperationalEndpoint | None:
    """Apply the given fields; None when the account has no such endpoint. Enabling clears the
    disabled_reason and the failure streak: the account says the receiver is fixed."""
    unknown = set(changes) - set(_UPDATABLE)
    assert not unknown, f"not updatable: {unknown}"
    given = [name in changes for name in _UPDATABLE]
    values = [changes.get(name) for name in _UPDATABLE]
    row = await executor.fetchrow(
        "UPDATE operational_endpoints SET"
        "   url = CASE WHEN $3 THEN $4 ELSE url END,"
        "   description = CASE WHEN $5 THEN $6 ELSE description END,"
        "   event_types = CASE WHEN $7 THEN $8::text[] ELSE event_types END,"
        "   enabled = CASE WHEN $9 THEN $10 ELSE enabled END,"
        "   disabled_reason = CASE WHEN $9 THEN NULL ELSE disabled_reason END,"
        "   failing_since = CASE WHEN $9 AND $10 THEN NULL ELSE failing_since END,"
        "   last_failure_at = CASE WHEN $9 AND $10 THEN NULL ELSE last_failure_at END,"
        "   failure_count = CASE WHEN $9 AND $10 THEN 0 ELSE failure_count END,"
        "   updated_at = now()"
        f" WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL RETURNING {_COLUMNS}",
        endpoint_id, account_id, *[item for pair in zip(given, values) for item in pair])
    return None if row is None else OperationalEndpoint(**dict(row))


async def delete_endpoint(executor: Executor, account_id: uuid.UUID, endpoint_id: uuid.UUID) -> bool:
    """Soft-delete (its deliveries' rows keep pointing at it); its pending deliveries die unsent."""
    return await executor.execute(
        "UPDATE operational_endpoints SET deleted_at = now(), enabled = false, updated_at = now()"
        " WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL", endpoint_id, account_id) == "UPDATE 1"


async def read_secret(executor: Executor, account_id: uuid.UUID, endpoint_id: uuid.UUID, keyring: Keyring) -> str | None:
    ciphertext = await executor.fetchval(
        "SELECT secret FROM operational_endpoints WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL",
        endpoint_id, account_id)
    return None if ciphertext is None else open_secret(ciphertext, keyring, endpoint_id)


async def events_page(executor: Executor, account_id: uuid.UUID, *, after: int, limit: int,
                      event_type: str | None = None) -> list[OperationalEvent]:
    """The account's events oldest first, after the cursor (a seq); of one type when given. Ordered by
    the account too: the order of its (account_id, seq) index, never of an index of every account's."""
    assert 1 <= limit <= EVENTS_PAGE_MAX + 1 and (event_type is None or event_type in OPERATIONAL_EVENT_TYPES)
    rows = await executor.fetch(
        f"SELECT {_EVENT_COLUMNS} FROM operational_events WHERE account_id = $1 AND seq > $2"
        " AND ($3::text IS NULL OR type = $3) ORDER BY account_id, seq LIMIT $4", account_id, after, event_type, limit)
    return [_event(row) for row in rows]


async def get_event(executor: Executor, account_id: uuid.UUID, event_id: uuid.UUID) -> OperationalEvent | None:
    row = await executor.fetchrow(
        f"SELECT {_EVENT_COLUMNS} FROM operational_events WHERE id = $1 AND account_id = $2", event_id, account_id)
    return None if row is None else _event(row)


async def recent_events(executor: Executor, account_id: uuid.UUID, limit: int = NOTICES_MAX) -> list[OperationalEvent]:
    """The account's newest events, newest first (the dashboard's notices)."""
    rows = await executor.fetch(
        f"SELECT {_EVENT_COLUMNS} FROM operational_events WHERE account_id = $1"
        " ORDER BY account_id DESC, seq DESC LIMIT $2",
        account_id, min(limit, NOTICES_MAX))
    return [_event(row) for row in rows]
