#!/usr/bin/env python3
"""Operator benchmark: account deletion and the audit, each beside bare SQL doing the same row work.

Deletion: two accounts with N live deliveries each (default 100,000). One is deleted by
`delivery.operations.deletion.run_deletion` (every step: closing, pre-check + bulk settle with the count
check, closeout); the other by bare SQL in one transaction: one UPDATE marking dead, one INSERT
of the refunds, one balance UPDATE, without the pre-check. The bulk-settle step alone is shown
too (read from the deletion report's step times).

Audit: a consistent ledger of M entries (default 1,000,000: top-ups, charges, refunds; attempts
for the delivered) checked by `billing.audit.audit`, beside a bare `SELECT delivery_id,
sum(amount) ... GROUP BY delivery_id` plus the per-account balance sum.

Data is seeded set-based (INSERT ... SELECT generate_series), bypassing the application but
keeping the ledger consistent (the audit of the seed must be clean). Runs in a scratch database
on DATABASE_URL's server. Usage: scripts/bench_ops.py [--live N] [--ledger M]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from datetime import datetime
from pathlib import Path

from billing.audit import audit
from billing.database import create_pool
from delivery.platform import config
from delivery.operations import deletion
from delivery.platform import services
from scratch_database import scratch_database  # scripts/, beside this file

ACCOUNTS_FOR_AUDIT = 1000
PRICE = 2

_ACCOUNT = "INSERT INTO accounts (id, name, price_per_delivery) VALUES ($1, 'bench', $2)"
_TOPUP = (
    "WITH t AS (INSERT INTO ledger_entries (id, account_id, kind, amount)"
    " SELECT 'topup:' || a.id, a.id, 'topup', $2 FROM accounts a WHERE a.id = ANY($1::uuid[]) RETURNING account_id, amount)"
    " UPDATE accounts SET balance = balance + t.amount FROM t WHERE accounts.id = t.account_id"
)
_ENDPOINTS = (
    "INSERT INTO endpoints (id, account_id, url) SELECT gen_random_uuid(), a.id, 'https://example.com/h'"
    " FROM accounts a WHERE a.id = ANY($1::uuid[])"
)
# $1 accounts, $2 deliveries per account. State by n % 7: 0-2 dead, 3-4 delivered, 5-6 pending
# (or all pending with $3). One message per delivery, a charge for each, a refund for the dead,
# a 2xx attempt for the delivered, and the balances moved to match.
_SEED = """
WITH plan AS (
    SELECT a.id AS account_id, e.id AS endpoint_id, n, gen_random_uuid() AS message_id, gen_random_uuid() AS delivery_id,
        CASE WHEN $3 THEN 'pending' WHEN n % 7 < 3 THEN 'dead' WHEN n % 7 < 5 THEN 'delivered' ELSE 'pending' END AS state
    FROM unnest($1::uuid[]) AS a(id) JOIN endpoints e ON e.account_id = a.id, generate_series(1, $2) AS n
), m AS (
    INSERT INTO messages (id, account_id, event_type, payload)
    SELECT message_id, account_id, 'bench.event', '\\x7b7d' FROM plan
), d AS (
    INSERT INTO deliveries (id, account_id, message_id, endpoint_id, price, state, attempt, attempts_max, dead_reason,
        finished_at)
    SELECT delivery_id, account_id, message_id, endpoint_id, $4, state, CASE WHEN state = 'pending' THEN 0 ELSE 1 END,
        8, CASE WHEN state = 'dead' THEN 'out_of_retries' END, CASE WHEN state <> 'pending' THEN now() END FROM plan
), t AS (
    INSERT INTO delivery_attempts (delivery_id, attempt, account_id, started_at, status_code, latency_ms)
    SELECT delivery_id, 1, account_id, now(), 200, 10 FROM plan WHERE state = 'delivered'
), l AS (
    INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount)
    SELECT 'charge:' || delivery_id, account_id, delivery_id, 'charge', -$4::bigint FROM plan
    UNION ALL
    SELECT 'refund:' || delivery_id, account_id, delivery_id, 'refund', $4::bigint FROM plan WHERE state = 'dead'
    RETURNING account_id, amount
)
UPDATE accounts SET balance = balance + s.total
FROM (SELECT account_id, sum(amount) AS total FROM l GROUP BY account_id) s WHERE accounts.id = s.account_id
"""


async def _accounts(pool, count: int, balance: int) -> list[uuid.UUID]:
    account_ids = [uuid.uuid4() for _ in range(count)]
    await pool.executemany(_ACCOUNT, [(account_id, PRICE) for account_id in account_ids])
    await pool.execute(_TOPUP, account_ids, balance)
    await pool.execute(_ENDPOINTS, account_ids)
    return account_ids


async def _seed(pool, account_ids, per_account: int, *, all_live: bool) -> None:
    for start in range(0, len(account_ids), 50):
        await pool.execute(_SEED, account_ids[start:start + 50], per_account, all_live, PRICE)
    await pool.execute("ANALYZE")


async def bare_deletion(pool, account_id: uuid.UUID) -> float:
    started = time.perf_counter()
    async with pool.acquire() as connection, connection.transaction():
        await connection.execute(
            "UPDATE deliveries SET state = 'dead', dead_reason = 'account_deleted', leased_until = NULL,"
            " finished_at = now() WHERE account_id = $1 AND state IN ('pending', 'sending')", account_id)
        await connection.execute(
            "INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount)"
            " SELECT 'refund:' || id, account_id, id, 'refund', price FROM deliveries"
            " WHERE account_id = $1 AND dead_reason = 'account_deleted'", account_id)
        await connection.execute(
            "UPDATE accounts SET balance = balance + (SELECT sum(price) FROM deliveries WHERE account_id = $1)"
            " WHERE id = $1", account_id)
    return time.perf_counter() - started


async def real_deletion(pool, account_id: uuid.UUID) -> tuple[float, float]:
    started = time.perf_counter()
    state = await deletion.run_deletion(pool, account_id)
    elapsed = time.perf_counter() - started
    assert state.status == "done", state.report
    steps = {entry["step"]: datetime.fromisoformat(entry["at"]) for entry in state.report["steps"]}
    return elapsed, (steps["bulk_settle"] - steps["begin_closing"]).total_seconds()


async def bare_audit(pool) -> float:
    started = time.perf_counter()
    async with pool.acquire() as connection, connection.transaction(isolation="repeatable_read", readonly=True):
        # The same row work as the audit, with none of its checks: every ledger entry grouped by
        # delivery and joined to every delivery, the sums per account, each delivery's attempts,
        # and the running balance over the whole ledger (what I7 needs).
        await connection.fetchrow(
            "SELECT count(*), sum(t.s), sum(d.price) FROM (SELECT delivery_id, sum(amount) AS s"
            " FROM ledger_entries WHERE delivery_id IS NOT NULL GROUP BY delivery_id) t"
            " FULL JOIN deliveries d ON d.id = t.delivery_id")
        await connection.fetch("SELECT account_id, sum(amount) FROM ledger_entries GROUP BY account_id")
        await connection.fetchrow("SELECT count(*), max(a.attempt) FROM deliveries d"
                                  " JOIN delivery_attempts a ON a.delivery_id = d.id")
        await connection.fetchrow("SELECT min(running) FROM (SELECT sum(amount) OVER"
                                  " (PARTITION BY account_id ORDER BY seq) AS running FROM ledger_entries) t")
    return time.perf_counter() - started


async def real_audit(pool) -> float:
    started = time.perf_counter()
    report = await audit(pool)
    elapsed = time.perf_counter() - started
    assert report.clean, json.dumps(report.to_json()["violations"][:5], default=str)
    return elapsed


async def run(pool, live: int, ledger: int) -> list[tuple[str, float, float]]:
    rows = []
    real_account, bare_account = await _accounts(pool, 2, PRICE * live * 2)
    await _seed(pool, [real_account, bare_account], live, all_live=True)
    bare = await bare_deletion(pool, bare_account)
    total, settle_step = await real_deletion(pool, real_account)
    rows += [(f"deletion, {live:,} live: whole job", total, bare), (f"deletion, {live:,} live: bulk_settle step", settle_step, bare)]

    # Audit: per delivery 1 charge, and a refund for 3 of 7; plus one top-up per account.
    deliveries = int((ledger - ACCOUNTS_FOR_AUDIT - 4 * live - 2) / (1 + 3 / 7))
    audit_accounts = await _accounts(pool, ACCOUNTS_FOR_AUDIT, 10**12)
    await _seed(pool, audit_accounts, max(1, deliveries // ACCOUNTS_FOR_AUDIT), all_live=False)
    entries = await pool.fetchval("SELECT count(*) FROM ledger_entries")
    best_real = min([await real_audit(pool) for _ in range(3)])
    best_bare = min([await bare_audit(pool) for _ in range(3)])
    rows.append((f"audit, {entries:,} ledger entries", best_real, best_bare))
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, default=100_000, help="live deliveries of the deleted account")
    parser.add_argument("--ledger", type=int, default=1_000_000, help="ledger entries in the audited database")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    arguments = parser.parse_args()
    async with scratch_database(services.database_url(config.load().database)) as url:
        pool = await create_pool(url, size_min=2, size_max=4)
        try:
            rows = await run(pool, arguments.live, arguments.ledger)
        finally:
            await pool.close()
    print(f"\n{'operation':<44} {'real s':>8} {'bare SQL s':>11} {'ratio':>7}")
    for operation, real, bare in rows:
        print(f"{operation:<44} {real:>8.2f} {bare:>11.2f} {real / bare:>6.2f}x")
    if arguments.json:
        arguments.json.write_text(json.dumps({
            "benchmark": "ops", "live": arguments.live, "ledger": arguments.ledger,
            "rows": [{"operation": operation, "real_seconds": real, "bare_sql_seconds": bare, "ratio": real / bare}
                     for operation, real, bare in rows],
        }, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
