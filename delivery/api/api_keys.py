"""Account API keys: `hl_live_` + 32 random bytes, shown once, stored only as SHA-256 hashes.

The prefix (the first characters of the key) is kept so that a person can tell keys apart in a
list; it reveals too little of the key to help guess the rest. SQL for the api_keys table lives
here and only here.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime

from billing import ids
from billing.database import Executor

KEY_PREFIX = "hl_live_"
KEY_RANDOM_BYTES = 32
DISPLAY_PREFIX_LENGTH = len(KEY_PREFIX) + 6
KEY_LENGTH_MAX = 200  # anything longer in an Authorization header is not one of ours
KEYS_PER_ACCOUNT_MAX = 20


class KeyLimitReached(Exception):
    """The account already has the most live API keys allowed."""


@dataclass(frozen=True)
class ApiKey:
    id: uuid.UUID
    prefix: str
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True)
class NewApiKey:
    id: uuid.UUID
    prefix: str
    created_at: datetime
    key: str  # the only time the key exists in clear text


def key_hash(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(KEY_RANDOM_BYTES)


async def create_key(executor: Executor, account_id: uuid.UUID) -> NewApiKey:
    """A new key for the account (the caller holds the account lock or has just created it)."""
    key = generate_key()
    live = await executor.fetchval(
        "SELECT count(*) FROM api_keys WHERE account_id = $1 AND revoked_at IS NULL", account_id
    )
    if live >= KEYS_PER_ACCOUNT_MAX:
        raise KeyLimitReached(f"an account has at most {KEYS_PER_ACCOUNT_MAX} live API keys")
    row = await executor.fetchrow(
        "INSERT INTO api_keys (id, account_id, key_hash, prefix) VALUES ($1, $2, $3, $4)"
        " RETURNING id, prefix, created_at",
        ids.new_id(), account_id, key_hash(key), key[:DISPLAY_PREFIX_LENGTH],
    )
    return NewApiKey(row["id"], row["prefix"], row["created_at"], key)


async def list_keys(executor: Executor, account_id: uuid.UUID, *, limit: int = 100) -> list[ApiKey]:
    """The live keys (at most KEYS_PER_ACCOUNT_MAX), then the revoked ones, each oldest first, up
    to `limit`: revoked keys pile up with every rotation, and must not push the live ones out."""
    rows = await executor.fetch(
        "SELECT id, prefix, created_at, revoked_at FROM api_keys WHERE account_id = $1"
        " ORDER BY revoked_at IS NOT NULL, id LIMIT $2",
        account_id, limit,
    )
    return [ApiKey(**dict(row)) for row in rows]


async def revoke_key(executor: Executor, account_id: uuid.UUID, key_id: uuid.UUID) -> bytes | None:
    """Revoke; returns the key's hash (to drop it from caches), or None when there is no such key.

    Revoking a revoked key answers as success again (the hash), so a retried DELETE is harmless.
    """
    return await executor.fetchval(
        "UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())"
        " WHERE id = $1 AND account_id = $2 RETURNING key_hash",
        key_id, account_id,
    )


async def account_of_key(executor: Executor, digest: bytes) -> uuid.UUID | None:
    """The account a live key belongs to, or None."""
    return await executor.fetchval(
        "SELECT account_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL", digest
    )


async def key_id(executor: Executor, account_id: uuid.UUID, digest: bytes) -> uuid.UUID | None:
    """The id of the account's key with this hash (to record which key did something), or None."""
    return await executor.fetchval("SELECT id FROM api_keys WHERE key_hash = $1 AND account_id = $2", digest, account_id)
