"""The API's read queries: each statement named, described in one line, and scoped by account.

Pagination is by cursor, never by offset: deliveries newest first by id (ids are time-ordered
UUIDv7, so id order is creation order), ledger entries oldest first by seq. A page asks for
one row more than its limit to know whether there is a next page.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import asyncpg

from billing.database import Executor
from billing.tables import DELIVERY_STATES

_DELIVERY_COLUMNS = (
    "d.id, d.account_id, d.message_id, d.endpoint_id, m.event_type, d.state, d.attempt, d.attempts_max, d.price,"
    " d.next_attempt_at, d.dead_reason, d.created_at, d.finished_at, d.replay_of,"
    " coalesce(d.webhook_id, d.id) AS webhook_id"
)

# One page of an account's deliveries, newest first: the conditions of the filters given only
# (deliveries_page). Not "$n IS NULL OR ..." for each: a generic plan could then use no index
# but the account's pages in id order, and a page of a rare state (dead) read every row of the
# account. The state is written in as a literal, so that PostgreSQL may use the partial index of
# that state's rows in a generic plan too (ix_deliveries_account_dead, _account_live); it is one
# of DELIVERY_STATES, checked here as well as in the route.
_DELIVERIES_PAGE = (f"SELECT {_DELIVERY_COLUMNS} FROM deliveries d"
                   " JOIN messages m ON m.account_id = d.account_id AND m.id = d.message_id WHERE d.account_id = $1")
_DELIVERIES_CONDITIONS = (
    "d.endpoint_id = ${}::uuid", "d.message_id = ${}::uuid", "d.created_at > ${}::timestamptz",
    "d.created_at < ${}::timestamptz", "d.id < ${}::uuid",
)
# One delivery of an account.
_DELIVERY = (f"SELECT {_DELIVERY_COLUMNS}, m.payload_erased_at FROM deliveries d"
             " JOIN messages m ON m.account_id = d.account_id AND m.id = d.message_id WHERE d.id = $1 AND d.account_id = $2")
# Every recorded attempt of a delivery, in order (bounded by attempts_max <= 50).
_ATTEMPTS = (
    "SELECT attempt, started_at, finished_at, status_code, latency_ms, error, response_excerpt, stale, sent_headers"
    " FROM delivery_attempts WHERE delivery_id = $1 AND account_id = $2 ORDER BY attempt, finished_at LIMIT 100"
)
_LEDGER_COLUMNS = "id, seq, kind, amount, delivery_id, note, created_at"
# The ledger entries of one delivery (charge, refund, reclaim: at most three).
_DELIVERY_LEDGER = f"SELECT {_LEDGER_COLUMNS} FROM ledger_entries WHERE delivery_id = $1 AND account_id = $2 ORDER BY seq"
# One page of an account's ledger, oldest first, optionally for one delivery. Ordered by the
# account too: the order of its (account_id, seq) index, never of the plain index on seq, which a
# plan would walk through every account's entries.
_LEDGER_PAGE = (
    f"SELECT {_LEDGER_COLUMNS} FROM ledger_entries WHERE account_id = $1"
    " AND ($2::uuid IS NULL OR delivery_id = $2) AND seq > $3 ORDER BY account_id, seq LIMIT $4"
)
# One page of dead deliveries across every account, newest first (the operator's view: a read that
# spans accounts by nature), through
# ix_deliveries_dead from the cursor on. No cursor is the greatest uuid (ids are UUIDv7s, never
# all ones), not an "IS NULL OR": so the cursor is an index condition in a generic plan too,
# where "IS NULL OR" was a filter and a deep page read every row newer than its cursor.
_DEAD_PAGE = (
    f"SELECT {_DELIVERY_COLUMNS} FROM deliveries d JOIN messages m ON m.account_id = d.account_id AND m.id = d.message_id"
    " WHERE d.state = 'dead' AND d.id < coalesce($1::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff')"
    " ORDER BY d.id DESC LIMIT $2"
)
# The custom headers of an account's endpoint (NULL: none, or no such endpoint), for a delivery's detail.
_ENDPOINT_HEADERS = "SELECT headers FROM endpoints WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL"
# The message a delivery carries, for a replay.
_MESSAGE_OF_DELIVERY = (
    "SELECT d.state, d.endpoint_id, m.event_type, m.payload, m.payload_erased_at FROM deliveries d"
    " JOIN messages m ON m.account_id = d.account_id AND m.id = d.message_id"
    " WHERE d.id = $1 AND d.account_id = $2"
)
# Pending deliveries due now: the queue depth gauge.
# How late the queue runs, read at each scrape: the pending deliveries due now, how long the oldest
# of them has been due (what an operator pages on), and the deliveries waiting by state. Both
# counts walk their partial index (ix_deliveries_due, ix_deliveries_lease): O(backlog), not O(table).
_QUEUE_LAG = """
SELECT count(*) FILTER (WHERE next_attempt_at <= now()) AS due,
       coalesce(extract(epoch FROM now() - min(next_attempt_at) FILTER (WHERE next_attempt_at <= now())), 0)::float8
           AS oldest_due_seconds,
       count(*) AS pending,
       (SELECT count(*) FROM deliveries WHERE state = 'sending') AS sending
FROM deliveries WHERE state = 'pending'
"""
# The endpoints furthest behind, read at each scrape beside _QUEUE_LAG (the same walk of the pending
# deliveries): the $1 with the oldest due delivery ("lag", its age in seconds) and the $1 with the
# most pending deliveries that failed at least once ("retrying"; a claim given back unsent returns
# its attempt, so attempt > 0 on a pending delivery means a failure).
_WORST_ENDPOINTS = """
WITH per AS (
  SELECT endpoint_id,
         coalesce(extract(epoch FROM now() - min(next_attempt_at) FILTER (WHERE next_attempt_at <= now())), 0)::float8
             AS oldest_due_seconds,
         count(*) FILTER (WHERE attempt > 0) AS retrying
  FROM deliveries WHERE state = 'pending' GROUP BY endpoint_id)
SELECT 'lag' AS ranked_by, endpoint_id, value FROM (
  SELECT endpoint_id, oldest_due_seconds AS value FROM per WHERE oldest_due_seconds > 0
  ORDER BY oldest_due_seconds DESC LIMIT $1) by_lag
UNION ALL
SELECT 'retrying', endpoint_id, value FROM (
  SELECT endpoint_id, retrying::float8 AS value FROM per WHERE retrying > 0 ORDER BY retrying DESC LIMIT $1) by_retrying
"""


async def deliveries_page(
    executor: Executor,
    account_id: uuid.UUID,
    *,
    state: str | None,
    endpoint_id: uuid.UUID | None,
    message_id: uuid.UUID | None,
    created_after: datetime | None,
    created_before: datetime | None,
    before_id: uuid.UUID | None,
    limit: int,
) -> list[asyncpg.Record]:
    sql, arguments = _deliveries_page(state, (endpoint_id, message_id, created_after, created_before, before_id), limit)
    return await executor.fetch(sql, account_id, *arguments)


def _deliveries_page(state: str | None, values: tuple, limit: int) -> tuple[str, list]:
    """The statement for one page and its arguments after the account ($1): the given filters' conditions, then the size."""
    sql, arguments = [_DELIVERIES_PAGE], []
    if state is not None:
        if state not in DELIVERY_STATES:
            raise ValueError(f"not a delivery state: {state!r}")
        sql.append(f" AND d.state = '{state}'")
    for condition, value in zip(_DELIVERIES_CONDITIONS, values, strict=True):
        if value is not None:
            arguments.append(value)
            sql.append(" AND " + condition.format(len(arguments) + 1))
    arguments.append(limit + 1)
    # Ordered by the account too, though it is one: the order of the account's own indexes (its key,
    # its live and dead deliveries), never of the index on bare ids, which a plan would walk through
    # every account's rows.
    sql.append(f" ORDER BY d.account_id DESC, d.id DESC LIMIT ${len(arguments) + 1}")
    return "".join(sql), arguments


async def delivery(executor: Executor, account_id: uuid.UUID, delivery_id: uuid.UUID) -> asyncpg.Record | None:
    return await executor.fetchrow(_DELIVERY, delivery_id, account_id)


async def attempts(executor: Executor, account_id: uuid.UUID, delivery_id: uuid.UUID) -> list[asyncpg.Record]:
    return await executor.fetch(_ATTEMPTS, delivery_id, account_id)


async def delivery_ledger(executor: Executor, account_id: uuid.UUID, delivery_id: uuid.UUID) -> list[asyncpg.Record]:
    return await executor.fetch(_DELIVERY_LEDGER, delivery_id, account_id)


async def ledger_page(
    executor: Executor, account_id: uuid.UUID, *, delivery_id: uuid.UUID | None, after_seq: int, limit: int
) -> list[asyncpg.Record]:
    return await executor.fetch(_LEDGER_PAGE, account_id, delivery_id, after_seq, limit + 1)


async def dead_page(executor: Executor, *, before_id: uuid.UUID | None, limit: int) -> list[asyncpg.Record]:
    return await executor.fetch(_DEAD_PAGE, before_id, limit + 1)


async def endpoint_headers(executor: Executor, account_id: uuid.UUID, endpoint_id: uuid.UUID) -> str | None:
    """The endpoint's custom headers as stored (JSON text; delivery.store.endpoint_headers reads it)."""
    return await executor.fetchval(_ENDPOINT_HEADERS, endpoint_id, account_id)


async def message_of_delivery(executor: Executor, account_id: uuid.UUID, delivery_id: uuid.UUID) -> asyncpg.Record | None:
    return await executor.fetchrow(_MESSAGE_OF_DELIVERY, delivery_id, account_id)


def erased_text(erased_at: datetime | None) -> str:
    """How a refusal or a page names an erased payload: "erased on <date>" (UTC), or "erased"."""
    return f"erased on {erased_at.astimezone(UTC):%Y-%m-%d}" if erased_at is not None else "erased"


async def worst_endpoints(executor: Executor, limit: int) -> dict[str, list[tuple[uuid.UUID, float]]]:
    """The `limit` endpoints furthest behind by each measure ("lag", "retrying"): see _WORST_ENDPOINTS."""
    ranked: dict[str, list[tuple[uuid.UUID, float]]] = {"lag": [], "retrying": []}
    for row in await executor.fetch(_WORST_ENDPOINTS, limit):
        ranked[row["ranked_by"]].append((row["endpoint_id"], row["value"]))
    return ranked


async def queue_lag(executor: Executor) -> asyncpg.Record:
    """due, oldest_due_seconds, pending, sending: see _QUEUE_LAG."""
    return await executor.fetchrow(_QUEUE_LAG)
