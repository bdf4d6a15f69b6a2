#!/usr/bin/env python3
"""What the deliveries table's secondary indexes cost PostgreSQL per delivery, claimed and recorded.

A delivery's two state changes are the engine's per-delivery database work: the claim
(`pending -> sending`, with the pre-send load joined) and the record (`sending -> delivered`).
Each changes `state`, which the partial indexes' predicates and `(endpoint_id, state)` read, so
neither update can be HOT: every live index takes a new entry each time.

On a migrated scratch database it creates N deliveries (1,000 accounts, one endpoint each, through
`create_messages`), copies the table to `deliveries_floor`, which keeps only the primary key, and
then runs the worker's own statements, unchanged but for the table's name, on alternate chunks of
500 deliveries of each table: the claim by ids (`delivery.claims`), then, in one transaction as
`record_results` runs them, the lock in id order and the mark-delivered update. Each under
EXPLAIN (ANALYZE, TIMING OFF, WAL): PostgreSQL's execution time and the WAL it wrote, per row,
medians, the full table beside the floor. No round trips or client work are counted.

Usage: DATABASE_URL=... scripts/bench_index_cost.py [--deliveries 20000]
"""

from __future__ import annotations

import argparse
import random
import re
import statistics

import asyncpg

from bench_create_batch import make_accounts  # scripts/, beside this file
from billing.messages import MessageRequest, create_messages
from delivery import claims, event_loop
from delivery.results import _LOCK_IN_ORDER, _MARK_DELIVERED
from scratch_database import scratch_database, server_url_from_environment  # scripts/, beside this file

CHUNK = 500
FLOOR = "deliveries_floor"
WARM_UP_CHUNKS = 1  # per table: the first chunk of each warms caches and the plan cache


def on_table(statement: str, table: str) -> str:
    """The statement with every reference to the deliveries table pointed at `table`."""
    changed = re.sub(r"\b(FROM|UPDATE) deliveries\b", rf"\1 {table}", statement)
    if table != "deliveries" and re.search(r"\bdeliveries\b", changed):
        raise SystemExit(f"a reference to deliveries was left in: {changed}")
    return changed


def _figures(plan: list[asyncpg.Record], rows: int) -> tuple[float, float, float]:
    """(execution µs, WAL records, WAL bytes), each per row, from EXPLAIN output."""
    lines = [row[0] for row in plan]
    milliseconds = next(float(line.split()[-2]) for line in lines if line.startswith("Execution Time"))
    wal = next((line for line in lines if line.strip().startswith("WAL:")), "")
    records = int(re.search(r"records=(\d+)", wal).group(1)) if "records=" in wal else 0
    size = int(re.search(r"bytes=(\d+)", wal).group(1)) if "bytes=" in wal else 0
    return milliseconds * 1000 / rows, records / rows, size / rows


async def main(arguments: argparse.Namespace) -> None:
    async with scratch_database(server_url_from_environment()) as database_url:
        connection = await asyncpg.connect(database_url)
        try:
            await _run(connection, arguments.deliveries)
        finally:
            await connection.close()


async def _run(connection: asyncpg.Connection, count: int) -> None:
    accounts, _ = await make_accounts(connection)
    delivery_ids = []
    while len(delivery_ids) < count:
        requests = [MessageRequest(random.choice(accounts), "bench", b'{"n":1}') for _ in range(CHUNK)]
        results = await create_messages(connection, requests, attempts_max=8)
        delivery_ids += [delivery.id for result in results for delivery in result.deliveries]
    await connection.execute(f"CREATE TABLE {FLOOR} (LIKE deliveries INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
    await connection.execute(f"INSERT INTO {FLOOR} SELECT * FROM deliveries")
    await connection.execute(f"ALTER TABLE {FLOOR} ADD PRIMARY KEY (id)")
    await connection.execute("VACUUM ANALYZE")
    indexes = await connection.fetchval("SELECT count(*) FROM pg_indexes WHERE tablename = 'deliveries'")
    figures: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for number, start in enumerate(range(0, len(delivery_ids) - CHUNK + 1, CHUNK)):
        chunk = sorted(delivery_ids[start:start + CHUNK])
        table = "deliveries" if number % 2 == 0 else FLOOR
        claim = await connection.fetch("EXPLAIN (ANALYZE, TIMING OFF, WAL) " + on_table(claims._CLAIM_IDS_FOR_SEND, table),
                                       chunk, claims.LEASE_MS_MAX)
        async with connection.transaction():
            locked = await connection.fetch(on_table(_LOCK_IN_ORDER, table), chunk)
            mark = await connection.fetch("EXPLAIN (ANALYZE, TIMING OFF, WAL) " + on_table(_MARK_DELIVERED, table),
                                          chunk, [1] * len(chunk))
        if len(locked) != len(chunk):
            raise SystemExit(f"{table}: {len(locked)} of {len(chunk)} rows found to record")
        figures.setdefault(("claim", table), []).append(_figures(claim, len(chunk)))
        figures.setdefault(("mark delivered", table), []).append(_figures(mark, len(chunk)))
    print(f"{len(delivery_ids)} deliveries in chunks of {CHUNK}; deliveries has {indexes} indexes, {FLOOR} only its"
          f" primary key; PostgreSQL's execution per row, medians (EXPLAIN ANALYZE, timing off)")
    totals = {"deliveries": 0.0, FLOOR: 0.0}
    for step in ("claim", "mark delivered"):
        for table in ("deliveries", FLOOR):
            runs = figures[(step, table)][WARM_UP_CHUNKS:]
            micros, records, size = (statistics.median(run[index] for run in runs) for index in range(3))
            totals[table] += micros
            print(f"  {step:15} {table:17} {micros:6.1f} µs  WAL {records:4.1f} records {size:5.0f} B   ({len(runs)} chunks)")
    full, floor = totals["deliveries"], totals[FLOOR]
    print(f"claim + mark delivered: {full:.1f} µs per delivery against {floor:.1f} with the primary key alone,"
          f" {full / floor:.2f}x; the secondary indexes are {(full - floor) / full:.0%} of it")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=20_000)
    event_loop.run(main(parser.parse_args()), "auto")
