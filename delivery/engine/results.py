"""Record what sends did, quoting the attempt, in batches; and expire lost leases.

A failure only changes a delivery still `sending` on the attempt it quotes (fencing). A success
marks the delivery delivered whenever it is still live, `sending` or `pending`, on that attempt
or a later one: its lease expired and a retry waits or is already on the wire, but the webhook
did arrive, so sending it again only makes a duplicate (receivers dedupe on webhook-id), and
dying later would refund a delivery that arrived. The later attempt's own result then matches
nothing. A write that matches nothing is stale and changes nothing, with one exception: a stale
success on a delivery that was meanwhile dead-lettered and refunded takes the refund back once
(billing.settle.reclaim). A failure on the last attempt settles the delivery
(`out_of_retries`). Rows are locked in id order, the one order every batched writer uses.

When one attempt has a failure on record and then its 2xx arrives (the failure was a lease
expiry's placeholder, or any other), the 2xx replaces the failure: the attempt row then says
what made the delivery delivered (audit I6). A failure never replaces a 2xx.

Times. An attempt's started_at is when its request left and finished_at when its answer (or
error) came in, not when the result was written. The worker measures both with its monotonic
clock (AttemptResult.sent_at and answered_at, time.monotonic()); record_results reads that clock
again just before its transaction begins and sends the two ages, in milliseconds, beside each
result. PostgreSQL anchors them to its own `now()` (the transaction's start): started_at =
now() - the send's age. So every time that decides a state change still comes from PostgreSQL's
clock, only shifted back by a duration the worker measured, which no wall-clock step can bend;
the error is the BEGIN's round trip, well under a millisecond on a healthy link. A failure's
retry delay counts from finished_at, the answer.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import asyncpg

from billing.errors import LedgerMismatch
from billing.settle import DeadReason, Outcome, reclaim, settle
from billing.shards import by_shard
from delivery import tracing
from delivery.engine.claims import DeliveryKey

logger = logging.getLogger(__name__)

RESULT_BATCH_MAX = 1000
LEASE_EXPIRED_ERROR = "lease expired before a result was recorded"


class AttemptResult(NamedTuple):
    """What one send did, to be recorded (a NamedTuple: one per send on the hot path)."""

    delivery_id: uuid.UUID
    attempt: int
    account_id: uuid.UUID
    success: bool
    latency_ms: int
    status_code: int | None = None
    error: str | None = None
    response_excerpt: str | None = None
    retry_delay_seconds: float = 0.0  # used when the attempt failed and another is left
    # never sent (it could not have ended within its lease, or was held back): the claim is given
    # back, due again after retry_delay_seconds
    released: bool = False
    # time.monotonic() when the request left and when its answer or error came in; None: unknown,
    # then started_at is taken as latency_ms before the write and finished_at as the write.
    sent_at: float | None = None
    answered_at: float | None = None
    # The endpoint's custom headers this attempt was sent with, as JSON text (None: it had none).
    sent_headers: str | None = None


@dataclass
class RecordSummary:
    delivered: list[uuid.UUID] = field(default_factory=list)
    retrying: list[uuid.UUID] = field(default_factory=list)
    settled: list[uuid.UUID] = field(default_factory=list)  # out_of_retries, refunded now
    stale: list[uuid.UUID] = field(default_factory=list)
    reclaimed: list[uuid.UUID] = field(default_factory=list)
    released: list[uuid.UUID] = field(default_factory=list)  # claims given back unsent, due again


# Every statement names the accounts of the rows it writes: rows are matched on (account_id, id)
# pairs, and `account_id = ANY(...)` lets a table distributed (or hash-partitioned) by account
# prune to the shards of those accounts.
_LOCK_IN_ORDER = (
    "SELECT d.id, d.state, d.attempt, d.attempts_max FROM deliveries d"
    " JOIN unnest($2::uuid[], $1::uuid[]) AS r(account_id, id) ON d.account_id = r.account_id AND d.id = r.id"
    " WHERE d.account_id = ANY($2::uuid[]) ORDER BY d.id FOR UPDATE OF d"
)
_MARK_DELIVERED = (
    "UPDATE deliveries d SET state = 'delivered', leased_until = NULL, finished_at = now()"
    " FROM unnest($1::uuid[], $2::int[], $3::uuid[]) AS r(id, attempt, account_id)"
    " WHERE d.account_id = ANY($3::uuid[]) AND d.account_id = r.account_id AND d.id = r.id"
    "   AND d.attempt >= r.attempt AND d.state IN ('sending', 'pending') RETURNING d.id"
)
_SCHEDULE_RETRY = (
    "UPDATE deliveries d SET state = 'pending', leased_until = NULL,"
    "   next_attempt_at = now() - r.answered_age_ms * interval '1 millisecond' + r.delay * interval '1 second'"
    " FROM unnest($1::uuid[], $2::int[], $3::float8[], $4::float8[], $5::uuid[])"
    "   AS r(id, attempt, delay, answered_age_ms, account_id)"
    " WHERE d.account_id = ANY($5::uuid[]) AND d.account_id = r.account_id AND d.id = r.id AND d.attempt = r.attempt AND d.state = 'sending' AND d.attempt < d.attempts_max"
    " RETURNING d.id"
)
# A claim given back unused: the attempt it took is handed back too, so a send that never left
# costs no attempt. Fenced like a result: it applies while the delivery is still sending on this
# attempt, past the lease's end too until the sweep expires it (the two take the row lock in
# turn, and the sweep skips a locked row); once the sweep or another worker's claim moved the
# delivery on, it matches nothing (tests/integration/engine/test_release_races.py).
# A claim held back (its endpoint paused or at its rate limit) is due again after its delay.
_RELEASE = (
    "UPDATE deliveries d SET state = 'pending', attempt = d.attempt - 1, leased_until = NULL,"
    "   next_attempt_at = now() + r.delay * interval '1 second'"
    " FROM unnest($1::uuid[], $2::int[], $3::float8[], $4::uuid[]) AS r(id, attempt, delay, account_id)"
    " WHERE d.account_id = ANY($4::uuid[]) AND d.account_id = r.account_id AND d.id = r.id"
    "   AND d.attempt = r.attempt AND d.state = 'sending' RETURNING d.id"
)
# A failure on record (a lease expiry's placeholder, or any other) is replaced by a 2xx of the
# same attempt when it reports in; a lease expiry's placeholder by whatever the send did. Ages are
# milliseconds before now() (see the module's docstring on times).
_INSERT_ATTEMPTS = (
    "INSERT INTO delivery_attempts AS a (delivery_id, attempt, account_id, started_at, finished_at,"
    "   status_code, latency_ms, error, response_excerpt, sent_headers, stale)"
    " SELECT r.d, r.n, r.a, now() - r.sa * interval '1 millisecond', now() - r.fa * interval '1 millisecond',"
    "   r.s, r.l, r.e, r.x, r.h::jsonb, r.stale"
    " FROM unnest($1::uuid[], $2::int[], $3::uuid[], $4::int[], $5::int[], $6::text[], $7::text[], $8::text[],"
    "   $9::bool[], $10::float8[], $11::float8[]) AS r(d, n, a, s, l, e, x, h, stale, sa, fa)"
    " ON CONFLICT (account_id, delivery_id, attempt) DO UPDATE SET status_code = excluded.status_code,"
    "   latency_ms = excluded.latency_ms, error = excluded.error, response_excerpt = excluded.response_excerpt,"
    "   sent_headers = excluded.sent_headers,"
    "   started_at = excluded.started_at, finished_at = excluded.finished_at, stale = excluded.stale"
    " WHERE a.error = '" + LEASE_EXPIRED_ERROR + "'"
    "   OR (excluded.status_code BETWEEN 200 AND 299 AND NOT coalesce(a.status_code BETWEEN 200 AND 299, false))"
)

# Only 2xx answers (what most writes hold): the deliveries and their attempts in one statement,
# its own transaction, one round trip instead of five. Locked in id order as in the transaction
# below: the update touches only rows the materialized locking subselect already holds.
_RECORD_SUCCESSES = (
    "WITH locked AS MATERIALIZED (SELECT d.id FROM deliveries d"
    "   JOIN unnest($3::uuid[], $1::uuid[]) AS r(account_id, id) ON d.account_id = r.account_id AND d.id = r.id"
    "   WHERE d.account_id = ANY($3::uuid[]) ORDER BY d.id FOR UPDATE OF d),"
    " delivered AS ("
    "   UPDATE deliveries d SET state = 'delivered', leased_until = NULL, finished_at = now()"
    "   FROM unnest($1::uuid[], $2::int[], $3::uuid[]) AS r(id, attempt, account_id)"
    "   WHERE d.account_id = ANY($3::uuid[]) AND d.account_id = r.account_id AND d.id = r.id"
    "     AND d.id IN (SELECT id FROM locked) AND d.attempt >= r.attempt"
    "     AND d.state IN ('sending', 'pending') RETURNING d.id),"
    " recorded AS ("
    "   INSERT INTO delivery_attempts AS a (delivery_id, attempt, account_id, started_at, finished_at,"
    "     status_code, latency_ms, error, response_excerpt, sent_headers, stale)"
    "   SELECT r.d, r.n, r.a, now() - r.sa * interval '1 millisecond', now() - r.fa * interval '1 millisecond',"
    "     r.s, r.l, r.e, r.x, r.h::jsonb, r.d NOT IN (SELECT id FROM delivered)"
    "   FROM unnest($1::uuid[], $2::int[], $3::uuid[], $4::int[], $5::int[], $6::text[], $7::text[], $8::text[],"
    "     $9::float8[], $10::float8[]) AS r(d, n, a, s, l, e, x, h, sa, fa)"
    "   ON CONFLICT (account_id, delivery_id, attempt) DO UPDATE SET status_code = excluded.status_code,"
    "     latency_ms = excluded.latency_ms, error = excluded.error, response_excerpt = excluded.response_excerpt,"
    "     sent_headers = excluded.sent_headers,"
    "     started_at = excluded.started_at, finished_at = excluded.finished_at, stale = excluded.stale"
    "   WHERE a.error = '" + LEASE_EXPIRED_ERROR + "'"
    "     OR (excluded.status_code BETWEEN 200 AND 299 AND NOT coalesce(a.status_code BETWEEN 200 AND 299, false)))"
    " SELECT id FROM delivered"
)


async def record_results(pool: asyncpg.Pool, results: list[AttemptResult], *,
                         connection: asyncpg.Connection | None = None) -> RecordSummary:
    """Apply a batch of send results; settle and reclaim afterwards, each in its own transaction.

    The write runs on `connection` when given (the recorder holds one while results keep coming),
    else on one of the pool's."""
    if not 1 <= len(results) <= RESULT_BATCH_MAX:
        raise ValueError(f"a result batch holds 1 to {RESULT_BATCH_MAX} results")
    if connection is None:
        async with pool.acquire() as acquired:
            return await record_results(pool, results, connection=acquired)
    if all(r.success and not r.released for r in results):
        return await _record_successes(connection, results)
    released = [r for r in results if r.released]
    if released:
        results = [r for r in results if not r.released]
    # Read just before BEGIN, whose now() anchors the ages measured from it.
    reference = time.monotonic()
    async with connection.transaction():
        summary, last_attempt_failures, fenced = await _apply(connection, reference, results, released)
    await _settle_and_reclaim(connection, results, last_attempt_failures, fenced, summary)
    return summary


async def _record_successes(connection: asyncpg.Connection, results: list[AttemptResult]) -> RecordSummary:
    summary = RecordSummary()
    columns = _result_columns(results)
    reference = time.monotonic()  # just before the statement, whose now() anchors the ages
    rows = await connection.fetch(_RECORD_SUCCESSES, *columns, [_sent_age_ms(r, reference) for r in results],
                                  [_answered_age_ms(r, reference) for r in results])
    summary.delivered = [row[0] for row in rows]
    await _settle_and_reclaim(connection, results, [], set(summary.delivered), summary)
    return summary


async def _apply(connection, reference: float, results: list[AttemptResult], released: list[AttemptResult]):
    """The transaction of record_results: lock in id order, release, deliver, reschedule, insert the attempts."""
    successes = [r for r in results if r.success]
    failures = [r for r in results if not r.success]
    summary = RecordSummary()
    rows = await connection.fetch(_LOCK_IN_ORDER, [r.delivery_id for r in (*results, *released)],
                                  [r.account_id for r in (*results, *released)])
    current = {row["id"]: row for row in rows}
    if released:
        summary.released = [row["id"] for row in await connection.fetch(
            _RELEASE, [r.delivery_id for r in released], [r.attempt for r in released],
            [r.retry_delay_seconds for r in released], [r.account_id for r in released])]
    if successes:
        summary.delivered = [row["id"] for row in await connection.fetch(
            _MARK_DELIVERED, [r.delivery_id for r in successes], [r.attempt for r in successes],
            [r.account_id for r in successes])]
    if failures:
        summary.retrying = [row["id"] for row in await connection.fetch(
            _SCHEDULE_RETRY,
            [r.delivery_id for r in failures],
            [r.attempt for r in failures],
            [r.retry_delay_seconds for r in failures],
            [_answered_age_ms(r, reference) for r in failures],
            [r.account_id for r in failures])]
    applied = set(summary.delivered) | set(summary.retrying)
    last_attempt_failures = [
        r for r in failures
        if r.delivery_id not in applied and _on_attempt(current.get(r.delivery_id), r.attempt, "sending")
    ]
    fenced = {r.delivery_id for r in last_attempt_failures} | applied
    if results:
        await connection.execute(_INSERT_ATTEMPTS, *_attempt_columns(results, fenced, reference))
    return summary, last_attempt_failures, fenced


async def _settle_and_reclaim(connection: asyncpg.Connection, results: list[AttemptResult],
                              last_attempt_failures: list[AttemptResult], fenced: set[uuid.UUID],
                              summary: RecordSummary) -> None:
    """After the commit, on the same connection: settle the last attempts that failed, reclaim the
    refunds of late 2xx answers (each its own transaction)."""
    for result in last_attempt_failures:
        try:
            with tracing.attempt_span("delivery.settle", result.delivery_id, result.attempt,
                                      dead_reason=DeadReason.OUT_OF_RETRIES.value) as span:
                settled = await settle(connection, result.delivery_id, DeadReason.OUT_OF_RETRIES,
                                       account_id=result.account_id, attempt=result.attempt)
                tracing.set_outcome(span, settled.outcome)
        except LedgerMismatch:
            # It stays stuck for the audit; the rest of the batch (its reclaims too) still applies.
            logger.error("delivery %s not settled: its ledger disagrees", result.delivery_id, exc_info=True)
            continue
        (summary.settled if settled.outcome == Outcome.REFUNDED else summary.stale).append(result.delivery_id)
    for result in results:
        if result.delivery_id in fenced:
            continue
        summary.stale.append(result.delivery_id)
        if not result.success:
            continue
        with tracing.attempt_span("delivery.reclaim", result.delivery_id, result.attempt) as span:
            outcome = (await reclaim(connection, result.delivery_id, account_id=result.account_id)).outcome
            tracing.set_outcome(span, outcome)
        if outcome == Outcome.RECLAIMED:
            summary.reclaimed.append(result.delivery_id)


def _on_attempt(row, attempt: int, state: str) -> bool:
    return row is not None and row["attempt"] == attempt and row["state"] == state


def _sent_age_ms(result: AttemptResult, reference: float) -> float:
    if result.sent_at is None:
        return max(0, int(result.latency_ms)) + _answered_age_ms(result, reference)
    return max(0.0, (reference - result.sent_at) * 1000)


def _answered_age_ms(result: AttemptResult, reference: float) -> float:
    if result.answered_at is None:
        return 0.0
    return max(0.0, (reference - result.answered_at) * 1000)


def _attempt_columns(results: list[AttemptResult], fenced: set[uuid.UUID], reference: float) -> list[list]:
    return [
        *_result_columns(results),
        [r.delivery_id not in fenced for r in results],
        [_sent_age_ms(r, reference) for r in results],
        [_answered_age_ms(r, reference) for r in results],
    ]


def _result_columns(results: list[AttemptResult]) -> list[list]:
    return [
        [r.delivery_id for r in results],
        [r.attempt for r in results],
        [r.account_id for r in results],
        [r.status_code for r in results],
        [max(0, int(r.latency_ms)) for r in results],
        [_bounded(r.error, 1000) for r in results],
        [_bounded(r.response_excerpt, 4096) for r in results],
        [r.sent_headers for r in results],
    ]


def _bounded(text: str | None, length_max: int) -> str | None:
    if not text:
        return None
    return text[:length_max]


# Late 2xx answers whose reclaim may have been lost: on a delivery still dead, of an active
# account (reclaim never runs on another), within the window (through the partial index of 0007).
# A read-only sweep that finds work across accounts (allowed to span them); each reclaim it
# leads to names its account.
LATE_SUCCESS_WINDOW_SECONDS = 86_400
_LATE_SUCCESSES = (
    "SELECT DISTINCT t.delivery_id, t.account_id,"
    "   (SELECT m.trace_context FROM messages m WHERE m.account_id = d.account_id AND m.id = d.message_id)"
    "   AS trace_context FROM delivery_attempts t"
    " JOIN deliveries d ON d.account_id = t.account_id AND d.id = t.delivery_id JOIN accounts a ON a.id = d.account_id"
    " WHERE t.stale AND t.status_code BETWEEN 200 AND 299 AND t.finished_at > now() - $2 * interval '1 second'"
    "   AND d.state = 'dead' AND a.status = 'active'"
    " LIMIT $1"
)


async def reclaim_late_successes(pool: asyncpg.Pool, *, batch_size: int) -> list[uuid.UUID]:
    """Reclaim the refunds of dead deliveries whose late 2xx was recorded but not reclaimed.

    record_results reclaims right after its transaction commits; a worker killed or a connection
    lost between the two leaves the 2xx recorded (stale) and the refund standing. The sweep runs
    this to finish the job. reclaim is at most once, so racing record_results is harmless.
    """
    reclaimed = []
    for row in await pool.fetch(_LATE_SUCCESSES, batch_size, float(LATE_SUCCESS_WINDOW_SECONDS)):
        try:
            with tracing.message_span("delivery.reclaim", row["trace_context"], delivery_id=row["delivery_id"]) as span:
                outcome = (await reclaim(pool, row["delivery_id"], account_id=row["account_id"])).outcome
                tracing.set_outcome(span, outcome)
        except LedgerMismatch:
            logger.error("delivery %s not reclaimed: its ledger disagrees", row["delivery_id"], exc_info=True)
            continue
        if outcome == Outcome.RECLAIMED:
            reclaimed.append(row["delivery_id"])
    return reclaimed


_EXPIRED_FILTER = "state = 'sending' AND leased_until < now()"
# The lease sweep on one server: expired leases of every account, locked as they are read, in id
# order (the one order every batched writer locks in).
_EXPIRED_LEASES = (
    "SELECT id, account_id, attempt FROM deliveries WHERE " + _EXPIRED_FILTER +
    " ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
)
# With more than one shard (HOOKLEDGER_ACCOUNT_SHARDS), as the claims do (delivery.engine.claims):
# the expired leases of every account read without a lock (a read across shards is fine on a
# distributed engine; a lock across them is a statement no shard can run alone), then locked shard
# by shard, each statement naming the accounts of one shard ($2, $3 pairwise with the ids), each
# row checked again under its lock. SKIP LOCKED never waits, so the order cannot deadlock.
_FIND_EXPIRED = "SELECT account_id, id FROM deliveries WHERE " + _EXPIRED_FILTER + " ORDER BY id LIMIT $1"
_EXPIRED_KEYS = (
    "SELECT p.id, p.account_id, p.attempt FROM unnest($2::uuid[], $3::uuid[]) AS k(account_id, id)"
    " CROSS JOIN LATERAL (SELECT id, account_id, attempt FROM deliveries"
    "   WHERE account_id = k.account_id AND id = k.id AND account_id = ANY($2::uuid[]) AND " + _EXPIRED_FILTER +
    "   OFFSET 0 FOR UPDATE SKIP LOCKED) p LIMIT $1"
)
# A delivery whose last attempt's lease expired has no next attempt to wait for: it is due at
# once, so the next sweep settles it (the lease outlived the send's timeout, so its result is
# not coming; a late 2xx after the refund still reclaims).
_RETURN_TO_PENDING = (
    "UPDATE deliveries d SET state = 'pending', leased_until = NULL,"
    "   next_attempt_at = now() + CASE WHEN d.attempt >= d.attempts_max THEN 0 ELSE r.delay END * interval '1 second'"
    " FROM unnest($1::uuid[], $2::float8[], $3::uuid[]) AS r(id, delay, account_id)"
    " WHERE d.account_id = ANY($3::uuid[]) AND d.account_id = r.account_id AND d.id = r.id"
)


async def expire_leases(
    pool: asyncpg.Pool, *, batch_size: int, delay_seconds: Callable[[int], float], shards: int = 1,
    shard_hash: str = "postgres",
) -> list[uuid.UUID]:
    """Treat expired `sending` leases as failed attempts (the worker died or stalled).

    The delivery goes back to pending with the backoff for its next attempt. One that used its
    last attempt is left pending at the limit, due at once; the next sweep settles it
    (attempts_exhausted). With `shards` above 1, one transaction per shard of the accounts found.
    """
    if shards == 1:
        async with pool.acquire() as connection, connection.transaction():
            return await _return_to_pending(connection, await connection.fetch(_EXPIRED_LEASES, batch_size),
                                            delay_seconds)
    found = [DeliveryKey(row[0], row[1]) for row in await pool.fetch(_FIND_EXPIRED, batch_size)]
    expired: list[uuid.UUID] = []
    for group in by_shard(found, shards, shard_hash):
        async with pool.acquire() as connection, connection.transaction():
            rows = await connection.fetch(_EXPIRED_KEYS, len(group), [key.account_id for key in group],
                                          [key.id for key in group])
            expired += await _return_to_pending(connection, rows, delay_seconds)
    return expired


async def _return_to_pending(connection: asyncpg.Connection, rows: list[asyncpg.Record],
                             delay_seconds: Callable[[int], float]) -> list[uuid.UUID]:
    """The locked deliveries whose leases expired back to pending, each with its lost attempt on record."""
    if not rows:
        return []
    ids = [row["id"] for row in rows]
    accounts = [row["account_id"] for row in rows]
    await connection.execute(_RETURN_TO_PENDING, ids, [float(delay_seconds(row["attempt"])) for row in rows], accounts)
    await connection.execute(
        _INSERT_ATTEMPTS,
        ids,
        [row["attempt"] for row in rows],
        accounts,
        [None] * len(rows),
        [0] * len(rows),
        [LEASE_EXPIRED_ERROR] * len(rows),
        [None] * len(rows),
        [None] * len(rows),  # what the lost send carried is not known; its own result brings it
        [False] * len(rows),
        [0.0] * len(rows),
        [0.0] * len(rows),
    )
    return ids
