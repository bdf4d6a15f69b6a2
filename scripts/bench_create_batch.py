#!/usr/bin/env python3
"""Where one group-commit create's client CPU goes: round trips, statements, our planning.

On a migrated scratch database with 1,000 accounts (one catch-all endpoint each), one connection
on the uvloop loop, it times side by side, per call, the client's CPU and the wall time of:
  - `SELECT 1`: one round trip, the unit everything else is counted in;
  - `BEGIN; SELECT 1; COMMIT`: a transaction's own round trips;
  - bare locked: the locked create's four round trips (BEGIN, the locking read, the write,
    COMMIT) with their arguments made before the clock starts, for a batch of 35 messages at
    fan-out 1 to 35 random accounts (what bench_ingest's API batches hold);
  - bare unlocked: the unlocked create's two (the read, the gated autocommit write), the same way;
  - planned `create_messages`: the same batch through billing.messages the planned way (each
    request names its endpoint, as a replay does, which the direct create does not take): it
    runs unlocked and plans in Python (validation, decisions, ids, results) between the read and
    the write;
  - direct `create_messages`: the same batch as the API sends it, which goes direct: one
    statement in which PostgreSQL fans out and checks (billing.message_direct).
Planned less bare unlocked is our planning; bare unlocked less two round trips is what the
statements' arguments and rows cost to encode and decode; direct against planned is what the
direct create saves. Last, 14 uuid arrays of 35 elements against 14 of one, in one SELECT: what
one array element costs asyncpg to send. Each case also prints PostgreSQL's CPU per call (its
backend's, from /proc, where the server runs on this machine).

Usage: DATABASE_URL=... scripts/bench_create_batch.py [--batches N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
import uuid

import asyncpg

from billing import ids, messages
from billing.message_plan import GATED_WRITE, LOCK_ACCOUNTS_READ_ENDPOINTS, READ_ACCOUNTS_ENDPOINTS, WRITE_BATCH
from billing.messages import MessageCreated, MessageRequest, create_messages
from delivery import event_loop
import cpu_shares  # scripts/, beside this file
from scratch_database import scratch_database, server_url_from_environment

BATCH = 35
PAYLOAD = b'{"n":1,"text":"hello"}'


async def make_accounts(connection: asyncpg.Connection) -> tuple[list[uuid.UUID], dict[uuid.UUID, uuid.UUID]]:
    """1,000 accounts with a large balance, one catch-all endpoint each, then ANALYZE: (account
    ids, endpoint id by account id). bench_index_cost.py makes its deliveries on them too."""
    accounts = ids.new_ids(1000)
    endpoints = dict(zip(accounts, ids.new_ids(1000), strict=True))
    await connection.executemany(
        "INSERT INTO accounts (id, name, balance) VALUES ($1, 'bench', 1000000000)", [(a,) for a in accounts])
    await connection.executemany(
        "INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, 'https://example.com/hook')",
        [(e, a) for a, e in endpoints.items()])
    await connection.execute("ANALYZE")
    return accounts, endpoints


def _bare_arguments(batch: list[uuid.UUID], endpoints: dict[uuid.UUID, uuid.UUID]) -> tuple:
    """The write's arguments for the batch, as the create passes them (balances left as they were)."""
    message_ids, delivery_ids = ids.new_ids(len(batch)), ids.new_ids(len(batch))
    return (message_ids, batch, ["bench"] * len(batch), [PAYLOAD] * len(batch), [None] * len(batch),
            [None] * len(batch), delivery_ids, batch, message_ids, [endpoints[a] for a in batch],
            [1] * len(batch), [8] * len(batch), batch, [1_000_000_000] * len(batch))


async def main(arguments: argparse.Namespace) -> None:
    async with scratch_database(server_url_from_environment()) as database_url:
        connection = await asyncpg.connect(database_url)
        accounts, endpoints = await make_accounts(connection)

        def batch() -> list[uuid.UUID]:
            return sorted(random.sample(accounts, BATCH))

        async def select_one() -> None:
            await connection.fetchval("SELECT 1")

        # The write passes 7 uuid arrays; asyncpg checks every array element against
        # collections.abc classes before encoding it. 14 arrays of 35 against 14 of 1 prices that.
        probe = "SELECT " + " + ".join(f"cardinality(${n}::uuid[])" for n in range(1, 15))
        many_ids, one_id = ids.new_ids(BATCH), ids.new_ids(1)

        async def uuid_arrays_of_35() -> None:
            await connection.fetchval(probe, *[many_ids] * 14)

        async def uuid_arrays_of_1() -> None:
            await connection.fetchval(probe, *[one_id] * 14)

        async def empty_transaction() -> None:
            async with connection.transaction():
                await connection.fetchval("SELECT 1")

        bare_batches: list = []

        async def bare() -> None:
            accounts_of_batch, write_arguments = bare_batches.pop()
            async with connection.transaction():
                await connection.fetch(LOCK_ACCOUNTS_READ_ENDPOINTS, accounts_of_batch, ["bench"])
                await connection.execute(WRITE_BATCH, *write_arguments)

        async def bare_unlocked() -> None:
            accounts_of_batch, write_arguments = bare_batches.pop()
            await connection.fetch(READ_ACCOUNTS_ENDPOINTS, accounts_of_batch, ["bench"])
            # The same rows; the accounts each charged 1 at price 1, in place of the balances.
            gated = (*write_arguments[:12], accounts_of_batch, [1] * len(accounts_of_batch), [1] * len(accounts_of_batch))
            if not await connection.fetchval(GATED_WRITE, *gated):
                raise SystemExit("the gated write wrote nothing")

        request_batches: list = []

        async def created(expected_way: str) -> None:
            writes = messages.WRITES[expected_way]
            results = await create_messages(connection, request_batches.pop(), attempts_max=8)
            refused = [r for r in results if not isinstance(r, MessageCreated)]
            if refused:
                raise SystemExit(f"the create refused {len(refused)} of {len(results)}: {refused[0]!r}")
            if messages.WRITES[expected_way] != writes + 1:
                raise SystemExit(f"the batch was not written {expected_way}: {dict(messages.WRITES)}")

        async def planned() -> None:
            await created("unlocked")

        async def direct() -> None:
            await created("direct")

        cases = [("SELECT 1", select_one), ("BEGIN; SELECT 1; COMMIT", empty_transaction),
                 (f"bare locked, {BATCH} messages", bare), (f"bare unlocked, {BATCH} messages", bare_unlocked),
                 (f"planned create_messages, {BATCH}", planned), (f"direct create_messages, {BATCH}", direct),
                 (f"14 uuid[] of {BATCH} in one SELECT", uuid_arrays_of_35), ("14 uuid[] of 1 in one SELECT", uuid_arrays_of_1)]
        print(f"client CPU and wall time per call, {arguments.batches} calls a round, on one connection"
              f" ({event_loop.name(asyncio.get_running_loop())})")
        cpu_per_call: dict[str, list[float]] = {label: [] for label, _ in cases}
        wall_per_call: dict[str, list[float]] = {label: [] for label, _ in cases}
        for round_number in range(1, arguments.rounds + 1):
            for label, call in cases:
                # Arguments are made before the clock starts: the bare case is the statements alone.
                bare_batches[:] = [(b, _bare_arguments(b, endpoints)) for b in (batch() for _ in range(arguments.batches))]
                targeted = call is planned
                request_batches[:] = [
                    [MessageRequest(a, "bench", PAYLOAD, endpoint_ids=(endpoints[a],) if targeted else None)
                     for a in batch()] for _ in range(arguments.batches)]
                before = cpu_shares.snapshot({"backend": [connection.get_server_pid()]})
                cpu, wall = time.process_time(), time.perf_counter()
                for _ in range(arguments.batches):
                    await call()
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                backend = cpu_shares.per_thousand(before, cpu_shares.snapshot({"backend": [connection.get_server_pid()]}),
                                                  arguments.batches)["backend"]
                cpu_per_call[label].append(cpu / arguments.batches)
                wall_per_call[label].append(wall / arguments.batches)
                print(f"round {round_number}  {label:32s} client CPU {cpu / arguments.batches * 1e6:6.0f} µs"
                      f"  wall {wall / arguments.batches * 1e6:6.0f} µs  PostgreSQL CPU {backend:6.0f} µs")
        await connection.close()
        mean = {label: sum(values) / len(values) for label, values in cpu_per_call.items()}
        wall = {label: sum(values) / len(values) for label, values in wall_per_call.items()}
        trip, locked_cpu, bare_cpu, planned_cpu, direct_cpu = (mean[label] for label, _ in (cases[0], *cases[2:6]))
        print(f"means: bare unlocked against bare locked: client CPU {bare_cpu / locked_cpu:.2f}x,"
              f" wall time {wall[cases[3][0]] / wall[cases[2][0]]:.2f}x")
        print(f"means: planned create_messages {planned_cpu * 1e6:.0f} µs = {planned_cpu / bare_cpu:.2f} x the bare"
              f" unlocked create ({bare_cpu * 1e6:.0f} µs); of it, two round trips (2 x {trip * 1e6:.0f} µs) are"
              f" {2 * trip / planned_cpu:.0%}, encoding and decoding the statements' values"
              f" {(bare_cpu - 2 * trip) / planned_cpu:.0%}, our planning {(planned_cpu - bare_cpu) / planned_cpu:.0%}")
        print(f"means: direct create_messages {direct_cpu * 1e6:.0f} µs of client CPU = {direct_cpu / planned_cpu:.2f} x"
              f" the planned one; wall time {wall[cases[5][0]] / wall[cases[4][0]]:.2f} x")
        per_element = (mean[cases[6][0]] - mean[cases[7][0]]) / (14 * (BATCH - 1))
        print(f"one uuid array element costs {per_element * 1e6:.2f} µs of client CPU to send")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    event_loop.run(main(parser.parse_args()), "auto")
