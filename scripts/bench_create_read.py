#!/usr/bin/env python3
"""The create's locking read with and without the event-type filter on endpoints, side by side.

1,000 accounts in temporary tables, each with one catch-all endpoint and three for another type;
1,500 batches of 36 random accounts per round, three rounds, each variant in its own transaction
as the create runs it. Both variants run the create's own statement
(`billing.message_plan.LOCK_ACCOUNTS_READ_ENDPOINTS`): unfiltered with NULL event types, as a batch
that names its endpoints runs it, filtered with the batch's one type. Prints wall and client CPU
per batch, rows per batch, and the filtered variant's CPU as a share of the unfiltered one's.

Usage: DATABASE_URL=... scripts/bench_create_read.py
"""

import asyncio
import os
import random
import time

import asyncpg

from billing.ids import new_ids
from billing.message_plan import LOCK_ACCOUNTS_READ_ENDPOINTS

BATCHES = 1500


async def main() -> None:
    connection = await asyncpg.connect(os.environ["DATABASE_URL"])
    await connection.execute(
        "CREATE TEMP TABLE accounts (id uuid primary key, status text, balance bigint, price_per_delivery bigint)")
    await connection.execute("CREATE TEMP TABLE endpoints (id uuid primary key, account_id uuid, enabled bool,"
                             " deleted_at timestamptz, event_types text[])")
    await connection.execute("CREATE INDEX ON endpoints (account_id)")
    accounts = new_ids(1000)
    await connection.executemany("INSERT INTO accounts VALUES ($1, 'active', 1000000, 1)", [(a,) for a in accounts])
    rows = []
    for account in accounts:
        rows.append((new_ids(1)[0], account, None))
        rows.extend((new_ids(1)[0], account, ["fanout4"]) for _ in range(3))
    await connection.executemany("INSERT INTO endpoints VALUES ($1, $2, true, NULL, $3)", rows)
    await connection.execute("ANALYZE accounts; ANALYZE endpoints")
    cpu_by_variant: dict[str, list[float]] = {"unfiltered": [], "filtered": []}
    for round_number in range(1, 4):
        for variant, event_types in (("unfiltered", None), ("filtered", ["fanout1"])):
            wall, cpu, returned = time.perf_counter(), time.process_time(), 0
            for _ in range(BATCHES):
                batch = sorted(random.sample(accounts, 36))
                async with connection.transaction():
                    returned += len(await connection.fetch(LOCK_ACCOUNTS_READ_ENDPOINTS, batch, event_types))
            wall, cpu = (time.perf_counter() - wall) / BATCHES, (time.process_time() - cpu) / BATCHES
            cpu_by_variant[variant].append(cpu)
            print(f"round {round_number}  {variant:10}  {wall * 1e6:5.0f} µs/batch wall, client CPU {cpu * 1e6:5.0f} µs,"
                  f" {returned / BATCHES:.0f} rows")
    mean = {variant: sum(values) / len(values) for variant, values in cpu_by_variant.items()}
    print(f"filtered client CPU = {mean['filtered'] / mean['unfiltered']:.2f} x unfiltered")


if __name__ == "__main__":
    asyncio.run(main())
