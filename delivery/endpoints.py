"""Endpoint storage: create, read, update, delete an account's endpoints.

Secrets are stored encrypted (signing.at_rest); the URL is validated (delivery.ssrf) before
anything is written.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import asyncpg

from billing import ids

ENDPOINTS_PER_ACCOUNT_MAX = 100
EVENT_TYPES_PER_ENDPOINT_MAX = 100


@dataclass(frozen=True)
class Endpoint:
    id: uuid.UUID
    account_id: uuid.UUID
    url: str
    description: str
    event_types: list[str] | None
    enabled: bool
    disabled_reason: str | None
    timeout_ms: int


_COLUMNS = "id, account_id, url, description, event_types, enabled, disabled_reason, timeout_ms"


async def insert_endpoint(
    pool: asyncpg.Pool,
    account_id: uuid.UUID,
    url: str,
    *,
    secret_ciphertext: bytes | None,
    event_types: list[str] | None = None,
    description: str = "",
    timeout_ms: int = 15000,
) -> Endpoint:
    """Insert a validated endpoint (callers validate the URL and encrypt the secret first)."""
    row = await pool.fetchrow(
        "INSERT INTO endpoints (id, account_id, url, description, event_types, secret, timeout_ms)"
        f" VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING {_COLUMNS}",
        ids.new_id(), account_id, url, description, event_types, secret_ciphertext, timeout_ms,
    )
    return Endpoint(**dict(row))
