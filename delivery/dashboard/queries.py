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

# One page of an account's deliveries, newest first, with the endpoint's URL and whether each was
# refunded and reclaimed (two primary-key probes of the ledger a row); $2.. NULL = any.
# Ordered by the account too, though it is one (as the API's deliveries pages): the order of the
# account's own indexes, never of an index on bare ids or seq, which a plan would walk through
# every account's rows.
_DELIVERIES_PAGE = (
    "SELECT d.id, d.endpoint_id, e.url AS endpoint_url, m.event_type, d.state, d.attempt, d.attempts_max, d.price,"
    "   d.next_attempt_at, d.dead_reason, d.created_at, d.finished_at, d.replay_of,"
    "   EXISTS (SELECT FROM ledger_entries r WHERE r.account_id = d.account_id AND r.id = 'refund:' || d.id::text) AS refunded,"
    "   EXISTS (SELECT FROM ledger_entries r WHERE r.account_id = d.account_id AND r.id = 'reclaim:' || d.id::text) AS reclaimed"
    " FROM deliveries d JOIN messages m ON m.account_id = d.account_id AND m.id = d.message_id JOIN endpoints e ON e.account_id = d.account_id AND e.id = d.endpoint_id"
    " WHERE d.account_id = $1"
    "   AND ($2::text IS NULL OR d.state = $2) AND ($3::uuid IS NULL OR d.endpoint_id = $3)"
    "   AND ($4::text IS NULL OR m.event_type = $4)"
    "   AND ($5::timestamptz IS NULL OR d.created_at >= $5) AND ($6::timestamptz IS NULL OR d.created_at < $6)"
    "   AND ($7::uuid IS NULL OR d.id < $7)"
    " ORDER BY d.account_id DESC, d.id DESC LIMIT $8"
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
    " FROM delivery_attempts a JOIN deliveries d ON d.account_id = a.account_id AND d.id = a.delivery_id"
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
    "   ORDER BY account_id DESC, seq DESC LIMIT $6),"
    " base AS (SELECT coalesce($7::bigint, (SELECT balance FROM accounts WHERE id = $1)"
    "   - coalesce((SELECT sum(amount) FROM ledger_entries WHERE account_id = $1 AND seq >= $5), 0)) AS before_cursor),"
    " span AS (SELECT seq, coalesce(sum(amount) OVER (ORDER BY seq DESC ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),"
    "   0) AS later FROM ledger_entries"
    "   WHERE account_id = $1 AND seq >= (SELECT min(seq) FROM page) AND ($5::bigint IS NULL OR seq < $5))"
    " SELECT p.*, (base.before_cursor - span.later)::bigint AS balance_after"
    " FROM page p JOIN span USING (seq) CROSS JOIN base ORDER BY p.seq DESC"
)
# The first $3 bytes of a delivery's payload as it was sent, and its whole size (NULL: erased).
_PAYLOAD_HEAD = (
    "SELECT substring(m.payload FROM 1 FOR $3) AS head, octet_length(m.payload) AS bytes"
    " FROM deliveries d JOIN messages m ON m.account_id = d.account_id AND m.id = d.message_id WHERE d.id = $1 AND d.account_id = $2"
)
# The deliveries that replay one delivery, oldest first (ix_deliveries_replay_of), at most $3.
_REPLAYS_OF = (
    "SELECT id, state, created_at FROM deliveries WHERE replay_of = $1 AND account_id = $2"
    " ORDER BY account_id, id LIMIT $3"
)
# An account's ledger summed per UTC day in [$2, $3): charged (charges and reclaims), refunded, the
# rest (top-ups, reversals, adjustments, close-out) and the change of the balance. Without an index
# on created_at, the entries are read from the (account_id, seq) index from a seq before the range:
# the newest entry a day older than its start (ledger writes are short transactions, so no entry
# of the range has a smaller seq), found by reading back from the newest.
_DAILY_TOTALS = (
    "WITH bound AS (SELECT coalesce((SELECT seq FROM ledger_entries WHERE account_id = $1"
    "   AND created_at < $2::timestamptz - interval '1 day' ORDER BY account_id DESC, seq DESC LIMIT 1), 0) AS after)"
    " SELECT (created_at AT TIME ZONE 'UTC')::date AS day,"
    "   count(*) FILTER (WHERE kind = 'charge')::int AS charges,"
    "   coalesce(-sum(amount) FILTER (WHERE kind IN ('charge', 'reclaim')), 0)::bigint AS charged,"
    "   coalesce(sum(amount) FILTER (WHERE kind = 'refund'), 0)::bigint AS refunded,"
    "   coalesce(sum(amount) FILTER (WHERE kind NOT IN ('charge', 'reclaim', 'refund')), 0)::bigint AS other,"
    "   sum(amount)::bigint AS change"
    " FROM ledger_entries WHERE account_id = $1 AND seq > (SELECT after FROM bound)"
    "   AND created_at >= $2 AND created_at < $3"
    " GROUP BY 1 ORDER BY 1"
)
# One page of an account's ledger, oldest first after the seq $5, each entry with the balance right
# after it: $7 (the balance after the cursor) plus every entry from the cursor to it, whatever the
# filters leave out (the CSV export, which starts at seq 0 and carries the balance page to page).
_LEDGER_ASCENDING = (
    "WITH page AS ("
    "   SELECT id, seq, kind, amount, delivery_id, note, created_at FROM ledger_entries"
    "   WHERE account_id = $1 AND ($2::text IS NULL OR kind = $2)"
    "     AND ($3::timestamptz IS NULL OR created_at >= $3) AND ($4::timestamptz IS NULL OR created_at < $4)"
    "     AND seq > $5 ORDER BY account_id, seq LIMIT $6),"
    " span AS (SELECT seq, sum(amount) OVER (ORDER BY seq) AS running FROM ledger_entries"
    "   WHERE account_id = $1 AND seq > $5 AND seq <= (SELECT max(seq) FROM page))"
    " SELECT p.*, ($7::bigint + span.running)::bigint AS balance_after FROM page p JOIN span USING (seq) ORDER BY p.seq"
)
# A top-up's ledger entry, by its order id (its entry's id is derived from it).
_TOPUP_ENTRY = "SELECT amount, created_at FROM ledger_entries WHERE id = 'topup:' || $2 AND account_id = $1"
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


async def payload_head(executor: Executor, account_id: uuid.UUID, delivery_id: uuid.UUID,
                       bytes_max: int) -> asyncpg.Record | None:
    return await executor.fetchrow(_PAYLOAD_HEAD, delivery_id, account_id, bytes_max)


async def replays_of(executor: Executor, account_id: uuid.UUID, delivery_id: uuid.UUID,
                     limit: int) -> list[asyncpg.Record]:
    return await executor.fetch(_REPLAYS_OF, delivery_id, account_id, limit)


async def daily_totals(executor: Executor, account_id: uuid.UUID, start: datetime, end: datetime) -> list[asyncpg.Record]:
    return await executor.fetch(_DAILY_TOTALS, account_id, start, end)


async def ledger_ascending(
    executor: Executor, account_id: uuid.UUID, *, kind: str | None, created_after: datetime | None,
    created_before: datetime | None, after_seq: int, balance_after_cursor: int, limit: int,
) -> list[asyncpg.Record]:
    """Up to `limit` entries after `after_seq`, oldest first, with the balance after each."""
    return await executor.fetch(_LEDGER_ASCENDING, account_id, kind, created_after, created_before, after_seq, limit,
                                balance_after_cursor)


async def topup_entry(executor: Executor, account_id: uuid.UUID, order_id: str) -> asyncpg.Record | None:
    return await executor.fetchrow(_TOPUP_ENTRY, account_id, order_id)


async def accounts_page(executor: Executor, *, after_id: uuid.UUID | None, limit: int) -> list[asyncpg.Record]:
    return await executor.fetch(_ACCOUNTS_PAGE, after_id, limit + 1)


async def deletions_page(
    executor: Executor, *, before: tuple[datetime, uuid.UUID] | None, limit: int
) -> list[asyncpg.Record]:
    started_at, deletion_id = before if before is not None else (None, None)
    return await executor.fetch(_DELETIONS_PAGE, started_at, deletion_id, limit + 1)


async def deletion(executor: Executor, account_id: uuid.UUID) -> asyncpg.Record | None:
    return await executor.fetchrow(_DELETION, account_id)
