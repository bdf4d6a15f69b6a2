#!/usr/bin/env python3
"""Retention benchmark: bytes on disk per delivery before and after retention, and the retention
job's rate beside ingest's, in one run.

In a scratch database on DATABASE_URL's server: one account (retention 1 day), one endpoint; N
messages with 1 KiB payloads created through billing.messages.create_messages (the API's create
path, without HTTP), batches of 500: that is ingest's rate. Each delivery then gets an attempt
with a 200-byte response excerpt and is marked delivered by SQL, and the messages are aged past
retention. Size: pg_total_relation_size (heap, TOAST and indexes) of messages, deliveries,
ledger_entries and delivery_attempts, after VACUUM FULL of the four (so freed space is counted
as given back, as autovacuum plus reuse would over time), divided by N. Then
delivery.operations.retention.run_retention erases until the backlog is 0 (its rate), VACUUM FULL
again, size again; and beside each, the live rows' own bytes (sum of pg_column_size of every row,
no indexes), which do not depend on what the server could reclaim. Usage: scripts/bench_retention.py [--deliveries N] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from billing import accounts
from billing.database import create_pool
from billing.messages import MessageRequest, create_messages
from delivery.operations import retention
from delivery.platform import config, services
from scratch_database import scratch_database  # scripts/, beside this file

TABLES = ("messages", "deliveries", "ledger_entries", "delivery_attempts")
PAYLOAD_BYTES = 1024
BATCH = 500

_FINISH = (
    "WITH a AS (INSERT INTO delivery_attempts (delivery_id, attempt, account_id, started_at, status_code, latency_ms,"
    "   response_excerpt) SELECT id, 1, account_id, now(), 200, 5, repeat('r', 200) FROM deliveries RETURNING 1)"
    " UPDATE deliveries SET state = 'delivered', attempt = 1, finished_at = now()"
)


async def _bytes(pool) -> dict[str, int]:
    for table in TABLES:
        await pool.execute(f"VACUUM (FULL, ANALYZE) {table}")
    return {table: await pool.fetchval("SELECT pg_total_relation_size($1::regclass)", table) for table in TABLES}


async def _row_bytes(pool) -> dict[str, int]:
    """The live rows' own size (pg_column_size of each whole row, TOASTed values as stored), no indexes:
    what the data takes whatever the server could reclaim."""
    return {table: await pool.fetchval(f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {table} t") for table in TABLES}


async def run(deliveries: int) -> dict:
    async with scratch_database(services.database_url(config.load().database)) as url:
        pool = await create_pool(url, size_min=2, size_max=4)
        try:
            account = await accounts.create_account(pool, "bench", price_per_delivery=1, payload_retention_days=1)
            await accounts.top_up(pool, account.id, "bench", deliveries)
            await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES (gen_random_uuid(), $1,"
                               " 'https://example.com/h')", account.id)
            payload = b'{"pad":"' + b"x" * (PAYLOAD_BYTES - 10) + b'"}'
            started = time.monotonic()
            for start in range(0, deliveries, BATCH):
                requests = [MessageRequest(account.id, "bench.event", payload)
                            for _ in range(min(BATCH, deliveries - start))]
                for result in await create_messages(pool, requests, attempts_max=3):
                    assert not isinstance(result, Exception), result
            ingest_seconds = time.monotonic() - started
            await pool.execute(_FINISH)
            await pool.execute("UPDATE messages SET created_at = now() - interval '2 days'")
            before, rows_before = await _bytes(pool), await _row_bytes(pool)
            started = time.monotonic()
            erased = 0
            while True:
                run_ = await retention.run_retention(pool)
                erased += run_.erased
                if run_.erased == 0:
                    break
            retention_seconds = time.monotonic() - started
            assert await retention.backlog(pool) == 0 and erased == deliveries
            after, rows_after = await _bytes(pool), await _row_bytes(pool)
        finally:
            await pool.close()
    return {
        "deliveries": deliveries, "payload_bytes": PAYLOAD_BYTES,
        "bytes_per_delivery_before": round(sum(before.values()) / deliveries),
        "bytes_per_delivery_after": round(sum(after.values()) / deliveries),
        "row_bytes_per_delivery_before": round(sum(rows_before.values()) / deliveries),
        "row_bytes_per_delivery_after": round(sum(rows_after.values()) / deliveries),
        "tables_before": before, "tables_after": after, "rows_before": rows_before, "rows_after": rows_after,
        "ingest_messages_per_second": round(deliveries / ingest_seconds),
        "retention_erased_per_second": round(erased / retention_seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=20_000)
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    arguments = parser.parse_args()
    results = asyncio.run(run(arguments.deliveries))
    print(json.dumps(results, indent=2))
    if arguments.json:
        arguments.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
