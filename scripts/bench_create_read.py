#!/usr/bin/env python3
"""The create's locking read with and without the event-type filter on endpoints, side by side.

1,000 accounts in temporary tables, each with one catch-all endpoint and three for another type;
1,500 batches of 36 random accounts per round, three rounds, each variant in its own transaction
as the create runs it. Prints wall and client CPU per batch and rows per batch.

Usage: DATABASE_URL=... scripts/bench_create_read.py
"""

import asyncio
import os
import random
import time

import asyncpg

from billing.ids import new_ids

Q = ("SELECT a.id, a.status, a.balance, a.price_per_delivery, e.id AS endpoint_id, e.event_types, pg_current_xact_id() AS transaction_id"
     " FROM accounts a LEFT JOIN LATERAL (SELECT e.id, e.event_types FROM endpoints e WHERE e.account_id = a.id AND e.enabled AND e.deleted_at IS NULL"
     " {f} OFFSET 0) e ON true WHERE a.id = ANY($1::uuid[]) ORDER BY a.id, e.id FOR UPDATE OF a")
async def main():
    c = await asyncpg.connect(os.environ["DATABASE_URL"])
    await c.execute("CREATE TEMP TABLE accounts (id uuid primary key, status text, balance bigint, price_per_delivery bigint)")
    await c.execute("CREATE TEMP TABLE endpoints (id uuid primary key, account_id uuid, enabled bool, deleted_at timestamptz, event_types text[])")
    await c.execute("CREATE INDEX ON endpoints (account_id)")
    accts = new_ids(1000)
    await c.executemany("INSERT INTO accounts VALUES ($1,'active',1000000,1)", [(a,) for a in accts])
    rows = []
    for a in accts:
        rows.append((new_ids(1)[0], a, None))
        for _ in range(3): rows.append((new_ids(1)[0], a, ["fanout4"]))
    await c.executemany("INSERT INTO endpoints VALUES ($1,$2,true,NULL,$3)", rows)
    await c.execute("ANALYZE accounts; ANALYZE endpoints")
    plain = Q.format(f=""); filt = Q.format(f="AND ($2::text[] IS NULL OR e.event_types IS NULL OR e.event_types && $2::text[])")
    for rnd in range(3):
        for name, q, args in (("plain", plain, ()), ("filtered", filt, (["fanout1"],))):
            t = time.perf_counter(); n = 0; cpu0 = time.process_time()
            for i in range(1500):
                batch = sorted(random.sample(accts, 36))
                async with c.transaction():
                    r = await c.fetch(q, batch, *args)
                n += len(r)
            print(rnd, name, f"{(time.perf_counter()-t)/1500*1e6:.0f} us/batch wall, client cpu {(time.process_time()-cpu0)/1500*1e6:.0f} us", n/1500, "rows")
if __name__ == "__main__":
    asyncio.run(main())
