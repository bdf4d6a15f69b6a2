"""The account-deletion job: close the account, settle every live delivery in bulk, close out.

    start_account_deletion   (API DELETE /v1/accounts/{id}, `hookledger accounts delete ID`)
        -> one account_deletions row per account (a second request shares it), status running
        -> an arq job `delete_account` at the head of the worker queue, in a slot kept for operator jobs
    delete_account / run_deletion
        begin_closing   the account turns closing: no new messages, pre-send checks settle
        bulk_settle     locking pre-check + one statement with the three-count check
        close_out       erase payloads, response excerpts, secrets, stored answers and sign-ins,
                        revoke keys, closeout:<account>, deleted
        report          counts, credits refunded, amount owed to the customer, duration, steps

Each step is one transaction that also records its step and counts in account_deletions, so a
job killed at any point is simply run again: the billing steps are idempotent, the counts of a
step are committed with the step's own writes, and a finished deletion is recognized and left
alone. Two jobs for one account: a session-level PostgreSQL advisory lock on the account id
lets one work; the other returns at once saying the deletion is running.

A step stopped by the database going away leaves the row running, so the sweep resumes it like a
lost job; any other error marks it failed for an operator. If the pre-check or the counts
disagree, nothing is settled: the status becomes waiting_repair
and the report names every delivery that differs and why (delivery.operations.repair shows and applies
the corrections; then start the deletion again).

Test hook: HOOKLEDGER_TEST_CRASH_AFTER_STEP=<step> makes the process exit at once (os._exit,
status 137, as after SIGKILL) right after that step committed. It is read in `_after_step`
only, and exists so that tests can prove a re-run finishes the work without refunding twice.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass

import asyncpg

from billing import closeout
from delivery import metrics, tracing
from delivery.store.connection_loss import lost_database
from delivery.engine import queue as job_queue
from delivery.engine.queue import REDIS_ERRORS
from billing.errors import AccountNotFound, BulkSettleMismatch

logger = logging.getLogger(__name__)

STEPS = ("begin_closing", "bulk_settle", "close_out", "report")
CRASH_AFTER_STEP_VARIABLE = "HOOKLEDGER_TEST_CRASH_AFTER_STEP"
MISMATCHES_REPORTED_MAX = 5_000  # the report names at most this many deliveries (and counts all)
JOB_NAME = "delete_account"
# The advisory lock's first key: a namespace so our account locks collide with no one else's.
ADVISORY_LOCK_NAMESPACE = 0x686C_6465  # "hlde"


@dataclass(frozen=True)
class DeletionState:
    id: uuid.UUID
    account_id: uuid.UUID
    status: str  # running | waiting_repair | done | failed
    step: str
    report: dict

    @classmethod
    def from_row(cls, row) -> DeletionState:
        report = row["report"]
        return cls(row["id"], row["account_id"], row["status"], row["step"],
                   json.loads(report) if isinstance(report, str) else dict(report))


# Create the account's deletion row, or reopen it unless it is done. Returns the row.
_OPEN = (
    "INSERT INTO account_deletions (id, account_id) VALUES ($1, $2)"
    " ON CONFLICT (account_id) DO UPDATE SET"
    "   status = CASE WHEN account_deletions.status = 'done' THEN 'done' ELSE 'running' END,"
    "   updated_at = now()"
    " RETURNING id, account_id, status, step, report"
)
_READ = "SELECT id, account_id, status, step, report FROM account_deletions WHERE account_id = $1"
# Record a step (and merge its facts into the report) in the step's own transaction.
_STEP = (
    "UPDATE account_deletions SET step = $2, updated_at = now(),"
    "   report = report || $3::jsonb || jsonb_build_object('steps', coalesce(report->'steps', '[]'::jsonb)"
    "       || jsonb_build_array(jsonb_build_object('step', $2::text, 'at', clock_timestamp())))"
    " WHERE account_id = $1"
)
_FINISH = (
    "UPDATE account_deletions SET status = $2, updated_at = now(),"
    "   finished_at = CASE WHEN $2 = 'done' THEN coalesce(finished_at, now()) END,"
    "   report = report || $3::jsonb"
    "       || jsonb_build_object('duration_seconds', round(extract(epoch FROM now() - started_at)::numeric, 3))"
    " WHERE account_id = $1 RETURNING id, account_id, status, step, report"
)


async def start_account_deletion(pool: asyncpg.Pool, queue_redis, account_id: uuid.UUID) -> uuid.UUID:
    """Record the deletion (or reopen it after a repair) and enqueue its job. Returns the deletion id.

    A finished deletion is not run again. `queue_redis` is the arq pool (delivery.engine.queue.connect);
    None records the deletion without enqueuing (the caller runs `run_deletion` itself).
    """
    state = await open_deletion(pool, account_id)
    if state.status != "done" and queue_redis is not None:
        # At the head of the queue, into a worker's slot for operator jobs: it never waits behind deliveries.
        try:
            await job_queue.enqueue_operator_job(queue_redis, JOB_NAME, str(account_id))
        except REDIS_ERRORS as error:
            # The deletion is recorded: the sweep resumes it once it has waited STALE_AFTER_SECONDS.
            logger.warning("could not enqueue the deletion of account %s (%r); the sweep will resume it",
                           account_id, error)
    return state.id


async def open_deletion(pool: asyncpg.Pool, account_id: uuid.UUID) -> DeletionState:
    if await pool.fetchval("SELECT 1 FROM accounts WHERE id = $1", account_id) is None:
        raise AccountNotFound(f"no account {account_id}")
    return DeletionState.from_row(await pool.fetchrow(_OPEN, uuid.uuid4(), account_id))


async def read_deletion(pool: asyncpg.Pool, account_id: uuid.UUID) -> DeletionState | None:
    row = await pool.fetchrow(_READ, account_id)
    return DeletionState.from_row(row) if row else None


# Deletions still `running` that no job has advanced for this long: their job was lost (Redis
# lost its keys, or the worker died mid-job). A live job updates the row at every step.
STALE_AFTER_SECONDS = 60
RESUMED_PER_SWEEP_MAX = 20
_STALE = (
    "SELECT account_id FROM account_deletions"
    " WHERE status = 'running' AND updated_at < now() - $1 * interval '1 second'"
    " ORDER BY updated_at LIMIT $2"
)


async def resume_stale(pool: asyncpg.Pool, queue_redis) -> list[uuid.UUID]:
    """Enqueue a job again for every deletion whose job was lost. Called by the worker's sweep.

    Redis is never the source of truth: the row in account_deletions is. A second job for a
    deletion still running elsewhere finds the advisory lock taken and returns at once.
    """
    rows = await pool.fetch(_STALE, STALE_AFTER_SECONDS, RESUMED_PER_SWEEP_MAX)
    for row in rows:
        await job_queue.enqueue_operator_job(queue_redis, JOB_NAME, str(row["account_id"]))
    return [row["account_id"] for row in rows]


async def delete_account(ctx: dict, account_id: str) -> dict:
    """The arq job: run the deletion of this account. Returns its status and report."""
    state = await run_deletion(ctx["pool"], uuid.UUID(account_id))
    return {"status": state.status, "step": state.step}


async def run_deletion(pool: asyncpg.Pool, account_id: uuid.UUID) -> DeletionState:
    """Run (or resume) the deletion under the account's advisory lock. See the module docstring."""
    async with pool.acquire() as lock_connection:
        locked = await lock_connection.fetchval(
            "SELECT pg_try_advisory_lock($1, hashtext($2::text))", ADVISORY_LOCK_NAMESPACE, str(account_id)
        )
        if not locked:
            state = await read_deletion(pool, account_id)
            logger.info("deletion of account %s is already running in another job", account_id)
            return DeletionState(state.id if state else uuid.UUID(int=0), account_id, "running",
                                 state.step if state else "queued", {"note": "another job is running this deletion"})
        try:
            with tracing.job_span("account_deletion", account_id=account_id) as span:
                state = await _run_locked(pool, account_id)
                tracing.set_outcome(span, state.status)
                return state
        finally:
            await lock_connection.execute(
                "SELECT pg_advisory_unlock($1, hashtext($2::text))", ADVISORY_LOCK_NAMESPACE, str(account_id)
            )


async def _run_locked(pool: asyncpg.Pool, account_id: uuid.UUID) -> DeletionState:
    state = await open_deletion(pool, account_id)
    if state.status == "done":
        return state
    started = time.monotonic()
    try:
        status = await _step(pool, account_id, "begin_closing", _begin_closing)
        if status != "deleted":
            await _step(pool, account_id, "bulk_settle", _bulk_settle)
            await _step(pool, account_id, "close_out", _close_out)
    except BulkSettleMismatch as mismatch:
        logger.warning("deletion of account %s waits for a repair: %s", account_id, mismatch)
        return await _finish(pool, account_id, "waiting_repair", _mismatch_report(mismatch))
    except Exception as error:
        if lost_database(error):
            # The database went away mid-step: the row stays running, and the sweep resumes it once
            # it has waited STALE_AFTER_SECONDS (a row marked failed would wait for an operator).
            logger.warning("deletion of account %s stopped: the database went away (%r); it will be resumed",
                           account_id, error)
            raise
        logger.exception("deletion of account %s failed", account_id)
        await _finish(pool, account_id, "failed", {"error": f"{type(error).__name__}: {error}"[:2000]})
        raise
    await _step(pool, account_id, "report", _report_step)
    state = await _finish(pool, account_id, "done", {
        "error": None, "mismatches": [], "mismatches_total": 0,
        "last_run_seconds": round(time.monotonic() - started, 3),
    })
    logger.info("account %s deleted: %s", account_id, state.report)
    return state


async def _step(pool: asyncpg.Pool, account_id: uuid.UUID, step: str, work):
    """Run one step and record it in the same transaction; then the crash hook."""
    with tracing.job_span(f"account_deletion.{step}", step=True, account_id=account_id):
        async with pool.acquire() as connection, connection.transaction():
            result, facts = await work(connection, account_id)
            await connection.execute(_STEP, account_id, step, json.dumps(facts))
    _after_step(step)
    return result


def _after_step(step: str) -> None:
    """The one place the test-only crash hook is read (see the module docstring)."""
    if os.environ.get(CRASH_AFTER_STEP_VARIABLE) == step:
        logging.shutdown()
        os._exit(137)


async def _begin_closing(connection, account_id):
    status = await closeout.begin_closing(connection, account_id)
    return status, {}


async def _bulk_settle(connection, account_id):
    settled = await closeout.bulk_settle(connection, account_id)
    metrics.count_deaths("account_deleted", settled.refunded)
    report = await _report(connection, account_id)
    # Counts add up over runs: a run after a crash settles what is left (usually nothing).
    return settled, {
        "locked": report.get("locked", 0) + settled.locked,
        "refunded": report.get("refunded", 0) + settled.refunded,
        "marked_dead": report.get("marked_dead", 0) + settled.marked_dead,
        "refunded_credits": report.get("refunded_credits", 0) + settled.refunded_amount,
    }


# What the closeout leaves that is the customer's or signs in as them: the receivers' response
# excerpts and the custom headers each attempt was sent with (the attempts' rows stay, for the
# ledger's and the audit's sake), and dashboard sign-ins. Counted: attempts that had either.
_ERASE_ACCOUNT_EXCERPTS = (
    "WITH erased AS (UPDATE delivery_attempts SET response_excerpt = NULL, sent_headers = NULL"
    " WHERE account_id = $1 AND (response_excerpt IS NOT NULL OR sent_headers IS NOT NULL) RETURNING 1)"
    " SELECT count(*) FROM erased"
)
_END_ACCOUNT_SESSIONS = (
    "WITH ended AS (DELETE FROM dashboard_sessions WHERE account_id = $1 RETURNING 1) SELECT count(*) FROM ended"
)


async def _close_out(connection, account_id):
    closed = await closeout.close_out(connection, account_id)
    # In the step's transaction, and again on a resumed run (both are idempotent): an answer recorded
    # late for an attempt of the account may have brought an excerpt since.
    excerpts = await connection.fetchval(_ERASE_ACCOUNT_EXCERPTS, account_id)
    sessions = await connection.fetchval(_END_ACCOUNT_SESSIONS, account_id)
    if closed.already_deleted:
        return closed, {}
    return closed, {
        "closeout_entry": closed.entry_id,
        "owed_to_customer": closed.owed_to_customer,
        "payloads_erased": closed.payloads_erased,
        "response_excerpts_erased": excerpts,
        "sessions_ended": sessions,
        "keys_revoked": closed.keys_revoked,
    }


async def _report_step(connection, account_id):
    """Facts read back from the ledger, so the report is right even when steps ran in several runs."""
    row = await connection.fetchrow(
        "SELECT a.status, a.balance, c.amount AS closeout_amount,"
        "   (SELECT count(*) FROM deliveries WHERE account_id = $1 AND state IN ('pending', 'sending')) AS live"
        " FROM accounts a LEFT JOIN ledger_entries c ON c.account_id = a.id AND c.id = 'closeout:' || a.id"
        " WHERE a.id = $1",
        account_id,
    )
    return None, {
        "account_status": row["status"],
        "balance_after": row["balance"],
        "owed_to_customer": -(row["closeout_amount"] or 0),
        "live_after": row["live"],
    }


async def _report(connection, account_id) -> dict:
    raw = await connection.fetchval("SELECT report FROM account_deletions WHERE account_id = $1", account_id)
    return json.loads(raw) if isinstance(raw, str) else dict(raw or {})


async def _finish(pool: asyncpg.Pool, account_id: uuid.UUID, status: str, facts: dict) -> DeletionState:
    return DeletionState.from_row(await pool.fetchrow(_FINISH, account_id, status, json.dumps(facts)))


def _mismatch_report(mismatch: BulkSettleMismatch) -> dict:
    named = [{"delivery_id": str(item.delivery_id), "problem": item.problem}
             for item in mismatch.mismatches[:MISMATCHES_REPORTED_MAX]]
    return {"error": mismatch.detail, "mismatches": named, "mismatches_total": len(mismatch.mismatches)}
