#!/usr/bin/env python3
"""A claim alone against a claim wrapped in BEGIN and COMMIT, for claims of a few ids.

A claim is one statement (`delivery.claims`), which PostgreSQL runs as its own transaction; it
used to be wrapped in an explicit one, two round trips more. On a migrated scratch database with
one account and two endpoints, one connection on the uvloop loop, this claims fresh deliveries
`--ids` at a time (what the small wake-up jobs of steady traffic carry), alternating the two ways
round by round, and prints each way's client CPU and wall time per claim and their ratios.

Usage: DATABASE_URL=... scripts/bench_claim.py [--claims N] [--ids K] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import asyncpg

from billing import accounts
from billing.database import create_pool, transaction
from billing.messages import MessageRequest, create_messages
from delivery import claims, event_loop
from scratch_database import scratch_database, server_url_from_environment  # scripts/, beside this file

LEASE_MS = 60_000


async def _deliveries(pool: asyncpg.Pool, count: int) -> list[uuid.UUID]:
    account = await accounts.create_account(pool, "bench", price_per_delivery=1)
    await accounts.top_up(pool, account.id, f"o-{account.id}", 10**12)
    for _ in range(2):
        await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, 'https://example.com/hook')",
                           uuid.uuid4(), account.id)
    delivery_ids: list[uuid.UUID] = []
    while len(delivery_ids) < count:
        created = await create_messages(pool, [MessageRequest(account.id, "bench", b"{}") for _ in range(500)],
                                        attempts_max=3)
        delivery_ids += [delivery.id for message in created for delivery in message.deliveries]
    await pool.execute("ANALYZE")
    return delivery_ids


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


async def main(arguments: argparse.Namespace) -> None:
    async with scratch_database(server_url_from_environment()) as database_url:
        pool = await create_pool(database_url, size_min=1, size_max=1)
        per_round = arguments.claims * arguments.ids
        fresh = iter(await _deliveries(pool, 2 * arguments.rounds * per_round))

        async def wrapped(batch: list[uuid.UUID]) -> list:
            async with transaction(pool) as connection:
                return await connection.fetch(claims._CLAIM_IDS_FOR_SEND, batch, LEASE_MS)

        async def alone(batch: list[uuid.UUID]) -> list:
            return await claims.claim_ids_for_send(pool, batch, lease_ms=LEASE_MS)

        ways = {"in BEGIN ... COMMIT": wrapped, "alone (as claimed now)": alone}
        cpu_per_claim: dict[str, list[float]] = {label: [] for label in ways}
        wall_per_claim: dict[str, list[float]] = {label: [] for label in ways}
        print(f"claims of {arguments.ids} ids, {arguments.claims} a round, on one pooled connection"
              f" ({event_loop.name(asyncio.get_running_loop())})")
        for round_number in range(1, arguments.rounds + 1):
            order = list(ways.items()) if round_number % 2 else list(reversed(ways.items()))
            for label, claim in order:
                batches = [[next(fresh) for _ in range(arguments.ids)] for _ in range(arguments.claims)]
                cpu, wall = time.process_time(), time.perf_counter()
                for batch in batches:
                    if len(await claim(batch)) != len(batch):
                        raise SystemExit(f"{label}: a claim took fewer deliveries than it was given")
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                cpu_per_claim[label].append(cpu / arguments.claims)
                wall_per_claim[label].append(wall / arguments.claims)
                print(f"round {round_number}  {label:24s} client CPU {cpu / arguments.claims * 1e6:6.0f} µs"
                      f"  wall {wall / arguments.claims * 1e6:6.0f} µs")
        await pool.close()
        old, new = ways
        print(f"means: alone against in BEGIN ... COMMIT: client CPU"
              f" {_mean(cpu_per_claim[new]) / _mean(cpu_per_claim[old]):.2f}x,"
              f" wall time {_mean(wall_per_claim[new]) / _mean(wall_per_claim[old]):.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--ids", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    event_loop.run(main(parser.parse_args()), "auto")
