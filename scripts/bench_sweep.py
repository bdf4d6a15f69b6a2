#!/usr/bin/env python3
"""What the sweep's purge of the API's stored answers costs, beside the sweep's own work.

Every worker's sweep (`delivery.engine.Engine.sweep`) first does the deliveries' work (expired
leases, exhausted deliveries, lost reclaims), then purges the stored answers of keyed creates
past their retention (`delivery.idempotent_responses.purge_expired`). On a migrated scratch
database holding `--deliveries` live deliveries and `--answers` stored answers within their
retention, this times, round by round and alternating which goes first:

- the deliveries' work with nothing to do (the baseline: what each sweep pays today),
- the purge with nothing expired (what it adds to each such sweep),

and then one purge at its largest (PURGE_CHUNKS_MAX chunks of PURGE_CHUNK_ROWS expired answers).
It prints each one's wall time per sweep (median over rounds) and the purge's ratio to the
baseline. Wall time here is the database's time plus one round trip per statement.

Usage: DATABASE_URL=... scripts/bench_sweep.py [--deliveries N] [--answers M] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import time

import asyncpg

from billing import accounts
from billing.database import create_pool
from billing.messages import MessageRequest, create_messages
from delivery import claims, event_loop, idempotent_responses
from delivery.results import expire_leases, reclaim_late_successes
from scratch_database import scratch_database, server_url_from_environment  # scripts/, beside this file

_ENDPOINT = "INSERT INTO endpoints (id, account_id, url) VALUES (gen_random_uuid(), $1, 'https://example.com/hook')"
# Stored answers made `$2` hours ago, `$1` of them, under principals of 40 accounts' ids.
_ANSWERS = (
    "INSERT INTO idempotent_responses (principal, key, fingerprint, status, body, created_at)"
    " SELECT md5((n % 40)::text), 'key-' || n || '-' || $3, sha256(n::text::bytea), 201,"
    "   convert_to(repeat('x', 300), 'UTF8'), now() - make_interval(hours => $2)"
    " FROM generate_series(1, $1) AS n"
)


async def _seed(pool: asyncpg.Pool, deliveries: int, answers: int) -> None:
    account = await accounts.create_account(pool, "bench", price_per_delivery=1)
    await accounts.top_up(pool, account.id, f"o-{account.id}", 10**12)
    await pool.execute(_ENDPOINT, account.id)
    made = 0
    while made < deliveries:
        created = await create_messages(pool, [MessageRequest(account.id, "bench", b"{}") for _ in range(1000)],
                                        attempts_max=3)
        made += sum(len(message.deliveries) for message in created)
    await pool.execute(_ANSWERS, answers, 0.0, "live")
    await pool.execute("ANALYZE")


async def _deliveries_work(pool: asyncpg.Pool) -> None:
    await expire_leases(pool, batch_size=claims.CLAIM_BATCH_MAX, delay_seconds=lambda attempt: 0.0)  # nothing expires here
    await claims.settle_exhausted(pool, batch_size=claims.CLAIM_BATCH_MAX)
    await reclaim_late_successes(pool, batch_size=claims.CLAIM_BATCH_MAX)


async def _purge(pool: asyncpg.Pool) -> None:
    await idempotent_responses.purge_expired(pool)


async def _timed(work, pool: asyncpg.Pool) -> float:
    started = time.perf_counter()
    await work(pool)
    return time.perf_counter() - started


async def main(arguments: argparse.Namespace) -> None:
    async with scratch_database(server_url_from_environment()) as database_url:
        pool = await create_pool(database_url, size_min=1, size_max=1)
        try:
            await _seed(pool, arguments.deliveries, arguments.answers)
            for work in (_deliveries_work, _purge):  # warm the plans and the caches
                for _ in range(20):
                    await work(pool)
            times: dict[str, list[float]] = {"deliveries": [], "purge": []}
            for round_number in range(arguments.rounds):
                pair = [("deliveries", _deliveries_work), ("purge", _purge)]
                for name, work in pair if round_number % 2 == 0 else reversed(pair):
                    times[name].append(await _timed(work, pool))
            full = []
            largest = idempotent_responses.PURGE_CHUNK_ROWS * idempotent_responses.PURGE_CHUNKS_MAX
            for round_number in range(arguments.full_rounds):
                await pool.execute(_ANSWERS, largest, idempotent_responses.RETENTION_HOURS + 1.0, f"old{round_number}")
                started = time.perf_counter()
                purged = await idempotent_responses.purge_expired(pool)
                full.append(time.perf_counter() - started)
                assert purged == largest, (purged, largest)
        finally:
            await pool.close()
    baseline = statistics.median(times["deliveries"])
    idle = statistics.median(times["purge"])
    biggest = statistics.median(full)
    print(f"{arguments.deliveries:,} live deliveries, {arguments.answers:,} stored answers within their retention,"
          f" {arguments.rounds} rounds (medians)")
    rows = [
        ("sweep's deliveries work, nothing to do", baseline, ""),
        ("purge, nothing expired", idle, f"{idle / baseline:.2f}x the baseline"),
        (f"purge at its largest ({largest:,} expired)", biggest,
         f"{biggest / baseline:.1f}x the baseline ({largest / biggest:,.0f} rows/s; {arguments.full_rounds} rounds)"),
    ]
    for label, seconds, ratio in rows:
        print(f"  {label:<44} {seconds * 1e3:8.3f} ms   {ratio}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=20_000)
    parser.add_argument("--answers", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--full-rounds", type=int, default=5)
    event_loop.run(main(parser.parse_args()))
