"""Claim due deliveries for sending, with attempt fencing, in batches.

A claim is one statement, its own transaction: `pending -> sending`, `attempt + 1`, a lease.
Rows are taken with FOR UPDATE SKIP LOCKED so concurrent workers never wait on each other. A
delivery that has already used its last attempt (e.g. its final lease expired) is settled
(`attempts_exhausted`) instead of claimed again.

Claims name their accounts, so that a distributed engine (Citus; or PostgreSQL's own hash
partitions, migration option HOOKLEDGER_ACCOUNT_PARTITIONS) can route each to one shard: with
`shards` (HOOKLEDGER_ACCOUNT_SHARDS) above 1, the deliveries to claim are grouped by the shard of
their account (billing.shards.shard_of: PostgreSQL's hash partition, or with `shard_hash` "citus"
the Citus shard) and each group is one statement. On one server every
worker claims for every shard: no worker owns a range, so none needs assigning.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import NamedTuple

import asyncpg

from billing.database import Executor, runs_alone, transaction
from billing.errors import LedgerMismatch
from billing.settle import DeadReason, settle
from billing.shards import by_shard
from delivery import tracing

logger = logging.getLogger(__name__)

CLAIM_BATCH_MAX = 1000
LEASE_MS_MIN = 1000
LEASE_MS_MAX = 3_600_000


class Claimed(NamedTuple):
    """A delivery on one attempt, with what the sender needs.

    A NamedTuple, not a frozen dataclass: thousands are made per second on the hot path, and a
    frozen dataclass pays an object.__setattr__ per field.
    """

    id: uuid.UUID
    account_id: uuid.UUID
    message_id: uuid.UUID
    endpoint_id: uuid.UUID
    attempt: int
    attempts_max: int


# Every statement here names the account of each delivery it touches (`account_id = k.account_id`,
# the primary key being (account_id, id)), so that a distributed engine can route it to the shards
# of those accounts; with HOOKLEDGER_ACCOUNT_SHARDS above 1, the callers below split their work so
# that each statement names the accounts of one shard only (billing.shards.partition_of).
class DeliveryKey(NamedTuple):
    """A delivery's primary key: its account first, as the tables are distributed by it."""

    account_id: uuid.UUID
    id: uuid.UUID


_DUE_FILTER = "state = 'pending' AND next_attempt_at <= now() AND attempt < attempts_max"
_DUE = (
    "WITH due AS ("
    "   SELECT account_id, id FROM deliveries"
    "   WHERE " + _DUE_FILTER + " ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED)"
)
# One primary-key probe per (account, delivery), whatever the statistics say: a LATERAL subquery
# that OFFSET 0 keeps PostgreSQL from flattening. As a plain `id = ANY($1)` filter, stale
# statistics (a burst of creates since the last ANALYZE, when few deliveries were pending) made
# PostgreSQL scan the whole due index instead: 40 ms for 500 ids rather than 23 ms. SKIP LOCKED
# never waits, so the order rows are locked in cannot deadlock. $1 the accounts, $3 the delivery ids
# (pairwise), $2 the lease as in every claim. `account_id = ANY($1)` repeats what the probe says, in
# the one form a distributed engine prunes shards by (a parameter, not a join with unnest's rows):
# with the accounts of one shard in $1, the statement runs on that shard alone.
_DUE_KEYS = (
    "WITH due AS ("
    "   SELECT p.account_id, p.id FROM unnest($1::uuid[], $3::uuid[]) AS k(account_id, id) CROSS JOIN LATERAL ("
    "     SELECT account_id, id FROM deliveries"
    "     WHERE account_id = k.account_id AND id = k.id AND account_id = ANY($1::uuid[]) AND " + _DUE_FILTER +
    "     OFFSET 0 FOR UPDATE SKIP LOCKED) p)"
)
# A job of the previous version carries bare delivery ids: claimed by id alone. Such a statement
# reaches every shard; it lasts only while those jobs drain (or the sweep finds them). It needs no
# index on bare ids (a write on every delivery created; migration 0025 keeps ix_deliveries_id for
# the trigger functions' probes only): one condition on every id of the job, which a plan serves
# with that index or, without it, with one walk of the live deliveries' partial index
# (ix_deliveries_account_live): O(live deliveries), never O(every delivery).
_DUE_BARE_IDS = (
    "WITH due AS ("
    "   SELECT account_id, id FROM deliveries"
    "   WHERE id = ANY($1::uuid[]) AND " + _DUE_FILTER + " FOR UPDATE SKIP LOCKED)"
)
# The rows `due` locked, found by index probes of their accounts and ids (arrays computed once, as
# before the keys named accounts), and checked pairwise against `due`. Not a join with `due`: on
# hash-partitioned tables PostgreSQL then hashed every partition's rows (32 ms at 100,000
# deliveries, growing with the table) rather than probing each key, as it estimates a probe per
# partition per key; the arrays keep it to index probes (3 ms).
def _take_due(accounts: str) -> str:
    return (
        " UPDATE deliveries d SET state = 'sending', attempt = d.attempt + 1,"
        "   leased_until = now() + $2 * interval '1 millisecond'"
        f" WHERE d.account_id = ANY({accounts}) AND d.id = ANY(ARRAY(SELECT id FROM due))"
        "   AND (d.account_id, d.id) IN (SELECT account_id, id FROM due)"
        " RETURNING d.id, d.account_id, d.message_id, d.endpoint_id, d.attempt, d.attempts_max, d.webhook_id"
    )


_TAKE_DUE = _take_due("ARRAY(SELECT account_id FROM due)")
_TAKE_KEYS = _take_due("$1::uuid[]")  # the accounts the caller named: one shard's, prunable as above
# What the pre-send check and the sender need, joined to a delivery `d` (delivery.engine.presend reads
# these columns by name). Here, so that a claim can return them in the same round trip. The
# delivery's own webhook_id (a replay's: NULL for every other delivery) comes with `d` itself.
SEND_COLUMNS = (
    "a.status AS account_status, e.url, e.timeout_ms, e.enabled, e.deleted_at IS NOT NULL AS endpoint_deleted,"
    " e.secret, CASE WHEN e.previous_secret_expires_at > now() THEN e.previous_secret END AS previous_secret,"
    " m.event_type, m.payload, e.headers, m.trace_context,"
    # An endpoint without a limit of its own is throttled at its application's. The subquery runs
    # only for such an endpoint (coalesce stops at the first non-null) and is one primary-key probe;
    # the claim's joins and their plan stay as they were.
    " coalesce(e.rate_limit_per_second,"
    "   (SELECT ap.rate_limit_per_second FROM applications ap"
    "    WHERE ap.account_id = e.account_id AND ap.id = e.application_id)) AS rate_limit_per_second"
)
# Each row joined within its delivery's account: on a distributed engine, rows of one shard.
SEND_JOINS = (
    " JOIN accounts a ON a.id = d.account_id"
    " JOIN endpoints e ON e.account_id = d.account_id AND e.id = d.endpoint_id"
    " JOIN messages m ON m.account_id = d.account_id AND m.id = d.message_id"
)


def _for_send(due: str, take: str, accounts: str | None = None) -> str:
    """The claim and the pre-send load in one statement: the joins read the rows as of the claim.
    With `accounts` (the claim by keys: `$1`), each joined table is also filtered by that array, so
    that its partitions or shards are pruned to the named accounts' as the deliveries' are."""
    columns, joins = SEND_COLUMNS, SEND_JOINS
    if accounts is not None:
        named = f" = ANY({accounts})"
        columns = columns.replace("WHERE ap.account_id = e.account_id", "WHERE ap.account_id = e.account_id AND ap.account_id" + named)
        joins = (
            " JOIN accounts a ON a.id = d.account_id AND a.id" + named +
            " JOIN endpoints e ON e.account_id = d.account_id AND e.id = d.endpoint_id AND e.account_id" + named +
            " JOIN messages m ON m.account_id = d.account_id AND m.id = d.message_id AND m.account_id" + named
        )
    return due + ", claimed AS (" + take + ") SELECT d.*, " + columns + " FROM claimed d" + joins


_CLAIM_DUE = _DUE + _TAKE_DUE
_CLAIM_KEYS = _DUE_KEYS + _TAKE_KEYS
_CLAIM_BARE_IDS = _DUE_BARE_IDS + _TAKE_DUE
_CLAIM_DUE_FOR_SEND = _for_send(_DUE, _TAKE_DUE)
_CLAIM_KEYS_FOR_SEND = _for_send(_DUE_KEYS, _TAKE_KEYS, "$1::uuid[]")
_CLAIM_BARE_IDS_FOR_SEND = _for_send(_DUE_BARE_IDS, _TAKE_DUE)
assert "ap.account_id = ANY($1::uuid[])" in _CLAIM_KEYS_FOR_SEND  # SEND_COLUMNS still reads as _for_send expects
# The sweep with more than one shard: the due deliveries of every account, read without a lock (a
# read across shards is fine on a distributed engine; a lock across them is one statement that no
# shard can run alone), then claimed shard by shard with _CLAIM_KEYS, which checks each again.
_FIND_DUE = (
    "SELECT account_id, id FROM deliveries WHERE " + _DUE_FILTER + " ORDER BY next_attempt_at LIMIT $1"
)
# Only deliveries whose charge is right: settle would refuse the others (LedgerMismatch), and a
# batch full of them must not hide healthy ones from every sweep. The audit reports them.
_EXHAUSTED = (
    "SELECT d.id, d.attempt, d.account_id,"
    "   (SELECT m.trace_context FROM messages m WHERE m.account_id = d.account_id AND m.id = d.message_id)"
    "   AS trace_context FROM deliveries d"
    " JOIN ledger_entries c ON c.id = 'charge:' || d.id AND c.account_id = d.account_id AND c.amount = -d.price"
    " WHERE d.state = 'pending' AND d.attempt >= d.attempts_max AND d.next_attempt_at <= now()"
    " ORDER BY d.next_attempt_at LIMIT $1"
)


def _check(batch_size: int, lease_ms: int) -> None:
    if not 1 <= batch_size <= CLAIM_BATCH_MAX:
        raise ValueError(f"batch_size must be 1..{CLAIM_BATCH_MAX}")
    if not LEASE_MS_MIN <= lease_ms <= LEASE_MS_MAX:
        raise ValueError(f"lease_ms must be {LEASE_MS_MIN}..{LEASE_MS_MAX}")


async def claim_due(executor: Executor, *, batch_size: int, lease_ms: int, shards: int = 1,
                    shard_hash: str = "postgres") -> list[Claimed]:
    """Claim up to batch_size due deliveries, oldest due first."""
    return [claimed for claimed, _ in await _claim_due(executor, False, batch_size, lease_ms, shards, shard_hash)]


async def claim_due_for_send(
    executor: Executor, *, batch_size: int, lease_ms: int, shards: int = 1, shard_hash: str = "postgres"
) -> list[tuple[Claimed, asyncpg.Record]]:
    """claim_due, each claimed delivery with its SEND_COLUMNS row (for delivery.engine.presend)."""
    return await _claim_due(executor, True, batch_size, lease_ms, shards, shard_hash)


async def claim_ids(executor: Executor, keys: Sequence[DeliveryKey], *, lease_ms: int, shards: int = 1,
                    shard_hash: str = "postgres") -> list[Claimed]:
    """Claim these deliveries (account, id) if they are due and nobody holds them (the fast path
    after a create): one statement per shard of their accounts."""
    return [claimed for claimed, _ in await _claim_keys(executor, _CLAIM_KEYS, keys, lease_ms, shards, shard_hash)]


async def claim_ids_for_send(
    executor: Executor, keys: Sequence[DeliveryKey], *, lease_ms: int, shards: int = 1, shard_hash: str = "postgres"
) -> list[tuple[Claimed, asyncpg.Record]]:
    """claim_ids, each claimed delivery with its SEND_COLUMNS row (for delivery.engine.presend)."""
    return await _claim_keys(executor, _CLAIM_KEYS_FOR_SEND, keys, lease_ms, shards, shard_hash)


async def claim_bare_ids_for_send(
    executor: Executor, delivery_ids: Sequence[uuid.UUID], *, lease_ms: int
) -> list[tuple[Claimed, asyncpg.Record]]:
    """claim_ids_for_send for a job of the previous version, which carries delivery ids without
    their accounts: one statement by id alone, as that version claimed them."""
    _check(max(1, len(delivery_ids)), lease_ms)
    if not delivery_ids:
        return []
    rows = await _fetch_alone(executor, _CLAIM_BARE_IDS_FOR_SEND, list(delivery_ids), lease_ms)
    return [(_claimed(row), row) for row in rows]


async def _claim_due(
    executor: Executor, for_send: bool, batch_size: int, lease_ms: int, shards: int, shard_hash: str
) -> list[tuple[Claimed, asyncpg.Record]]:
    _check(batch_size, lease_ms)
    if shards == 1:  # one statement, locking as it reads
        statement = _CLAIM_DUE_FOR_SEND if for_send else _CLAIM_DUE
        return [(_claimed(row), row) for row in await _fetch_alone(executor, statement, batch_size, lease_ms)]
    found = [DeliveryKey(row[0], row[1]) for row in await executor.fetch(_FIND_DUE, batch_size)]
    statement = _CLAIM_KEYS_FOR_SEND if for_send else _CLAIM_KEYS
    return await _claim_keys(executor, statement, found, lease_ms, shards, shard_hash)


async def _claim_keys(
    executor: Executor, statement: str, keys: Sequence[DeliveryKey], lease_ms: int, shards: int, shard_hash: str
) -> list[tuple[Claimed, asyncpg.Record]]:
    _check(max(1, len(keys)), lease_ms)
    claimed: list[tuple[Claimed, asyncpg.Record]] = []
    for group in by_shard(keys, shards, shard_hash):  # each statement names the accounts of one shard
        account_ids = [key.account_id for key in group]
        delivery_ids = [key.id for key in group]
        rows = await _fetch_alone(executor, statement, account_ids, lease_ms, delivery_ids)
        claimed.extend((_claimed(row), row) for row in rows)
    return claimed
async def _fetch_alone(executor: Executor, statement: str, *args: object) -> list[asyncpg.Record]:
    """Run one statement as its own transaction: in autocommit it is one already, so no BEGIN and
    COMMIT around it (two round trips fewer per claim; a lost answer is the same either way: the
    lease expires). Inside a caller's transaction, a savepoint, so that it fails alone."""
    if runs_alone(executor):
        return await executor.fetch(statement, *args)
    async with transaction(executor) as connection:
        return await connection.fetch(statement, *args)


def _claimed(row: asyncpg.Record) -> Claimed:
    # Positional: the statements return these six columns first, in this order.
    return Claimed(row[0], row[1], row[2], row[3], row[4], row[5])


async def settle_exhausted(pool: asyncpg.Pool, *, batch_size: int) -> int:
    """Settle due deliveries that already used every attempt (death path 4). Returns how many."""
    rows = await pool.fetch(_EXHAUSTED, batch_size)
    settled = 0
    for row in rows:
        try:
            with tracing.message_span("delivery.settle", row["trace_context"], delivery_id=row["id"],
                                      account_id=row["account_id"], attempt=row["attempt"],
                                      dead_reason=DeadReason.ATTEMPTS_EXHAUSTED.value) as span:
                result = await settle(pool, row["id"], DeadReason.ATTEMPTS_EXHAUSTED, account_id=row["account_id"],
                                      attempt=row["attempt"])
                tracing.set_outcome(span, result.outcome)
        except LedgerMismatch:
            # A stuck delivery beats a made-up refund, but one stuck delivery must not stop the
            # sweep for every other one: it stays for the audit and a repair; the rest settle.
            logger.error("delivery %s not settled: its ledger disagrees", row["id"], exc_info=True)
            continue
        settled += result.amount > 0 or result.outcome == "refunded"
    return settled
