"""Claim due deliveries for sending, with attempt fencing, in batches.

A claim is one short transaction: `pending -> sending`, `attempt + 1`, a lease. Rows are taken
with FOR UPDATE SKIP LOCKED so concurrent workers never wait on each other. A delivery that
has already used its last attempt (e.g. its final lease expired) is settled
(`attempts_exhausted`) instead of claimed again.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import asyncpg

from billing.database import Executor, transaction
from billing.errors import LedgerMismatch
from billing.settle import DeadReason, settle

logger = logging.getLogger(__name__)

CLAIM_BATCH_MAX = 1000
LEASE_MS_MIN = 1000
LEASE_MS_MAX = 3_600_000


@dataclass(frozen=True)
class Claimed:
    """A delivery on one attempt, with what the sender needs."""

    id: uuid.UUID
    account_id: uuid.UUID
    message_id: uuid.UUID
    endpoint_id: uuid.UUID
    attempt: int
    attempts_max: int


_CLAIM_DUE = (
    "WITH due AS ("
    "   SELECT id FROM deliveries"
    "   WHERE state = 'pending' AND next_attempt_at <= now() AND attempt < attempts_max"
    "   ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED)"
    " UPDATE deliveries d SET state = 'sending', attempt = d.attempt + 1,"
    "   leased_until = now() + $2 * interval '1 millisecond'"
    " FROM due WHERE d.id = due.id"
    " RETURNING d.id, d.account_id, d.message_id, d.endpoint_id, d.attempt, d.attempts_max"
)
_CLAIM_IDS = (
    "WITH due AS ("
    "   SELECT id FROM deliveries"
    "   WHERE id = ANY($1::uuid[]) AND state = 'pending' AND next_attempt_at <= now() AND attempt < attempts_max"
    "   ORDER BY id FOR UPDATE SKIP LOCKED)"
    " UPDATE deliveries d SET state = 'sending', attempt = d.attempt + 1,"
    "   leased_until = now() + $2 * interval '1 millisecond'"
    " FROM due WHERE d.id = due.id"
    " RETURNING d.id, d.account_id, d.message_id, d.endpoint_id, d.attempt, d.attempts_max"
)
# Only deliveries whose charge is right: settle would refuse the others (LedgerMismatch), and a
# batch full of them must not hide healthy ones from every sweep. The audit reports them.
_EXHAUSTED = (
    "SELECT d.id, d.attempt FROM deliveries d"
    " JOIN ledger_entries c ON c.id = 'charge:' || d.id AND c.account_id = d.account_id AND c.amount = -d.price"
    " WHERE d.state = 'pending' AND d.attempt >= d.attempts_max AND d.next_attempt_at <= now()"
    " ORDER BY d.next_attempt_at LIMIT $1"
)


def _check(batch_size: int, lease_ms: int) -> None:
    if not 1 <= batch_size <= CLAIM_BATCH_MAX:
        raise ValueError(f"batch_size must be 1..{CLAIM_BATCH_MAX}")
    if not LEASE_MS_MIN <= lease_ms <= LEASE_MS_MAX:
        raise ValueError(f"lease_ms must be {LEASE_MS_MIN}..{LEASE_MS_MAX}")


async def claim_due(executor: Executor, *, batch_size: int, lease_ms: int) -> list[Claimed]:
    """Claim up to batch_size due deliveries, oldest due first."""
    _check(batch_size, lease_ms)
    async with transaction(executor) as connection:
        rows = await connection.fetch(_CLAIM_DUE, batch_size, lease_ms)
    return [Claimed(**dict(row)) for row in rows]


async def claim_ids(executor: Executor, delivery_ids: list[uuid.UUID], *, lease_ms: int) -> list[Claimed]:
    """Claim these deliveries if they are due and nobody holds them (the fast path after a create)."""
    _check(max(1, len(delivery_ids)), lease_ms)
    if not delivery_ids:
        return []
    async with transaction(executor) as connection:
        rows = await connection.fetch(_CLAIM_IDS, delivery_ids, lease_ms)
    return [Claimed(**dict(row)) for row in rows]


async def settle_exhausted(pool: asyncpg.Pool, *, batch_size: int) -> int:
    """Settle due deliveries that already used every attempt (death path 4). Returns how many."""
    rows = await pool.fetch(_EXHAUSTED, batch_size)
    settled = 0
    for row in rows:
        try:
            result = await settle(pool, row["id"], DeadReason.ATTEMPTS_EXHAUSTED, attempt=row["attempt"])
        except LedgerMismatch:
            # A stuck delivery beats a made-up refund, but one stuck delivery must not stop the
            # sweep for every other one: it stays for the audit and a repair; the rest settle.
            logger.error("delivery %s not settled: its ledger disagrees", row["id"], exc_info=True)
            continue
        settled += result.amount > 0 or result.outcome == "refunded"
    return settled
