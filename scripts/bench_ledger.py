#!/usr/bin/env python3
"""Ledger benchmark: creates and settles through the real functions beside bare SQL (the floor).

For one hot account and for many accounts, it creates N messages (fan-out 1) with
`billing.messages.create_message` and settles a share of the deliveries with
`billing.settle.settle`, each with C concurrent tasks. In the same run it does the same row
work with bare SQL (no checks, no locks beyond what the statements take) and prints the rates
side by side as ratios. Usage: scripts/bench_ledger.py [--messages N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from pathlib import Path

from billing import accounts, ids, messages
from billing.database import create_pool
from billing.settle import DeadReason, settle
from delivery.platform import config, services
from scratch_database import scratch_database  # scripts/, beside this file

SETTLE_SHARE = 0.5


async def _make_accounts(pool, count: int) -> list[uuid.UUID]:
    made = []
    for number in range(count):
        account = await accounts.create_account(pool, f"bench {number}", price_per_delivery=1)
        await accounts.top_up(pool, account.id, f"bench-{account.id}", 10**12)
        await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, 'https://example.com/h')",
                           ids.new_id(), account.id)
        made.append(account.id)
    return made


async def _run(concurrency: int, items: list, work) -> float:
    """Run work(item) over items with `concurrency` tasks; return items per second."""
    queue = list(reversed(items))

    async def worker():
        while queue:
            await work(queue.pop())

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(items) / (time.perf_counter() - started)


async def real_create(pool, account_ids, count, concurrency):
    created = []

    async def work(index):
        account_id = account_ids[index % len(account_ids)]
        result = await messages.create_message(
            pool, messages.MessageRequest(account_id, "bench.event", b'{"n": 1}'), attempts_max=8)
        created.extend(d.id for d in result.deliveries)

    rate = await _run(concurrency, list(range(count)), work)
    return rate, created


async def bare_create(pool, account_ids, endpoint_of, count, concurrency):
    created = []

    async def work(index):
        account_id = account_ids[index % len(account_ids)]
        message_id, delivery_id = ids.new_id(), ids.new_id()
        async with pool.acquire() as connection, connection.transaction():
            await connection.execute("INSERT INTO messages (id, account_id, event_type, payload) VALUES ($1, $2, 'bench.event', $3)",
                                     message_id, account_id, b'{"n": 1}')
            await connection.execute("INSERT INTO deliveries (id, account_id, message_id, endpoint_id, price, attempts_max)"
                                     " VALUES ($1, $2, $3, $4, 1, 8)", delivery_id, account_id, message_id, endpoint_of[account_id])
            await connection.execute("INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount)"
                                     " VALUES ('charge:' || $1::uuid, $2, $1, 'charge', -1)", delivery_id, account_id)
            await connection.execute("UPDATE accounts SET balance = balance - 1 WHERE id = $1", account_id)
        created.append(delivery_id)

    rate = await _run(concurrency, list(range(count)), work)
    return rate, created


async def real_settle(pool, delivery_ids, concurrency):
    async def work(delivery_id):
        owner = await pool.fetchval("SELECT account_id FROM deliveries WHERE id = $1", delivery_id)
        await settle(pool, delivery_id, DeadReason.OUT_OF_RETRIES, account_id=owner)

    return await _run(concurrency, delivery_ids, work)


async def bare_settle(pool, delivery_ids, concurrency):
    async def work(delivery_id):
        async with pool.acquire() as connection, connection.transaction():
            row = await connection.fetchrow(
                "UPDATE deliveries SET state = 'dead', dead_reason = 'out_of_retries', finished_at = now()"
                " WHERE id = $1 RETURNING account_id, price", delivery_id)
            await connection.execute("INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount)"
                                     " VALUES ('refund:' || $1::uuid, $2, $1, 'refund', $3)", delivery_id, row[0], row[1])
            await connection.execute("UPDATE accounts SET balance = balance + $2 WHERE id = $1", row[0], row[1])

    return await _run(concurrency, delivery_ids, work)


async def scenario(pool, name, account_count, count, concurrency) -> list[tuple]:
    account_ids = await _make_accounts(pool, account_count)
    endpoint_of = {row[0]: row[1] for row in await pool.fetch(
        "SELECT account_id, id FROM endpoints WHERE account_id = ANY($1::uuid[])", account_ids)}
    # Alternate real and bare twice and keep the better of each, to even out warm-up and noise.
    best = {"create": [0.0, 0.0], "settle": [0.0, 0.0]}
    for _ in range(2):
        rate, created = await real_create(pool, account_ids, count, concurrency)
        best["create"][0] = max(best["create"][0], rate)
        share = created[: int(len(created) * SETTLE_SHARE)]
        best["settle"][0] = max(best["settle"][0], await real_settle(pool, share, concurrency))
        rate, created = await bare_create(pool, account_ids, endpoint_of, count, concurrency)
        best["create"][1] = max(best["create"][1], rate)
        share = created[: int(len(created) * SETTLE_SHARE)]
        best["settle"][1] = max(best["settle"][1], await bare_settle(pool, share, concurrency))
    return [(name, operation, real, bare) for operation, (real, bare) in best.items()]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--accounts", type=int, default=200)
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    arguments = parser.parse_args()
    settings = config.load()
    server = services.database_url(settings.database)
    async with scratch_database(server) as url:
        pool = await create_pool(url, size_min=arguments.concurrency, size_max=arguments.concurrency)
        rows = await scenario(pool, "one hot account", 1, arguments.messages, arguments.concurrency)
        rows += await scenario(pool, f"{arguments.accounts} accounts", arguments.accounts, arguments.messages,
                               arguments.concurrency)
        await pool.close()
    print(f"\nledger benchmark: {arguments.messages} messages (fan-out 1), {SETTLE_SHARE:.0%} settled,"
          f" concurrency {arguments.concurrency}")
    print(f"{'scenario':<18} {'operation':<10} {'real /s':>10} {'bare SQL /s':>12} {'ratio':>7}")
    for scenario_name, operation, real, bare in rows:
        print(f"{scenario_name:<18} {operation:<10} {real:>10.0f} {bare:>12.0f} {real / bare:>7.0%}")
    if arguments.json:
        arguments.json.write_text(json.dumps({
            "benchmark": "ledger", "messages": arguments.messages, "concurrency": arguments.concurrency,
            "accounts": arguments.accounts, "settle_share": SETTLE_SHARE,
            "rows": [{"scenario": scenario_name, "operation": operation, "real_per_second": real,
                      "bare_sql_per_second": bare, "ratio": real / bare} for scenario_name, operation, real, bare in rows],
        }, indent=2) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
