#!/usr/bin/env python3
"""What one more index on deliveries would cost ingest, per delivery inserted, beside the table as it is.

On a migrated scratch database it makes two empty copies of deliveries with every index it has
(`LIKE deliveries INCLUDING ALL`), adds the candidate index to one, and inserts the same rows
(1,000 accounts, one endpoint each) into each in alternate chunks of 500, each insert under
EXPLAIN (ANALYZE, TIMING OFF, WAL): PostgreSQL's execution time and WAL per row, medians. The
default candidate is (endpoint_id, id), which would let a generic plan page one endpoint's
deliveries; no round trips or client work are counted.

Usage: DATABASE_URL=... scripts/bench_insert_index.py [--deliveries 40000] [--index "endpoint_id, id"]
"""

from __future__ import annotations

import argparse
import statistics

import asyncpg

from bench_create_batch import make_accounts  # scripts/, beside this file
from bench_index_cost import _figures
from billing import ids
from delivery import event_loop
from scratch_database import scratch_database, server_url_from_environment

CHUNK = 500
WARM_UP_CHUNKS = 2  # per table
AS_IS, WITH_INDEX = "deliveries_as_is", "deliveries_with_index"
INSERT = (
    "INSERT INTO {table} (id, account_id, message_id, endpoint_id, price, attempts_max)"
    " SELECT d, a, d, e, 1, 8 FROM unnest($1::uuid[], $2::uuid[], $3::uuid[]) AS u(d, a, e)"
)


async def main(arguments: argparse.Namespace) -> None:
    async with scratch_database(server_url_from_environment()) as database_url:
        connection = await asyncpg.connect(database_url)
        try:
            await _run(connection, arguments.deliveries, arguments.index)
        finally:
            await connection.close()


async def _run(connection: asyncpg.Connection, count: int, index: str) -> None:
    accounts, endpoints = await make_accounts(connection)
    for table in (AS_IS, WITH_INDEX):
        await connection.execute(f"CREATE TABLE {table} (LIKE deliveries INCLUDING ALL)")
    await connection.execute(f"CREATE INDEX ON {WITH_INDEX} ({index})")
    indexes = await connection.fetchval("SELECT count(*) FROM pg_indexes WHERE tablename = $1", AS_IS)
    figures: dict[str, list[tuple[float, float, float]]] = {AS_IS: [], WITH_INDEX: []}
    for number in range(2 * count // CHUNK):
        table = (AS_IS, WITH_INDEX)[number % 2]
        chunk_accounts = [accounts[(number * CHUNK + n) % len(accounts)] for n in range(CHUNK)]
        plan = await connection.fetch("EXPLAIN (ANALYZE, TIMING OFF, WAL) " + INSERT.format(table=table),
                                      ids.new_ids(CHUNK), chunk_accounts, [endpoints[a] for a in chunk_accounts])
        figures[table].append(_figures(plan, CHUNK))
    print(f"{count} deliveries into each table in chunks of {CHUNK}; {AS_IS} has the {indexes} indexes of"
          f" deliveries, {WITH_INDEX} those and ({index}); PostgreSQL's execution per row, medians")
    medians = {}
    for table, runs in figures.items():
        micros, records, size = (statistics.median(run[i] for run in runs[WARM_UP_CHUNKS:]) for i in range(3))
        medians[table] = micros
        print(f"  insert {table:22} {micros:6.1f} µs  WAL {records:4.1f} records {size:5.0f} B")
    print(f"({index}) adds {medians[WITH_INDEX] - medians[AS_IS]:.1f} µs per delivery inserted,"
          f" {medians[WITH_INDEX] / medians[AS_IS]:.2f}x the insert as it is")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=40_000)
    parser.add_argument("--index", default="endpoint_id, id", help="the candidate index's columns")
    event_loop.run(main(parser.parse_args()), "auto")
