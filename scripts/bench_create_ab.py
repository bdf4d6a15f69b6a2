#!/usr/bin/env python3
"""The create's CPU per message for two or more checkouts, interleaved on one scratch database.

`bench_batch_size.py` measures the create of the code it runs; comparing a change with the code
before it needs both in one run, since the machine's speed drifts between runs. Here each
checkout (`git worktree add /tmp/before HEAD~1`, say) runs `billing.messages.create_messages` in
a process of its own (its directory first on sys.path), on batches of `--size` requests to random
accounts of 1,000 and to one hot account, one round after another in alternating order. It prints,
per checkout and case, the medians of our client CPU per message (the call alone: the requests
are made before the clock starts) and of PostgreSQL's.

Usage: DATABASE_URL=... scripts/bench_create_ab.py [--rounds 6] [--size 35] [--batches 190] DIR DIR...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = ("1,000 accounts", "one hot account")
WARM_BATCHES = 10  # per run, before the clock starts: plans, the connection's caches


async def _measure(database_url: str, hot: bool, size: int, batches: int) -> dict[str, float]:
    """One run in this process, with the billing package found first on sys.path."""
    import asyncpg

    from billing.messages import MessageCreated, MessageRequest, create_messages
    import cpu_shares  # scripts/, beside this file
    from bench_create_batch import PAYLOAD  # scripts/, beside this file

    connection = await asyncpg.connect(database_url)
    try:
        accounts = [row["id"] for row in await connection.fetch("SELECT id FROM accounts ORDER BY id")]
        work = [[MessageRequest(account, "bench", PAYLOAD)
                 for account in ([accounts[0]] * size if hot else random.sample(accounts, size))]
                for _ in range(WARM_BATCHES + batches)]
        for batch in work[:WARM_BATCHES]:
            await create_messages(connection, batch, attempts_max=8)
        before, cpu = cpu_shares.snapshot({}), time.process_time()
        results = [await create_messages(connection, batch, attempts_max=8) for batch in work[WARM_BATCHES:]]
        cpu = time.process_time() - cpu
        postgres = cpu_shares.per_thousand(before, cpu_shares.snapshot({}), batches * size)["postgres"]
    finally:
        await connection.close()
    refused = [result for batch in results for result in batch if not isinstance(result, MessageCreated)]
    if refused:
        raise SystemExit(f"the create refused {len(refused)} requests: {refused[0]!r}")
    return {"ours": cpu / (batches * size) * 1e6, "postgres": postgres}


def _child(arguments: argparse.Namespace) -> None:
    sys.path.insert(0, arguments.child)
    import billing

    if not str(Path(billing.__file__).resolve()).startswith(str(Path(arguments.child).resolve())):
        raise SystemExit(f"billing came from {billing.__file__}, not {arguments.child}")
    from delivery import event_loop

    figures = event_loop.run(_measure(arguments.database_url, arguments.hot, arguments.size, arguments.batches))
    print(json.dumps(figures))


async def _main(arguments: argparse.Namespace) -> None:
    import asyncpg

    from bench_create_batch import make_accounts  # scripts/, beside this file
    from scratch_database import scratch_database, server_url_from_environment  # scripts/, beside this file

    figures: dict[tuple[str, str], list[dict]] = {}
    async with scratch_database(server_url_from_environment()) as database_url:
        setup = await asyncpg.connect(database_url)
        try:
            await make_accounts(setup)
        finally:
            await setup.close()
        for number in range(arguments.rounds):
            order = arguments.directories if number % 2 == 0 else arguments.directories[::-1]
            for directory in order:
                for case in CASES:
                    command = [sys.executable, __file__, "--child", directory, "--database-url", database_url,
                               "--size", str(arguments.size), "--batches", str(arguments.batches)]
                    if case == CASES[1]:
                        command.append("--hot")
                    run = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True)
                    if run.returncode != 0:
                        raise SystemExit(f"{directory}, {case}: {run.stderr[-2000:]}")
                    figures.setdefault((directory, case), []).append(json.loads(run.stdout.splitlines()[-1]))
            print(f"round {number + 1} of {arguments.rounds} done", flush=True)
    print(f"medians over {arguments.rounds} rounds, batches of {arguments.size}, CPU per message:")
    for directory in arguments.directories:
        for case in CASES:
            runs = figures[directory, case]
            ours = [run["ours"] for run in runs]
            print(f"  {directory:24} {case:16} ours {statistics.median(ours):5.1f} µs"
                  f" ({min(ours):.1f} to {max(ours):.1f})"
                  f"  PostgreSQL {statistics.median(run['postgres'] for run in runs):5.1f} µs")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="*", metavar="DIR", help="checkouts to compare")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--size", type=int, default=35)
    parser.add_argument("--batches", type=int, default=190)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--database-url", help=argparse.SUPPRESS)
    parser.add_argument("--hot", action="store_true", help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if not 1 <= parsed.size <= 500 or parsed.batches < 1 or parsed.rounds < 1:
        parser.error("--size is 1 to 500, --batches and --rounds at least 1")
    if parsed.child:
        _child(parsed)
    elif not parsed.directories:
        parser.error("name at least one checkout directory")
    else:
        asyncio.run(_main(parsed))
