"""Switch off an operational endpoint that answered 410 Gone or keeps failing.

As an endpoint is (delivery.engine.endpoint_health), with the same policy (the worker's
AutoDisablePolicy, delivery.engine.retry): the Standard Webhooks spec asks a sender to stop
sending to a receiver that answered 410. Its pending operational deliveries end with it
(`endpoint_disabled`); no money is involved, and no event is written (the endpoint that would
carry it is the one switched off).

The streak is kept on the operational endpoint's row (failing_since, last_failure_at,
failure_count), written with PostgreSQL's clock as each result is recorded and cleared by a
success, so the decision needs no history table and no clock of ours.
"""

from __future__ import annotations

import uuid

import asyncpg

from delivery.engine.retry import GONE_REASON, AutoDisablePolicy, FailureStreak, disable_reason

_SUCCEEDED = (
    "UPDATE operational_endpoints SET failing_since = NULL, last_failure_at = NULL, failure_count = 0"
    " WHERE account_id = $2 AND id = $1 AND failure_count > 0"
)
_FAILED = (
    "UPDATE operational_endpoints SET failing_since = coalesce(failing_since, now()), last_failure_at = now(),"
    "   failure_count = failure_count + 1"
    " WHERE account_id = $2 AND id = $1 AND enabled AND deleted_at IS NULL"
    " RETURNING failing_since, last_failure_at, failure_count"
)
_DISABLE = (
    "UPDATE operational_endpoints SET enabled = false, disabled_reason = $2, updated_at = now()"
    " WHERE account_id = $3 AND id = $1 AND enabled AND deleted_at IS NULL"
)
# Its deliveries that wait for an attempt end unsent; one being sent ends when its result is
# recorded (it is then pending, and the claim finds the endpoint disabled).
_END_PENDING = (
    "UPDATE operational_deliveries SET state = 'dead', dead_reason = 'endpoint_disabled', finished_at = now(),"
    "   last_error = $2"
    " WHERE account_id = $3 AND endpoint_id = $1 AND state = 'pending'"
)
REASON_CHARS_MAX = 500


async def succeeded(pool: asyncpg.Pool, account_id: uuid.UUID, endpoint_id: uuid.UUID) -> None:
    """A 2xx ends the endpoint's failure streak."""
    await pool.execute(_SUCCEEDED, endpoint_id, account_id)


async def failed(pool: asyncpg.Pool, account_id: uuid.UUID, endpoint_id: uuid.UUID, gone: bool,
                 policy: AutoDisablePolicy) -> str | None:
    """Count a failed attempt; switch the endpoint off when it answered 410 or the streak meets the
    policy. Returns the reason it was switched off, None when it stays on."""
    row = await pool.fetchrow(_FAILED, endpoint_id, account_id)
    if row is None:  # already off or deleted
        return None
    if gone:
        reason = GONE_REASON
    else:
        streak = FailureStreak(row["failing_since"], row["last_failure_at"], row["failure_count"], False)
        reason = disable_reason(streak, policy)
    if reason is None:
        return None
    return reason if await disable(pool, account_id, endpoint_id, reason) else None


async def disable(pool: asyncpg.Pool, account_id: uuid.UUID, endpoint_id: uuid.UUID, reason: str) -> bool:
    """Switch it off and end its pending deliveries, in one transaction; False if it was already off."""
    reason = reason[:REASON_CHARS_MAX]
    async with pool.acquire() as connection, connection.transaction():
        if await connection.execute(_DISABLE, endpoint_id, reason, account_id) != "UPDATE 1":
            return False
        await connection.execute(_END_PENDING, endpoint_id, f"not sent: the endpoint was switched off ({reason})"[:1000],
                                 account_id)
    return True
