"""The dashboard's own read queries: each statement named, described in one line, set-based.

Reads the API already has (one delivery, its attempts and ledger entries) come from
`delivery.api.reads`; endpoints from `delivery.store.endpoints`; dead letters from
`delivery.operations.dead_letters`; balances from `billing.accounts`. What is here is what a page needs
besides those: a filter the API lacks, a chart's buckets, a running balance, operator lists.
No page issues a query per row.
"""

from __future__ import annotations

import uuid
from datetime import datetime

import asyncpg

from billing.database import Executor

# One page of an account's deliveries, newest first, with the endpoint's URL; $2.. NULL = any.
_DELIVERIES_PAGE = (
    "SELECT d.id, d.endpoint_id, e.url AS endpoint_url, m.event_type, d.state, d.attempt, d.attempts_max, d.price,"
    "   d.next_attempt_at, d.dead_reason, d.created_at, d.finished_at"
    " FROM deliveries d JOIN messages m ON m.id = d.message_id JOIN endpoints e ON e.id = d.endpoint_id"
    " WHERE d.account_id = $1"
    "   AND ($2::text IS NULL OR d.state = $2) AND ($3::uuid IS NULL OR d.endpoint_id = $3)"
    "   AND ($4::text IS NULL OR m.event_type = $4)"
    "   AND ($5::timestamptz IS NULL OR d.created_at >= $5) AND ($6::timestamptz IS NULL OR d.created_at < $6)"
    "   AND ($7::uuid IS NULL OR d.id < $7)"
    " ORDER BY d.id DESC LIMIT $8"
)
# An account's deliveries of the last 24 hours by hours ago (0..23) and state: the overview chart.
_HOURLY_OUTCOMES = (
    "SELECT floor(extract(epoch FROM now() - created_at) / 3600)::int AS hours_ago, state, count(*)::int AS count"
    " FROM deliveries WHERE account_id = $1 AND created_at > now() - interval '24 hours'"
    " GROUP BY 1, 2"
)
# Attempts of the last 24 hours per endpoint of an account: total and 2xx (endpoint health).
_ENDPOINT_ATTEMPTS = (
    "SELECT d.endpoint_id, count(*)::int AS attempts,"
    "   count(*) FILTER (WHERE a.status_code BETWEEN 200 AND 299)::int AS succeeded, max(a.finished_at) AS last_at"
    " FROM delivery_attempts a JOIN deliveries d ON d.id = a.delivery_id"
    " WHERE a.account_id = $1 AND a.finished_at > now() - interval '24 hours' AND NOT a.stale"
    " GROUP BY d.endpoint_id"
)
# One page of an account's ledger, newest first, each entry with the balance right after it.
# The balance after an entry is the balance before the cursor ($7, or the cached balance less
# every entry from the cursor on) less the entries between; one window over that span, so a
# page costs one scan from its oldest entry to the cursor, whatever the filters leave out.
_LEDGER_PAGE = (
    "WITH page AS ("
    "   SELECT id, seq, kind, amount, delivery_id, note, created_at FROM ledger_entries"
    "   WHERE account_id = $1 AND ($2::text IS NULL OR kind = $2)"
    "     AND ($3::timestamptz IS NULL OR created_at >= $3) AND ($4::timestamptz IS NULL OR created_at < $4)"
    "     AND ($5::bigint IS NULL OR seq < $5)"
    "   ORDER BY seq DESC LIMIT $6),"
    " base AS (SELECT coalesce($7::bigint, (SELECT balance FROM accounts WHERE id = $1)"
    "   - coalesce((SELECT sum(amount) FROM ledger_entries WHERE account_id = $1 AND seq >= $5), 0)) AS before_cursor),"
    " span AS (SELECT seq, coalesce(sum(amount) OVER (ORDER BY seq DESC ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),"
    "   0) AS later FROM ledger_entries"
    "   WHERE account_id = $1 AND seq >= (SELECT min(seq) FROM page) AND ($5::bigint IS NULL OR seq < $5))"
    " SELECT p.*, (base.before_cursor - span.later)::bigint AS balance_after"
    " FROM page p JOIN span USING (seq) CROSS JOIN base ORDER BY p.seq DESC"
)
# The operator's accounts page by id, with each account's in-flight credits (one statement).
_ACCOUNTS_PAGE = (
    "SELECT a.id, a.name, a.status, a.balance, a.price_per_delivery, a.created_at,"
    "   coalesce(live.in_flight, 0)::bigint AS in_flight, coalesce(live.deliveries, 0)::int AS live_deliveries"
    " FROM accounts a LEFT JOIN LATERAL (SELECT sum(d.price) AS in_flight, count(*) AS deliveries FROM deliveries d"
    "   WHERE d.account_id = a.id AND d.state IN ('pending', 'sending')) live ON true"
    " WHERE ($1::uuid IS NULL OR a.id > $1) ORDER BY a.id LIMIT $2"
)
_DELETION_COLUMNS = (
    "x.id, x.account_id, a.name AS account_name, x.status, x.step, x.started_at, x.updated_at, x.finished_at, x.report"
)
# One page of account-deletion jobs, newest first by (started_at, id).
_DELETIONS_PAGE = (
    f"SELECT {_DELETION_COLUMNS} FROM account_deletions x JOIN accounts a ON a.id = x.account_id"
    " WHERE ($1::timestamptz IS NULL OR (x.started_at, x.id) < ($1, $2::uuid))"
    " ORDER BY x.started_at DESC, x.id DESC LIMIT $3"
)
# One account's deletion job.
_DELETION = f"SELECT {_DELETION_COLUMNS} FROM account_deletions x JOIN accounts a ON a.id = x.account_id WHERE x.account_id = $1"


async def deliveries_page(
    executor: Executor, account_id: uuid.UUID, *, state: str | None, endpoint_id: uuid.UUID | None,
    event_type: str | None, created_after: datetime | None, created_before: datetime | None,
    before_id: uuid.UUID | None, limit: int,
) -> list[asyncpg.Record]:
    return await executor.fetch(
        _DELIVERIES_PAGE, account_id, state, endpoint_id, event_type, created_after, created_before, before_id, limit + 1
    )


async def hourly_outcomes(executor: Executor, account_id: uuid.UUID) -> list[tuple[int, str, int]]:
    return [(row["hours_ago"], row["state"], row["count"]) for row in await executor.fetch(_HOURLY_OUTCOMES, account_id)]


async def endpoint_attempts(executor: Executor, account_id: uuid.UUID) -> dict[uuid.UUID, asyncpg.Record]:
    return {row["endpoint_id"]: row for row in await executor.fetch(_ENDPOINT_ATTEMPTS, account_id)}


async def ledger_page(
    executor: Executor, account_id: uuid.UUID, *, kind: str | None, created_after: datetime | None,
    created_before: datetime | None, before_seq: int | None, limit: int, balance_before_cursor: int | None = None,
) -> list[asyncpg.Record]:
    """Up to limit + 1 entries (the extra one says there is a next page), newest first."""
    return await executor.fetch(
        _LEDGER_PAGE, account_id, kind, created_after, created_before, before_seq, limit + 1, balance_before_cursor
    )


async def accounts_page(executor: Executor, *, after_id: uuid.UUID | None, limit: int) -> list[asyncpg.Record]:
    return await executor.fetch(_ACCOUNTS_PAGE, after_id, limit + 1)


async def deletions_page(
    executor: Executor, *, before: tuple[datetime, uuid.UUID] | None, limit: int
) -> list[asyncpg.Record]:
    started_at, deletion_id = before if before is not None else (None, None)
    return await executor.fetch(_DELETIONS_PAGE, started_at, deletion_id, limit + 1)


async def deletion(executor: Executor, account_id: uuid.UUID) -> asyncpg.Record | None:
    return await executor.fetchrow(_DELETION, account_id)
