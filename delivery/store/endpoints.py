"""Endpoint storage: create, list, read, update, soft-delete, rotate and read an account's endpoints.

Every statement is scoped by account id, so another account's endpoint is as invisible as a
missing one. Signing keys (a `whsec_` secret or an Ed25519 `whsk_` private key) are stored
encrypted (signing.at_rest), bound to their endpoint by the associated data
`delivery.store.signer_cache.endpoint_secret_context`, which is what the worker decrypts with.
Callers validate the URL (delivery.engine.ssrf) and the custom headers
(delivery.store.endpoint_headers) before anything is written.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from billing import accounts, ids
from billing.database import OUTCOME_WAIT_SECONDS, Executor, OutcomeUnknown, resolved_transaction, transaction
from billing.errors import LedgerMismatch
from billing.settle import DeadReason, settle
from delivery import tracing
from delivery.store import endpoint_headers, signing_keys
from delivery.store.signer_cache import endpoint_secret_context
from signing import Keyring, decrypt_secret, encrypt_secret

logger = logging.getLogger(__name__)

ENDPOINTS_PER_APPLICATION_MAX = 100
ENDPOINTS_PER_ACCOUNT_MAX = ENDPOINTS_PER_APPLICATION_MAX  # in its default application, what the routes without one see
EVENT_TYPES_PER_ENDPOINT_MAX = 100
DESCRIPTION_LENGTH_MAX = 1000
ENDPOINT_TIMEOUT_MS_MIN = 1000
ENDPOINT_TIMEOUT_MS_MAX = 60_000
SECRET_TEXT_LENGTH_MAX = 100  # "whsec_" and the base64 of at most 64 bytes
SETTLE_ON_DELETE_MAX = 100  # pending deliveries refunded right away; the worker's check settles the rest


class EndpointLimitReached(Exception):
    """The application already has the most endpoints allowed."""


class ApplicationGone(Exception):
    """The application was deleted (or is not the account's)."""


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
    created_at: datetime | None = None
    updated_at: datetime | None = None
    signing_key_type: str = signing_keys.HMAC
    headers: dict[str, str] | None = None  # custom headers (delivery.store.endpoint_headers); None: none
    rate_limit_per_second: int | None = None  # every worker together sends at most this many a second; None: no limit
    application_id: uuid.UUID | None = None  # the application it belongs to (the account's id: its default)
    channels: list[str] | None = None  # the channels it takes messages of; None: every message

    @classmethod
    def from_row(cls, row) -> Endpoint:
        return cls(**{**dict(row), "headers": endpoint_headers.loaded(row["headers"])})


_COLUMNS = ("id, account_id, url, description, event_types, enabled, disabled_reason, timeout_ms, created_at,"
            " updated_at, signing_key_type, headers, rate_limit_per_second, application_id, channels")


def seal_secret(secret: str, keyring: Keyring, endpoint_id: uuid.UUID) -> bytes:
    return encrypt_secret(secret, keyring, context=endpoint_secret_context(endpoint_id))


def open_secret(ciphertext: bytes, keyring: Keyring, endpoint_id: uuid.UUID) -> str:
    return decrypt_secret(bytes(ciphertext), keyring, context=endpoint_secret_context(endpoint_id))


async def insert_endpoint(
    pool: Executor,
    account_id: uuid.UUID,
    url: str,
    *,
    secret_ciphertext: bytes | None,
    event_types: list[str] | None = None,
    description: str = "",
    timeout_ms: int = 15000,
    endpoint_id: uuid.UUID | None = None,
    enabled: bool = True,
    signing_key_type: str = signing_keys.HMAC,
    headers: dict[str, str] | None = None,
    rate_limit_per_second: int | None = None,
    application_id: uuid.UUID | None = None,
    channels: list[str] | None = None,
) -> Endpoint:
    """Insert a validated endpoint (callers validate the URL and headers, and encrypt the secret
    first); `application_id` None puts it in the account's default application."""
    row = await pool.fetchrow(
        "INSERT INTO endpoints (id, account_id, url, description, event_types, secret, timeout_ms, enabled,"
        "   signing_key_type, headers, rate_limit_per_second, application_id, channels)"
        f" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, $11, $12, $13) RETURNING {_COLUMNS}",
        endpoint_id or ids.new_id(), account_id, url, description, event_types, secret_ciphertext, timeout_ms, enabled,
        signing_key_type, endpoint_headers.stored(headers), rate_limit_per_second, application_id or account_id,
        channels,
    )
    return Endpoint.from_row(row)


async def create_endpoint(
    executor: Executor,
    account_id: uuid.UUID,
    url: str,
    *,
    secret: str,
    keyring: Keyring,
    event_types: list[str] | None = None,
    description: str = "",
    timeout_ms: int = 15000,
    enabled: bool = True,
    headers: dict[str, str] | None = None,
    rate_limit_per_second: int | None = None,
    outcome_wait_seconds: float = OUTCOME_WAIT_SECONDS,
    application_id: uuid.UUID | None = None,
    channels: list[str] | None = None,
) -> Endpoint:
    """Create an endpoint in an application of the account (None: its default application) under
    the per-application bound; raises EndpointLimitReached past it, ApplicationGone when the
    application was deleted meanwhile.

    `secret` is its signing key: a `whsec_` secret or an Ed25519 `whsk_` private key
    (delivery.store.signing_keys), sealed at rest either way.

    The account row is locked first (the platform's one lock order), so two concurrent creates
    cannot both pass the count, and an application's deletion (which locks it too) cannot slip in
    between the check that the application is live and the insert. A COMMIT whose answer is lost is resolved (resolved_transaction):
    a client told "failed" would make a second endpoint, and every message would then be
    delivered, and charged, twice. Not written: NotWritten; cannot tell: OutcomeUnknown naming
    the endpoint's id. Given a connection inside a caller's transaction (a keyed create), it is a
    savepoint of that transaction, which is then the one resolved.
    """
    endpoint_id = ids.new_id()
    ciphertext = seal_secret(secret, keyring, endpoint_id)
    try:
        async with resolved_transaction(executor, wait_seconds=outcome_wait_seconds) as connection:
            await accounts.lock_active(connection, account_id, "endpoints")
            application_id = application_id or account_id
            row = await connection.fetchrow(
                "SELECT ap.deleted_at IS NULL AS live, (SELECT count(*) FROM endpoints e"
                "   WHERE e.application_id = ap.id AND e.account_id = ap.account_id AND e.deleted_at IS NULL) AS endpoints"
                " FROM applications ap WHERE ap.id = $1 AND ap.account_id = $2", application_id, account_id,
            )
            if row is None or not row["live"]:
                raise ApplicationGone(f"no application {application_id}")
            if row["endpoints"] >= ENDPOINTS_PER_APPLICATION_MAX:
                raise EndpointLimitReached(
                    f"an application has at most {ENDPOINTS_PER_APPLICATION_MAX} endpoints (endpoints_per_application)")
            return await insert_endpoint(
                connection, account_id, url, secret_ciphertext=ciphertext, event_types=event_types,
                description=description, timeout_ms=timeout_ms, endpoint_id=endpoint_id, enabled=enabled,
                signing_key_type=signing_keys.key_type_of(secret), headers=headers,
                rate_limit_per_second=rate_limit_per_second, application_id=application_id, channels=channels,
            )
    except OutcomeUnknown as unknown:
        unknown.look_for = f"endpoint {endpoint_id} (GET /v1/endpoints/{endpoint_id})"
        raise


async def list_endpoints(pool: Executor, account_id: uuid.UUID, application_id: uuid.UUID | None = None) -> list[Endpoint]:
    """Every live endpoint of an application of the account (None: its default application; at
    most ENDPOINTS_PER_APPLICATION_MAX), oldest first."""
    rows = await pool.fetch(
        f"SELECT {_COLUMNS} FROM endpoints WHERE application_id = $1 AND account_id = $2 AND deleted_at IS NULL"
        " ORDER BY account_id, id LIMIT $3",  # the account's order, never the plain index on every account's ids
        application_id or account_id, account_id, ENDPOINTS_PER_APPLICATION_MAX,
    )
    return [Endpoint.from_row(row) for row in rows]


async def get_endpoint(pool: Executor, account_id: uuid.UUID, endpoint_id: uuid.UUID) -> Endpoint | None:
    row = await pool.fetchrow(
        f"SELECT {_COLUMNS} FROM endpoints WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL",
        endpoint_id, account_id,
    )
    return None if row is None else Endpoint.from_row(row)


_UPDATABLE = ("url", "description", "event_types", "enabled", "timeout_ms", "headers", "rate_limit_per_second",
              "channels")


async def update_endpoint(
    pool: Executor, account_id: uuid.UUID, endpoint_id: uuid.UUID, changes: dict[str, object]
) -> Endpoint | None:
    """Apply the given fields; re-enabling clears disabled_reason. None when there is no such endpoint."""
    unknown = set(changes) - set(_UPDATABLE)
    assert not unknown, f"not updatable: {unknown}"
    # One fixed statement: each column takes $n when its flag says it was given, else keeps its value.
    given = [name in changes for name in _UPDATABLE]
    values = [endpoint_headers.stored(changes.get(name)) if name == "headers" else changes.get(name)
              for name in _UPDATABLE]
    row = await pool.fetchrow(
        "UPDATE endpoints SET"
        "   url = CASE WHEN $3 THEN $4 ELSE url END,"
        "   description = CASE WHEN $5 THEN $6 ELSE description END,"
        "   event_types = CASE WHEN $7 THEN $8::text[] ELSE event_types END,"
        "   enabled = CASE WHEN $9 THEN $10 ELSE enabled END,"
        "   disabled_reason = CASE WHEN $9 AND $10 THEN NULL ELSE disabled_reason END,"
        "   timeout_ms = CASE WHEN $11 THEN $12 ELSE timeout_ms END,"
        "   headers = CASE WHEN $13 THEN $14::jsonb ELSE headers END,"
        "   rate_limit_per_second = CASE WHEN $15 THEN $16::int ELSE rate_limit_per_second END,"
        "   channels = CASE WHEN $17 THEN $18::text[] ELSE channels END,"
        "   updated_at = now()"
        f" WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL RETURNING {_COLUMNS}",
        endpoint_id, account_id,
        *[item for pair in zip(given, values) for item in pair],
    )
    return None if row is None else Endpoint.from_row(row)


OPERATOR_REASON = "operator"  # disabled_reason of an endpoint the operator switched off


async def disable_by_operator(executor: Executor, endpoint_id: uuid.UUID) -> Endpoint | None:
    """The operator switches any account's endpoint off (disabled_reason 'operator', which the
    operational trigger reports as endpoint.disabled, reason operator); its pending deliveries then
    die at the pre-send check and are refunded. An endpoint already off keeps its reason: run twice,
    the second changes nothing and writes no event. None when there is no such endpoint."""
    # The operator names only the endpoint: its account comes from a read by the bare id (an
    # operator's read, allowed to span accounts, through ix_endpoints_id, which migration 0025 keeps
    # for it), and the write then names the account.
    async with transaction(executor) as connection:
        account_id = await connection.fetchval(
            "SELECT account_id FROM endpoints WHERE id = $1 AND deleted_at IS NULL", endpoint_id)
        if account_id is None:
            return None
        row = await connection.fetchrow(
            "UPDATE endpoints SET enabled = false, disabled_reason = $3, updated_at = now()"
            f" WHERE account_id = $1 AND id = $2 AND enabled AND deleted_at IS NULL RETURNING {_COLUMNS}",
            account_id, endpoint_id, OPERATOR_REASON)
        if row is None:
            row = await connection.fetchrow(
                f"SELECT {_COLUMNS} FROM endpoints WHERE account_id = $1 AND id = $2 AND deleted_at IS NULL",
                account_id, endpoint_id)
    return None if row is None else Endpoint.from_row(row)


async def delete_endpoint(pool: asyncpg.Pool, account_id: uuid.UUID, endpoint_id: uuid.UUID) -> int | None:
    """Soft-delete; settle up to SETTLE_ON_DELETE_MAX pending deliveries now. None when the account
    never had this endpoint.

    Returns how many deliveries were refunded right away. The rest (and any being sent right
    now) die at the worker's pre-send check with reason endpoint_deleted. Each settle quotes the
    attempt it read, so a delivery a worker claims in between is left to that worker.

    Deleting an endpoint the account already deleted succeeds again (settling what is still
    pending, usually nothing), as revoking a revoked key does: a DELETE retried because its
    first answer was lost then reads as done, not as 404. Another account's endpoint stays None.
    """
    deleted = await pool.fetchval(
        "WITH marked AS (UPDATE endpoints SET deleted_at = now(), updated_at = now()"
        "   WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL RETURNING id)"
        " SELECT id FROM marked UNION ALL SELECT id FROM endpoints WHERE id = $1 AND account_id = $2",
        endpoint_id, account_id,
    )
    if deleted is None:
        return None
    pending = await pool.fetch(
        "SELECT d.id, d.attempt,"
        "   (SELECT m.trace_context FROM messages m WHERE m.account_id = d.account_id AND m.id = d.message_id)"
        "   AS trace_context"
        " FROM deliveries d WHERE d.endpoint_id = $1 AND d.account_id = $2 AND d.state = 'pending'"
        " ORDER BY d.account_id, d.id LIMIT $3",
        endpoint_id, account_id, SETTLE_ON_DELETE_MAX,
    )
    refunded = 0
    for row in pending:
        try:
            with tracing.message_span("delivery.settle", row["trace_context"], delivery_id=row["id"],
                                      account_id=account_id, endpoint_id=endpoint_id, attempt=row["attempt"],
                                      dead_reason=DeadReason.ENDPOINT_DELETED.value) as span:
                settled = await settle(pool, row["id"], DeadReason.ENDPOINT_DELETED, account_id=account_id,
                                       attempt=row["attempt"])
                tracing.set_outcome(span, settled.outcome)
        except LedgerMismatch:
            # The endpoint is deleted either way; a delivery whose ledger disagrees stays stuck
            # for the audit and a repair (as at the pre-send check), and the rest still settle.
            logger.error("delivery %s not settled: its ledger disagrees", row["id"], exc_info=True)
            continue
        refunded += settled.amount > 0
    return refunded


async def rotate_secret(
    pool: Executor,
    account_id: uuid.UUID,
    endpoint_id: uuid.UUID,
    *,
    secret: str,
    keyring: Keyring,
    overlap_seconds: int,
) -> bool:
    """New signing key now; the old one keeps signing for overlap_seconds. False when there is no such endpoint.

    `secret` is a `whsec_` secret or an Ed25519 `whsk_` private key (delivery.store.signing_keys),
    of either kind whatever the old one's: during the overlap both sign, so a request then carries
    a `v1` and a `v1a` signature, and a receiver holding either the old or the new key verifies.

    Rotating to the secret that is already current changes nothing, so a caller that chose the
    secret can retry a rotation whose answer it lost: rotating again would have moved the new
    secret into previous_secret and dropped the old one at once, breaking every receiver still
    on it. Secrets are sealed with a random nonce, so the comparison is on the opened secret,
    under the row lock (two identical rotations at once apply once).
    """
    async with transaction(pool) as connection:
        await accounts.lock_active(connection, account_id, "secrets", lock="FOR SHARE")
        row = await connection.fetchrow(
            "SELECT secret FROM endpoints WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL FOR UPDATE",
            endpoint_id, account_id,
        )
        if row is None:
            return False
        if row["secret"] is not None and open_secret(row["secret"], keyring, endpoint_id) == secret:
            return True
        await connection.execute(
            "UPDATE endpoints SET previous_secret = secret,"
            "   previous_secret_expires_at = CASE WHEN secret IS NULL THEN NULL"
            "       ELSE now() + make_interval(secs => $2) END,"
            "   secret = $3, signing_key_type = $4, updated_at = now()"
            " WHERE account_id = $5 AND id = $1",
            endpoint_id, float(overlap_seconds), seal_secret(secret, keyring, endpoint_id),
            signing_keys.key_type_of(secret), account_id,
        )
    return True


async def read_secret(
    pool: Executor, account_id: uuid.UUID, endpoint_id: uuid.UUID, keyring: Keyring
) -> str | None:
    """What a receiver verifies the endpoint's current key with, or None when there is no such
    endpoint (or no key): its `whsec_` secret, or the `whpk_` public key of its Ed25519 key.
    The `whsk_` private key is never returned (delivery.store.signing_keys)."""
    ciphertext = await pool.fetchval(
        "SELECT secret FROM endpoints WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL",
        endpoint_id, account_id,
    )
    return None if ciphertext is None else signing_keys.shown(open_secret(ciphertext, keyring, endpoint_id))
