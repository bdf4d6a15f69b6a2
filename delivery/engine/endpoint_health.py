"""Disable endpoints that answered 410 Gone or keep failing (the policy is delivery.engine.retry's).

Their pending deliveries then die at the pre-send check and are refunded (endpoint_disabled).
A streak past half of what disables writes endpoint.failing, once per streak (its first failure's
time is the event's dedupe key); the disable itself writes endpoint.disabled (a trigger).
The failure streak is read from the database at most once per endpoint per check interval.
"""

from __future__ import annotations

import time
import uuid

import asyncpg

from billing import operational_outbox
from billing.database import Executor

from delivery.engine.retry import AutoDisablePolicy, FailureStreak, disable_reason, warning_policy

CHECK_INTERVAL_SECONDS = 600
CHECKED_ENDPOINTS_MAX = 10_000

_DISABLE = (
    "UPDATE endpoints SET enabled = false, disabled_reason = $3, updated_at = now()"
    " WHERE account_id = $1 AND id = $2 AND enabled AND deleted_at IS NULL"
)
_ENABLED = "SELECT true FROM endpoints WHERE account_id = $1 AND id = $2 AND enabled AND deleted_at IS NULL"
# The endpoint's current streak: failures since its last success (bounded to the last 30 days).
_STREAK = (
    "WITH attempts AS ("
    "   SELECT a.finished_at, a.status_code BETWEEN 200 AND 299 AS ok FROM delivery_attempts a"
    "   JOIN deliveries d ON d.account_id = a.account_id AND d.id = a.delivery_id"
    "   WHERE d.account_id = $1 AND a.account_id = $1 AND d.endpoint_id = $2 AND a.finished_at > now() - interval '30 days'),"
    " last_success AS (SELECT max(finished_at) AS at FROM attempts WHERE ok)"
    " SELECT min(finished_at) AS first_failure_at, max(finished_at) AS last_failure_at, count(*) AS failures"
    " FROM attempts WHERE NOT ok AND finished_at > coalesce((SELECT at FROM last_success), '-infinity')"
)


class EndpointHealth:
    def __init__(self, pool: asyncpg.Pool, policy: AutoDisablePolicy) -> None:
        self.pool = pool
        self.policy = policy
        self._checked_at: dict[uuid.UUID, float] = {}

    async def disable(self, account_id: uuid.UUID, endpoint_id: uuid.UUID, reason: str,
                      executor: Executor | None = None) -> bool:
        return await (executor or self.pool).execute(_DISABLE, account_id, endpoint_id, reason[:500]) == "UPDATE 1"

    async def check_failing(self, account_id: uuid.UUID, endpoint_id: uuid.UUID, executor: Executor | None = None) -> bool:
        """Disable the endpoint if its failure streak meets the policy. Returns True if disabled.
        On `executor` when given (the recorder's connection), else on the pool."""
        now = time.monotonic()
        if now - self._checked_at.get(endpoint_id, -CHECK_INTERVAL_SECONDS) < CHECK_INTERVAL_SECONDS:
            return False
        if len(self._checked_at) >= CHECKED_ENDPOINTS_MAX:
            self._checked_at.clear()
        self._checked_at[endpoint_id] = now
        row = await (executor or self.pool).fetchrow(_STREAK, account_id, endpoint_id)
        streak = FailureStreak(row["first_failure_at"], row["last_failure_at"], row["failures"], False)
        reason = disable_reason(streak, self.policy)
        if reason is None:
            await self._warn_if_failing(account_id, endpoint_id, streak, executor or self.pool)
        return reason is not None and await self.disable(account_id, endpoint_id, reason, executor)

    async def _warn_if_failing(self, account_id: uuid.UUID, endpoint_id: uuid.UUID, streak: FailureStreak,
                               executor: Executor) -> None:
        warning = disable_reason(streak, warning_policy(self.policy))
        if warning is None:
            return
        if await executor.fetchval(_ENABLED, account_id, endpoint_id):
            await operational_outbox.record_event(
                executor, account_id, "endpoint.failing",
                {"endpoint_id": str(endpoint_id), "failures": streak.failure_count,
                 "first_failure_at": streak.first_failure_at.isoformat(),
                 "last_failure_at": streak.last_failure_at.isoformat(), "detail": warning},
                dedupe_key=f"endpoint.failing:{endpoint_id}:{streak.first_failure_at.isoformat()}")
