"""Stored answers of the API's keyed creates (the table idempotent_responses): lock, find, store, purge.

The API's creates other than messages (an account, an API key, an endpoint, a secret rotation)
keep their 2xx answer under (principal, Idempotency-Key) in the transaction that made what the
answer shows, so a retry with the key gets that answer again (delivery.api.idempotency). The
answer may hold a secret shown once (an API key, an endpoint's signing secret), so it is sealed
with the at-rest keyring, bound to its (principal, key); it stays sealed for the retention period
and is then purged by the worker's sweep. Every statement on the table is here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import asyncpg

from billing.database import Executor
from signing import Keyring, decrypt_secret, encrypt_secret

OPERATOR_PRINCIPAL = "operator"  # whose keys the operator's are; an account's are its id's
RETENTION_HOURS = 25  # kept at least 24 h, as promised; the hour more is the purge's slack
PURGE_CHUNK_ROWS = 1000  # rows one purge statement deletes at the most
PURGE_CHUNKS_MAX = 10  # statements one purge runs at the most; the next sweep goes on
# The advisory lock's 64-bit key is a hash of (principal, key), personalised so that it collides
# with no other advisory lock of ours (delivery.operations.deletion uses the two-key form, another space).
_LOCK_PERSON = b"hl-idem-response"

# The lock is a statement of its own: a lookup in the same statement would read a snapshot taken
# before the lock was granted, and miss the answer that the transaction holding it just committed.
_TRY_LOCK = "SELECT pg_try_advisory_xact_lock($1)"
# The stored answer for a key, if any (the caller holds the key's lock).
_FIND = "SELECT fingerprint, status, body FROM idempotent_responses WHERE principal = $1 AND key = $2"
# A new answer; the key's lock and the lookup before it mean no row is there.
_STORE = "INSERT INTO idempotent_responses (principal, key, fingerprint, status, body) VALUES ($1, $2, $3, $4, $5)"
# Answers past the retention, oldest first, a bounded chunk at a time; rows another purge is
# deleting are skipped rather than waited for.
_PURGE = (
    "WITH purged AS (DELETE FROM idempotent_responses WHERE (principal, key) IN"
    " (SELECT principal, key FROM idempotent_responses WHERE created_at < now() - make_interval(hours => $1)"
    "  ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING 1)"
    " SELECT count(*) FROM purged"
)


@dataclass(frozen=True)
class StoredResponse:
    fingerprint: bytes
    status: int
    body: bytes  # opened: the answer's bytes as first sent


@dataclass(frozen=True)
class SealedResponse:
    """A stored answer as found: its fingerprint to compare, its body still sealed."""

    fingerprint: bytes
    status: int
    sealed_body: bytes

    def opened(self, principal: str, key: str, keyring: Keyring) -> StoredResponse:
        """The answer; raises signing's SigningError when the keyring cannot open it (a key
        dropped from it, or replaced under the same id, within the retention)."""
        body = decrypt_secret(self.sealed_body, keyring, context=sealing_context(principal, key))
        return StoredResponse(self.fingerprint, self.status, body.encode())


def lock_key(principal: str, key: str) -> int:
    """The signed 64-bit advisory lock key of (principal, key)."""
    digest = hashlib.blake2b(_pair(principal, key), digest_size=8, person=_LOCK_PERSON).digest()
    return int.from_bytes(digest, "big", signed=True)


def _pair(principal: str, key: str) -> bytes:
    # A principal never holds a NUL (an account id or "operator"), so the pair reads one way only.
    return principal.encode() + b"\x00" + key.encode("utf-8", "surrogatepass")


def sealing_context(principal: str, key: str) -> bytes:
    """Associated data binding a sealed answer to its (principal, key): copied to another row, it won't open."""
    return b"idempotent-response:" + _pair(principal, key)


async def try_lock(connection: asyncpg.Connection, principal: str, key: str) -> bool:
    """Take the key's transaction-scoped advisory lock if no other transaction holds it."""
    assert connection.is_in_transaction(), "the lock lasts as long as the caller's transaction"
    return await connection.fetchval(_TRY_LOCK, lock_key(principal, key))


async def find(executor: Executor, principal: str, key: str) -> SealedResponse | None:
    """The stored answer for the key, not yet opened: the caller compares fingerprints first."""
    row = await executor.fetchrow(_FIND, principal, key)
    if row is None:
        return None
    return SealedResponse(bytes(row["fingerprint"]), row["status"], bytes(row["body"]))


async def store(executor: Executor, principal: str, key: str, keyring: Keyring, response: StoredResponse) -> None:
    # The answers are JSON, so UTF-8 text: the sealing takes text.
    sealed = encrypt_secret(response.body.decode(), keyring, context=sealing_context(principal, key))
    await executor.execute(_STORE, principal, key, response.fingerprint, response.status, sealed)


async def purge_expired(executor: Executor, *, chunk_rows: int = PURGE_CHUNK_ROWS,
                        chunks_max: int = PURGE_CHUNKS_MAX) -> int:
    """Delete answers older than RETENTION_HOURS, at most chunks_max chunks; returns how many."""
    purged = 0
    for _ in range(chunks_max):
        deleted = await executor.fetchval(_PURGE, RETENTION_HOURS, chunk_rows)
        purged += deleted
        if deleted < chunk_rows:
            break
    return purged
