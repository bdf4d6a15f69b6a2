#!/usr/bin/env python3
"""Retention benchmark: bytes on disk per delivery before and after retention, and the retention
job's rate beside ingest's, in one run.

In a scratch database on DATABASE_URL's server: one account (retention 1 day), one endpoint; N
messages with 1 KiB payloads created through billing.messages.create_messages (the API's create
path, without HTTP), batches of 500: that is ingest's rate. Each delivery then gets an attempt
with a 200-byte response excerpt and is marked delivered by SQL, and the messages are aged past
retention (by an UPDATE of created_at; --storage then rewrites messages with VACUUM FULL, since
that UPDATE leaves a dead copy of every payload that a server whose messages grew old would not hold). Then delivery.operations.retention.run_retention erases until the backlog is 0 (its rate).

Default: size = pg_total_relation_size (heap, TOAST and indexes) of messages, deliveries,
ledger_entries and delivery_attempts after VACUUM FULL of the four, before and after retention,
divided by N; beside each, the live rows' own bytes (sum of pg_column_size of every row, no indexes).

--storage: the same tables measured as a running server sees them, per table. After plain VACUUM
(ANALYZE) before retention; after retention and plain VACUUM (the files keep their size: the freed
space is free space inside them, counted by pgstattuple, and the live rows' bytes drop); then N
more deliveries are written into those files and vacuumed (how much the files grew: the freed
space reused), and after retention erased those too, VACUUM FULL (what rewriting gives back).

--index-cost: ingest's rate with and without the partial index ix_messages_retained (the
retention job's way to the oldest kept payloads), in two scratch databases in the same run,
rounds alternating between them so that load on the machine falls on both alike.

Usage: scripts/bench_retention.py [--deliveries N] [--storage | --index-cost [--rounds R]] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import asyncpg

from billing import accounts
from billing.database import create_pool
from billing.messages import MessageRequest, create_messages
from delivery.operations import retention
from delivery.platform import config, services
from scratch_database import scratch_database  # scripts/, beside this file

TABLES = ("messages", "deliveries", "ledger_entries", "delivery_attempts")
PAYLOAD_BYTES = 1024
BATCH = 500
DATABASE_PREFIX = "hookledger_bench_retention"
RETAINED_INDEX = "ix_messages_retained"
VACUUM_RETRY_SECONDS = 3.0
VACUUM_WAIT_SECONDS_MAX = 180.0

# Every delivery not yet finished gets one attempt with a 200-byte excerpt and is marked delivered.
_FINISH = (
    "WITH pending AS (SELECT id, account_id FROM deliveries WHERE state = 'pending'),"
    " a AS (INSERT INTO delivery_attempts (delivery_id, attempt, account_id, started_at, status_code, latency_ms,"
    "   response_excerpt) SELECT id, 1, account_id, now(), 200, 5, repeat('r', 200) FROM pending RETURNING 1)"
    " UPDATE deliveries d SET state = 'delivered', attempt = 1, finished_at = now() FROM pending p WHERE d.id = p.id"
)
_AGE = "UPDATE messages SET created_at = created_at - interval '2 days' WHERE payload IS NOT NULL"
# One table as the server holds it: the whole (heap, TOAST, indexes), and its parts. Summed over
# its leaves, so that a table hash-partitioned by account (HOOKLEDGER_ACCOUNT_PARTITIONS) counts
# its partitions; a plain table is its own one leaf. An index's leaves likewise.
# (pg_partition_tree lists nothing for a plain table or index.)
_LEAF_OIDS = ("(SELECT relid FROM pg_partition_tree($1::regclass) WHERE isleaf"
              " UNION ALL SELECT $1::regclass WHERE NOT EXISTS (SELECT FROM pg_partition_tree($1::regclass)))")
_LEAVES = "FROM pg_class c WHERE c.oid IN " + _LEAF_OIDS
_SIZES = (
    "SELECT sum(pg_total_relation_size(c.oid))::bigint AS total, sum(pg_relation_size(c.oid))::bigint AS heap,"
    " sum(coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0))::bigint AS toast,"
    " sum(pg_indexes_size(c.oid))::bigint AS indexes " + _LEAVES
)
_TOTAL = "SELECT sum(pg_total_relation_size(c.oid))::bigint " + _LEAVES
_INDEX_SIZE = "SELECT sum(pg_relation_size(c.oid))::bigint " + _LEAVES
_HEAP_STATS = ("SELECT sum(s.free_space)::bigint AS free_space, sum(s.dead_tuple_len)::bigint AS dead_tuple_len"
               " FROM " + _LEAF_OIDS + " t(relid) CROSS JOIN LATERAL pgstattuple(t.relid) s")


async def _setup(pool: asyncpg.Pool, deliveries: int):
    account = await accounts.create_account(pool, "bench", price_per_delivery=1, payload_retention_days=1)
    await accounts.top_up(pool, account.id, "bench", deliveries)
    await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES (gen_random_uuid(), $1,"
                       " 'https://example.com/h')", account.id)
    return account


async def _ingest(pool: asyncpg.Pool, account_id, deliveries: int) -> float:
    """Create `deliveries` messages (one delivery each) in batches; returns the seconds it took."""
    payload = b'{"pad":"' + b"x" * (PAYLOAD_BYTES - 10) + b'"}'
    started = time.monotonic()
    for start in range(0, deliveries, BATCH):
        requests = [MessageRequest(account_id, "bench.event", payload) for _ in range(min(BATCH, deliveries - start))]
        for result in await create_messages(pool, requests, attempts_max=3):
            assert not isinstance(result, Exception), result
    return time.monotonic() - started


async def _erase_all(pool: asyncpg.Pool) -> tuple[int, float]:
    """Run the retention job until it finds nothing; returns (erased, seconds)."""
    started = time.monotonic()
    erased = 0
    while True:
        run_ = await retention.run_retention(pool)
        erased += run_.erased
        if run_.erased == 0:
            break
    assert await retention.backlog(pool) == 0
    return erased, time.monotonic() - started


async def _age_in_place(pool: asyncpg.Pool) -> None:
    """Age the kept messages past retention as if they had been written two days ago: the UPDATE writes a
    second version of every row, payload and all, which no server would hold, so VACUUM FULL takes it out."""
    await pool.execute(_AGE)
    await _vacuum_until_clean(pool, full=True, tables=("messages",))


async def _vacuum(pool: asyncpg.Pool, *, full: bool, tables: tuple[str, ...] = TABLES) -> None:
    for table in tables:
        await pool.execute(f"VACUUM ({'FULL, ' if full else ''}ANALYZE) {table}")


async def _vacuum_until_clean(pool: asyncpg.Pool, *, full: bool, tables: tuple[str, ...] = TABLES) -> None:
    """VACUUM, again every VACUUM_RETRY_SECONDS while dead rows remain, up to VACUUM_WAIT_SECONDS_MAX.
    On a shared server another session's snapshot (in any database) can keep VACUUM from removing
    the rows that died just before; waiting for it to end measures what a quiet server holds.
    Whatever still remains is reported (heap_dead), never hidden."""
    deadline = time.monotonic() + VACUUM_WAIT_SECONDS_MAX
    while True:
        await _vacuum(pool, full=full, tables=tables)
        dead = sum([(await pool.fetchrow(_HEAP_STATS, t))["dead_tuple_len"] for t in tables])
        if dead == 0 or time.monotonic() > deadline:
            return
        await asyncio.sleep(VACUUM_RETRY_SECONDS)


async def _bytes(pool) -> dict[str, int]:
    await _vacuum(pool, full=True)
    return {table: await pool.fetchval(_TOTAL, table) for table in TABLES}


async def _row_bytes(pool) -> dict[str, int]:
    """The live rows' own size (pg_column_size of each whole row, TOASTed values as stored), no indexes:
    what the data takes whatever the server could reclaim."""
    return {table: await pool.fetchval(f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {table} t") for table in TABLES}


async def _tables(pool) -> dict[str, dict[str, int]]:
    """Per table: total, heap, toast, indexes (bytes of the files), live_rows (the rows' own bytes),
    heap_free (free space inside the heap after VACUUM, by pgstattuple: what new rows reuse) and
    heap_dead (dead rows VACUUM could not remove: another session's snapshot held them, and then
    the figures count space a quiet server would have freed)."""
    rows = await _row_bytes(pool)
    tables = {}
    for table in TABLES:
        sizes = dict(await pool.fetchrow(_SIZES, table))
        stats = await pool.fetchrow(_HEAP_STATS, table)
        tables[table] = {**sizes, "live_rows": rows[table], "heap_free": stats["free_space"],
                         "heap_dead": stats["dead_tuple_len"]}
    tables[RETAINED_INDEX] = {"total": await pool.fetchval(_INDEX_SIZE, RETAINED_INDEX)}
    return tables


def _per_delivery(tables: dict, deliveries: int, field: str = "total") -> int:
    return round(sum(table[field] for name, table in tables.items() if name in TABLES) / deliveries)


async def run_rates(deliveries: int) -> dict:
    """The default run: ingest's and the retention job's rates, bytes per delivery after VACUUM FULL."""
    async with scratch_database(services.database_url(config.load().database), DATABASE_PREFIX) as url:
        pool = await create_pool(url, size_min=2, size_max=4)
        try:
            account = await _setup(pool, deliveries)
            ingest_seconds = await _ingest(pool, account.id, deliveries)
            await pool.execute(_FINISH)
            await pool.execute(_AGE)
            before, rows_before = await _bytes(pool), await _row_bytes(pool)
            erased, retention_seconds = await _erase_all(pool)
            assert erased == deliveries
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


async def run_storage(deliveries: int) -> dict:
    """--storage: sizes as a running server holds them, after plain VACUUM, after reuse, after VACUUM FULL."""
    async with scratch_database(services.database_url(config.load().database), DATABASE_PREFIX) as url:
        pool = await create_pool(url, size_min=2, size_max=4)
        try:
            await pool.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
            account = await _setup(pool, 2 * deliveries)
            ingest_seconds = await _ingest(pool, account.id, deliveries)
            await pool.execute(_FINISH)
            await _age_in_place(pool)
            await _vacuum_until_clean(pool, full=False)
            kept = await _tables(pool)
            erased, retention_seconds = await _erase_all(pool)
            await _vacuum_until_clean(pool, full=False)
            erased_vacuumed = await _tables(pool)
            await _ingest(pool, account.id, deliveries)  # into the freed space, payloads kept
            await pool.execute(_FINISH)
            await _vacuum_until_clean(pool, full=False)
            reused = await _tables(pool)
            await pool.execute(_AGE)
            erased_again, _ = await _erase_all(pool)
            assert erased == erased_again == deliveries
            await _vacuum_until_clean(pool, full=True)
            rewritten = await _tables(pool)
        finally:
            await pool.close()
    grown = _per_delivery(reused, deliveries) - _per_delivery(erased_vacuumed, deliveries)
    phases = {"kept_after_vacuum": kept, "erased_after_vacuum": erased_vacuumed,
              "second_batch_kept_after_vacuum": reused, "both_erased_after_vacuum_full": rewritten}
    held = {phase: sum(tables[name]["heap_dead"] for name in TABLES) for phase, tables in phases.items()}
    return {
        "dead_bytes_vacuum_could_not_remove": held,  # all 0 unless another session held VACUUM back
        "deliveries": deliveries, "payload_bytes": PAYLOAD_BYTES,
        "ingest_messages_per_second": round(deliveries / ingest_seconds),
        "retention_erased_per_second": round(erased / retention_seconds),
        "bytes_per_delivery": {
            "kept_after_vacuum": _per_delivery(kept, deliveries),
            "kept_live_rows": _per_delivery(kept, deliveries, "live_rows"),
            "erased_after_vacuum_files": _per_delivery(erased_vacuumed, deliveries),
            "erased_after_vacuum_heap_free": _per_delivery(erased_vacuumed, deliveries, "heap_free"),
            "erased_live_rows": _per_delivery(erased_vacuumed, deliveries, "live_rows"),
            "files_grew_by_per_delivery_written_into_freed_space": grown,
            "erased_after_vacuum_full": _per_delivery(rewritten, 2 * deliveries),
        },
        "tables": phases,
    }


async def run_index_cost(deliveries: int, rounds: int) -> dict:
    """--index-cost: ingest with ix_messages_retained and without it, alternating rounds, one run."""
    server_url = services.database_url(config.load().database)
    seconds = {"with_index": 0.0, "without_index": 0.0}
    per_round = max(BATCH, deliveries // rounds)
    async with scratch_database(server_url, DATABASE_PREFIX) as with_url, \
            scratch_database(server_url, DATABASE_PREFIX) as without_url:
        pools = {"with_index": await create_pool(with_url, size_min=2, size_max=4),
                 "without_index": await create_pool(without_url, size_min=2, size_max=4)}
        try:
            await pools["without_index"].execute(f"DROP INDEX {RETAINED_INDEX}")
            account_ids = {name: (await _setup(pool, per_round * rounds)).id for name, pool in pools.items()}
            for round_number in range(rounds):
                order = list(pools) if round_number % 2 == 0 else list(reversed(pools))
                for name in order:
                    seconds[name] += await _ingest(pools[name], account_ids[name], per_round)
        finally:
            for pool in pools.values():
                await pool.close()
    rates = {name: round(per_round * rounds / value) for name, value in seconds.items()}
    return {"deliveries_each": per_round * rounds, "rounds": rounds, "payload_bytes": PAYLOAD_BYTES,
            "ingest_messages_per_second": rates,
            "with_index_rate_share_of_without": round(rates["with_index"] / rates["without_index"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=20_000)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--storage", action="store_true",
                      help="per-table bytes after plain VACUUM, after reuse of the freed space, after VACUUM FULL")
    mode.add_argument("--index-cost", action="store_true",
                      help="ingest's rate with and without ix_messages_retained, in two scratch databases")
    parser.add_argument("--rounds", type=int, default=6, help="--index-cost: alternating rounds")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    arguments = parser.parse_args()
    if arguments.storage:
        results = asyncio.run(run_storage(arguments.deliveries))
    elif arguments.index_cost:
        results = asyncio.run(run_index_cost(arguments.deliveries, arguments.rounds))
    else:
        results = asyncio.run(run_rates(arguments.deliveries))
    print(json.dumps(results, indent=2))
    if arguments.json:
        arguments.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
