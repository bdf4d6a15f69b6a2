#!/usr/bin/env python3
"""What a group-commit batch's size does to the create's cost per message.

On a migrated scratch database with 1,000 accounts (one catch-all endpoint each), one connection
on the platform's event loop, it runs `billing.messages.create_messages` (the direct create, as the
API's group commit sends it) on batches of each size, to random accounts and to one hot account,
and prints per message PostgreSQL's CPU (its backend's, from /proc, where the server runs on this
machine) and ours, and the wall time per batch. Each statement has a fixed cost whatever its size;
this is what `delivery.api.group_commit`'s threshold for a second transaction weighs. (A batch of
one also pays for planning: PostgreSQL plans it anew on each call, where bigger batches run the
cached generic plan.) It stops with an error if any batch refused a request or went another way
than direct, which would make the figures another path's.

With `--without-index NAME` it measures what one index of the create's tables costs instead: each
round runs every case twice, with the index and with it dropped (the order alternating round by
round; dropped and made again by its own definition, on a fresh connection each time so that no
plan outlives it), and ends with each case's medians side by side and their ratio.

Usage: DATABASE_URL=... scripts/bench_batch_size.py [--sizes 1,5,15,35,70,140] [--messages 24000] [--rounds 2]
       [--without-index ix_deliveries_account_id_id]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import asyncpg

from billing import messages as messages_module
from billing.messages import MessageCreated, MessageRequest, create_messages
from delivery import event_loop
import cpu_shares  # scripts/, beside this file
from bench_create_batch import PAYLOAD, make_accounts  # scripts/, beside this file
from scratch_database import scratch_database, server_url_from_environment


async def main(arguments: argparse.Namespace) -> None:
    async with scratch_database(server_url_from_environment()) as database_url:
        setup = await asyncpg.connect(database_url)
        try:
            accounts, _ = await make_accounts(setup)
            definition = None
            if arguments.without_index:
                definition = await setup.fetchval("SELECT indexdef FROM pg_indexes WHERE indexname = $1",
                                                  arguments.without_index)
                if definition is None:
                    raise SystemExit(f"no index {arguments.without_index}")
            print(f"per message: PostgreSQL's CPU, ours, and the wall time per batch; {arguments.messages} messages a case")
            figures: dict[tuple, list[float]] = {}
            exists = True  # the migrations made it
            for round_number in range(1, arguments.rounds + 1):
                states = [None] if definition is None else [True, False] if round_number % 2 else [False, True]
                for present in states:
                    if present is not None and present != exists:
                        await setup.execute(definition if present else f"DROP INDEX {arguments.without_index}")
                        exists = present
                    connection = await asyncpg.connect(database_url)
                    try:
                        for hot in (False, True):
                            for size in arguments.sizes:
                                backend = await _case(connection, accounts, hot, size, arguments.messages,
                                                      round_number, present)
                                figures.setdefault((hot, size, present), []).append(backend)
                    finally:
                        await connection.close()
            if definition is not None:
                print(f"medians over {arguments.rounds} rounds, PostgreSQL's CPU per message,"
                      f" with {arguments.without_index} and without it:")
                for hot in (False, True):
                    for size in arguments.sizes:
                        with_index = statistics.median(figures[hot, size, True])
                        without = statistics.median(figures[hot, size, False])
                        print(f"  {_label(hot)}  batch {size:4}:  {with_index:6.1f} µs against {without:6.1f} µs"
                              f"  ({with_index / without:.2f}x)")
        finally:
            await setup.close()


def _label(hot: bool) -> str:
    return "one hot account" if hot else "1,000 accounts "


async def _case(connection: asyncpg.Connection, accounts: list, hot: bool, size: int, messages: int,
                round_number: int, present: bool | None) -> float:
    """One case's batches; prints its line and answers PostgreSQL's CPU per message (µs)."""
    calls = max(20, messages // size)
    batches = [[MessageRequest(account, "bench", PAYLOAD)
                for account in ([accounts[0]] * size if hot else random.sample(accounts, size))]
               for _ in range(calls)]
    roles = {"postgres": [connection.get_server_pid()]}
    direct_before, results = messages_module.WRITES["direct"], []
    before, cpu, wall = cpu_shares.snapshot(roles), time.process_time(), time.perf_counter()
    for batch in batches:
        results.append(await create_messages(connection, batch, attempts_max=8))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    _check(results, messages_module.WRITES["direct"] - direct_before)
    backend = cpu_shares.per_thousand(before, cpu_shares.snapshot(roles), calls * size)["postgres"]
    index = "" if present is None else ("  with the index   " if present else "  without the index")
    print(f"round {round_number}{index}  {_label(hot)}  batch {size:4}:  PostgreSQL {backend:6.1f} µs"
          f"  ours {cpu / calls / size * 1e6:5.1f} µs  wall {wall / calls * 1e3:6.2f} ms a batch", flush=True)
    return backend


def _check(results: list[list], direct: int) -> None:
    """Every batch wrote all its messages, the direct way."""
    refused = [result for batch in results for result in batch if not isinstance(result, MessageCreated)]
    if refused:
        raise SystemExit(f"the create refused {len(refused)} requests: {refused[0]!r}")
    if direct != len(results):
        raise SystemExit(f"{len(results) - direct} of {len(results)} batches did not go direct: {dict(messages_module.WRITES)}")


def sizes(text: str) -> list[int]:
    values = [int(n) for n in text.split(",")]
    if not values or min(values) < 1 or max(values) > 1000:
        raise argparse.ArgumentTypeError("sizes are 1 to 1000, comma-separated")
    return values


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=sizes, default=[1, 5, 15, 35, 70, 140])
    parser.add_argument("--messages", type=int, default=24_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--without-index", help="an index of the create's tables to measure with and without")
    event_loop.run(main(parser.parse_args()))
