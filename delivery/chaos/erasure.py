"""Erasure under chaos: the retention job runs through the window beside the workload's expunges, and
afterwards the checks that erasure never touched a live delivery, a body sent or a ledger row.

Every account keeps payloads one day (workload.ERASURE_RETENTION_DAYS, the shortest the platform
allows); a run lasts minutes, so the `Eraser` makes the days pass: every AGE_EVERY_SECONDS it moves
the messages written more than AGED_AFTER_SECONDS ago two days back (finished or live alike: the
retention job must tell them apart), then runs delivery.operations.retention.run_retention in small
batches, so that many short erasing transactions interleave with the workers' claims, sends and
records, the sweeps, the deletions and the faults. PostgreSQL restarts under it: a pass that fails
is counted and the next one goes on. The workers' own `retention` cron runs too.

Before its first pass, and every LEDGER_SNAPSHOT_EVERY_PASSES passes, it takes the ledger's digest
(ids, amounts and times of the entries up to the last seq), which the checks compare afterwards:
the entries written before each snapshot are all there, unchanged, after all the erasing.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

import asyncpg

from billing.database import create_pool
from delivery.chaos.checks import DETAILS_MAX, Check
from delivery.chaos.receivers import ReceiverFarm
from delivery.chaos.workload import Workload
from delivery.operations import retention

AGE_EVERY_SECONDS = 1.0
AGED_AFTER_SECONDS = 2.0  # a message older than this is moved past its account's retention
RETENTION_BATCH_SIZE = 20  # messages per erasing transaction: small, so that there are many of them
LEDGER_SNAPSHOT_EVERY_PASSES = 10
LEDGER_SNAPSHOTS_MAX = 100
# What a pass meets when PostgreSQL restarts under it (InternalClientError: a connection the restart
# broke in the middle of a reset); the pool is then dropped and made again for the next pass.
PASS_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, OSError,
               asyncio.TimeoutError)

# Messages written more than $1 seconds ago and not aged yet, moved two days back.
_AGE = ("UPDATE messages SET created_at = created_at - interval '2 days' WHERE payload IS NOT NULL"
        " AND created_at > now() - interval '1 day' AND created_at < now() - $1 * interval '1 second'")
_LEDGER_DIGEST = ("SELECT count(*) AS entries, coalesce(md5(string_agg(id || ':' || amount || ':' || created_at::text,"
                  " ',' ORDER BY seq)), '') AS digest FROM ledger_entries WHERE seq <= $1")
_ERASED_BY = ("SELECT CASE WHEN payload_erased_by LIKE 'api_key:%' THEN 'expunge' ELSE coalesce(payload_erased_by, 'kept')"
              " END AS by, count(*) AS n FROM messages GROUP BY 1")
# Attempts that started after their message's payload was erased by an expunge or by retention.
# (An account deletion settles deliveries a worker may be sending, by design; it is not counted.)
_SENT_AFTER_ERASURE = (
    "SELECT a.delivery_id::text, a.attempt FROM delivery_attempts a"
    " JOIN deliveries d ON d.account_id = a.account_id AND d.id = a.delivery_id"
    " JOIN messages m ON m.account_id = d.account_id AND m.id = d.message_id WHERE m.payload_erased_at IS NOT NULL"
    " AND m.payload_erased_by <> 'account_deletion' AND a.started_at > m.payload_erased_at"
)
_EXCERPTS_OF_ERASED = (
    "SELECT a.delivery_id::text FROM delivery_attempts a"
    " JOIN deliveries d ON d.account_id = a.account_id AND d.id = a.delivery_id"
    " JOIN messages m ON m.account_id = d.account_id AND m.id = d.message_id WHERE m.payload IS NULL"
    " AND (a.response_excerpt IS NOT NULL OR a.sent_headers IS NOT NULL)"
)
# Deliveries the pre-send check settled for want of a payload (it says account_closed for that too)
# while their account stayed active: a live delivery's payload was erased.
_DIED_FOR_WANT_OF_PAYLOAD = (
    "SELECT d.id::text FROM deliveries d JOIN accounts a ON a.id = d.account_id"
    " WHERE d.dead_reason = 'account_closed' AND a.status = 'active'"
)
# The messages the API said it expunged, each read by its account and id ($1, $2 pairwise).
_EXPUNGED = ("SELECT m.id::text, m.payload IS NULL AS erased, m.payload_erased_at"
             " FROM unnest($1::uuid[], $2::uuid[]) AS k(account_id, id)"
             " JOIN messages m ON m.account_id = k.account_id AND m.id = k.id")


@dataclass
class Eraser:
    database_url: str
    tally: Counter = field(default_factory=Counter)
    ledger_snapshots: list[tuple[int, int, str]] = field(default_factory=list)  # (last seq, entries, digest)

    async def run(self, stop: asyncio.Event) -> None:
        """Age and erase every AGE_EVERY_SECONDS until `stop` is set."""
        pool = None
        try:
            while not stop.is_set():
                try:
                    pool = pool or await create_pool(self.database_url, size_min=1, size_max=2)
                    await self._pass(pool)
                except PASS_ERRORS as error:
                    self.tally["passes_failed"] += 1
                    self.tally[f"failed:{type(error).__name__}"] += 1
                    if pool is not None:
                        pool.terminate()
                        pool = None
                try:
                    await asyncio.wait_for(stop.wait(), AGE_EVERY_SECONDS)
                except asyncio.TimeoutError:
                    pass
        finally:
            if pool is not None:
                await pool.close()

    async def _pass(self, pool: asyncpg.Pool) -> None:
        if self.tally["passes"] % LEDGER_SNAPSHOT_EVERY_PASSES == 0 and len(self.ledger_snapshots) < LEDGER_SNAPSHOTS_MAX:
            seq = await pool.fetchval("SELECT coalesce(max(seq), 0) FROM ledger_entries")
            row = await pool.fetchrow(_LEDGER_DIGEST, seq)
            self.ledger_snapshots.append((seq, row["entries"], row["digest"]))
        status = await pool.execute(_AGE, AGED_AFTER_SECONDS)
        self.tally["messages_aged"] += int(status.split()[-1])
        run = await retention.run_retention(pool, batch_size=RETENTION_BATCH_SIZE)
        self.tally["passes"] += 1
        self.tally["batches"] += run.batches
        self.tally["erased"] += run.erased


async def erasure_checks(pool: asyncpg.Pool, workload: Workload, receivers: ReceiverFarm,
                         eraser: Eraser) -> tuple[list[Check], dict]:
    """The checks of erasure, and the facts the summary reports."""
    erased_by = {row["by"]: row["n"] for row in await pool.fetch(_ERASED_BY)}
    by_retention = erased_by.get(retention.ERASED_BY_RETENTION, 0)
    checks = [Check("erasure ran under the workload: retention and expunges",
                    by_retention > 0 and len(workload.expunged) > 0,
                    f"{by_retention} erased by retention, {len(workload.expunged)} expunged,"
                    f" {workload.tally['expunge_live']} expunges refused while live")]
    checks.append(Check("no body went out erased: every signed body was a payload the workload sent",
                        receivers.bodies_not_sent_by_the_workload == 0 and receivers.bodies_read > 0,
                        f"{receivers.bodies_read} bodies read, {receivers.bodies_not_sent_by_the_workload} not"
                        " the workload's"))
    starved = [row[0] for row in await pool.fetch(_DIED_FOR_WANT_OF_PAYLOAD)]
    checks.append(Check("no live delivery's payload was erased: none of an active account died unsent for want of it",
                        not starved, f"{len(starved)} died so {starved[:DETAILS_MAX]}"))
    late = await pool.fetch(_SENT_AFTER_ERASURE)
    checks.append(Check("no attempt started after its message was expunged or erased by retention", not late,
                        f"{len(late)} attempts {[tuple(row) for row in late[:DETAILS_MAX]]}"))
    kept = [row[0] for row in await pool.fetch(_EXCERPTS_OF_ERASED)]
    checks.append(Check("no response excerpt kept of an erased message", not kept,
                        f"{len(kept)} attempts keep one {kept[:DETAILS_MAX]}"))
    expunged = {message_id: at for message_id, (_, at) in workload.expunged.items()}
    accounts = [account_id for account_id, _ in workload.expunged.values()]
    rows = {row["id"]: row for row in await pool.fetch(_EXPUNGED, accounts, list(expunged))}
    wrong = [message_id for message_id, at in expunged.items()
             if message_id not in rows or not rows[message_id]["erased"] or rows[message_id]["payload_erased_at"] != at]
    checks.append(Check("every message the API said it expunged is erased, at the time it said", not wrong,
                        f"{len(workload.expunged)} expunged, {len(wrong)} not as answered {wrong[:DETAILS_MAX]}"))
    checks.append(await _ledger_check(pool, eraser))
    facts = {"erased_by": erased_by, "eraser": dict(eraser.tally), "expunged": len(workload.expunged),
             "expunged_twice": workload.tally["expunged_twice"], "expunge_refused_live": workload.tally["expunge_live"],
             "bodies_read": receivers.bodies_read}
    return checks, facts


async def _ledger_check(pool: asyncpg.Pool, eraser: Eraser) -> Check:
    name = "ledger entries are unchanged by erasure: every snapshot taken under it reads the same after"
    if not eraser.ledger_snapshots:
        return Check(name, False, "the eraser took no snapshot")
    changed = []
    for seq, entries, digest in eraser.ledger_snapshots:
        row = await pool.fetchrow(_LEDGER_DIGEST, seq)
        if (row["entries"], row["digest"]) != (entries, digest):
            changed.append(f"up to seq {seq}: {entries} entries then, {row['entries']} now")
    last_seq, last_entries, _ = eraser.ledger_snapshots[-1]
    return Check(name, not changed, f"{len(eraser.ledger_snapshots)} snapshots, the last {last_entries} entries up to"
                 f" seq {last_seq}; changed: {changed[:DETAILS_MAX]}")
