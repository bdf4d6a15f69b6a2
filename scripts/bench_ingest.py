#!/usr/bin/env python3
"""Ingest benchmark: POST /v1/messages over loopback at high concurrency, beside its ceiling and floor.

In one run, on one fresh database:
  - the ceiling: a trivial aiohttp handler that reads the JSON body and answers 202 with a small
    JSON body, in its own process, on the same event loop as the API (`--event-loop`, by default
    the platform's: uvloop where installed);
  - the API: `hookledger api` in its own process (group commit on), for 1,000 accounts and for
    one hot account, at fan-out 1 and fan-out 4;
  - the bare-SQL rate of the create transaction: one transaction per message through
    `billing.messages.create_message` on asyncpg directly (no HTTP, no coalescing).
With `--applications N`, one account sends to its applications (POST /v1/applications/{app}/messages,
fan-out 1): to one application, and round-robin over N applications of one endpoint each, in the
same run, beside the same trivial handler; and it times creating and listing applications with one
and with N applications in the account.
With `--schema`, one more account sends at fan-out 1 with a JSON Schema on its event type, so
every payload is checked (delivery/api/event_catalog.py), beside the hot account without one.
With `--tracing off,1%,100%` it measures the cost of tracing instead: one `hookledger api` per
mode (off; on, sampling that share of requests, exporting over OTLP/HTTP to a loopback collector
that discards, scripts/otlp_sink.py), loaded in turn, in the order given and then reversed (so a
drift of the shared machine's speed falls on every mode alike), at the first concurrency for
1,000 accounts; each mode's rate and the API's CPU per 1,000 messages as a ratio of off's.
With `--operational-compare`, the API's runs are made four times in the same run, without and
with the operational events' triggers (billing.operational_outbox) in the order without, with,
with, without (so that a drift of the machine's speed falls on both alike), every account having
a low_balance_threshold in the runs with them (evaluated on every charge, never crossed): each
case's rate with them as a ratio of its rate without them.
With `--without-writes`, each API run is followed by one of the same API with its group commit
answering every batch at once without writing (`serve_api_without_writes`): the HTTP side's
share alone, so that the gap between the API and the trivial handler splits into what the HTTP
path costs and what the database writes cost.
The load is C requests in flight for each C of `--concurrency` (96 and 256 by default), the
trivial handler beside the API at the same C, from wrk with C connections where wrk is installed
(wrk_load.py), otherwise from raw_load.py (a lean Python client in a process of its own), or with
`--load-generator aiohttp` from this process's aiohttp client, as the sessions before the
thirtieth measured. That client spends more CPU per request than either server (77 to 119 µs
against the trivial handler's 42 to 71), so on two cores it, not the server, is what saturates
beside the trivial handler, and beside the API it takes the cores the API and PostgreSQL need.

It prints messages/s and each rate as a share of the trivial handler's at the same C, the CPU
each process spent per 1,000 messages and the time each waited for a core (ready to run, not
running), the share that the CPU PostgreSQL and Redis spent leaves room for (aiohttp load only),
and, with more than one C, each case at its best C against the trivial handler at its best
(`peaks`: a closed loop measures a server's rate only where C keeps it busy).
With `--partitions 1,8` all of that runs once per count, in the order given, each on a fresh
database migrated with HOOKLEDGER_ACCOUNT_PARTITIONS set to the count (1: unset; the account-scoped
tables hash-partitioned by account_id), and each case's rate is then set beside the first count's,
as a ratio of it and as a ratio of its share of the trivial handler beside it (drift removed).

Usage: DATABASE_URL=... REDIS_URL=... scripts/bench_ingest.py [--seconds 5] [--concurrency 96,256] [--accounts 1000]
       [--event-loop auto|uvloop|asyncio] [--fan-outs 1,4] [--no-bare-sql] [--without-writes]
       [--load-generator wrk|raw|aiohttp] [--applications 10000 [--endpoints-per-application 2]] [--schema]
       [--tracing off,1%,100%]
       [--operational-compare] [--partitions 1,8]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import aiohttp
import asyncpg
from aiohttp import web

from billing import messages, operational_outbox
from billing.database import create_pool
from delivery import event_loop
from delivery.platform import config
import bench_applications  # scripts/, beside this file
import cpu_shares  # scripts/, beside this file
import otlp_sink  # scripts/, beside this file
import raw_load  # scripts/, beside this file
import wrk_load  # scripts/, beside this file
from scratch_database import (  # scripts/, beside this file
    add_partitions_argument, add_redis_db_argument, ratio, run_per_partition_count, scratch_database, scratch_redis)

OPERATOR_KEY = "op_bench_" + "b" * 32
BARE_SQL_CONNECTIONS = 16  # the server is shared; one transaction per message needs no more to saturate it
KEYRING = "k1:" + "B" * 43 + "="
BODIES = {fan_out: f'{{"event_type":"fanout{fan_out}","payload":{{"n":1,"text":"hello"}}}}'.encode() for fan_out in (1, 4)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The ceiling: the least an aiohttp handler can do for this request.


def serve_trivial(port: int, choice: str) -> None:
    async def handler(request: web.Request) -> web.Response:
        await request.json()
        return web.json_response({"id": "0", "accepted": True}, status=202)

    app = web.Application()
    app.router.add_post("/v1/messages", handler)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, loop=event_loop.new_event_loop(choice))


# The HTTP side alone: the API with nothing written.


def serve_api_without_writes() -> None:
    """`hookledger api` as it runs, except that the group commit answers each batch at once,
    without writing, with as many made-up deliveries per message as the benchmark's accounts
    subscribe to its event type: authentication, validation, the coalescer, the response and the
    wake-ups all run; the write statement and its round trip do not."""
    from billing.message_plan import CreatedDelivery
    from delivery.platform import api_server as cli_api
    from delivery.api import group_commit

    fan_outs = {f"fanout{fan_out}": fan_out for fan_out in BODIES}

    async def answer_unwritten(executor, requests, *, attempts_max):
        await asyncio.sleep(0)  # a turn of the loop, as an answer from the database would take
        results = []
        for request in requests:
            deliveries = tuple(CreatedDelivery(uuid.uuid4(), uuid.uuid4(), 1) for _ in range(fan_outs[request.event_type]))
            results.append(messages.MessageCreated(uuid.uuid4(), request.account_id, request.event_type, deliveries,
                                                   len(deliveries), replayed=False))
        return results

    group_commit.create_messages = answer_unwritten
    cli_api.api()


async def wait_ready(url: str, process: subprocess.Popen) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            if process.poll() is not None:
                raise SystemExit(f"server exited with {process.returncode}")
            try:
                async with session.get(url) as response:
                    if response.status in (200, 405):
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


def stop_servers(processes: list[subprocess.Popen]) -> None:
    """SIGTERM to all at once, then wait for each; one that does not stop in 30 s is killed."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


LOAD_GENERATORS = ("wrk", "raw", "aiohttp")
_load_generator = "aiohttp"
RAW_NOTE = ("wrk is not installed (Debian: apt-get install wrk), so the load comes from raw_load.py, a lean Python"
            " client of its own process")


def load_generator() -> str:
    """The load generator `load` uses (use_load_generator)."""
    return _load_generator


def use_load_generator(name: str) -> None:
    """Which load `load` sends from now on: this process's aiohttp client, or wrk (wrk_load.py)."""
    global _load_generator
    if name not in LOAD_GENERATORS:
        raise ValueError(f"the load generator is one of {', '.join(LOAD_GENERATORS)}, got {name!r}")
    if name == "wrk" and not wrk_load.available():
        raise wrk_load.WrkUnavailable(wrk_load.WrkUnavailable.__doc__)
    _load_generator = name


async def load(base_url: str, keys: list[str], body: bytes, seconds: float, concurrency: int,
               paths: list[str] | None = None) -> tuple[float, dict]:
    """POST body round-robin over the keys (to /v1/messages, or to the path beside each key) for
    `seconds`; messages accepted per second and status counts."""
    if _load_generator == "wrk":
        return await wrk_load.load(base_url, keys, body, seconds, concurrency, paths)
    if _load_generator == "raw":
        return await raw_load.load(base_url, keys, body, seconds, concurrency, paths)
    return await _load_aiohttp(base_url, keys, body, seconds, concurrency, paths)


async def _load_aiohttp(base_url: str, keys: list[str], body: bytes, seconds: float,
                        concurrency: int, paths: list[str] | None = None) -> tuple[float, dict]:
    statuses: dict[int, int] = {}
    key_cycle = itertools.cycle(list(zip(
        [{"Authorization": f"Bearer {key}", "Content-Type": "application/json"} for key in keys],
        paths or ["/v1/messages"] * len(keys), strict=True)))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < deadline:
                headers, path = next(key_cycle)
                async with session.post(f"{base_url}{path}", data=body, headers=headers) as response:
                    await response.read()
                    statuses[response.status] = statuses.get(response.status, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return statuses.get(202, 0) / elapsed, statuses


def add_load_generator_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--load-generator", choices=LOAD_GENERATORS, default=None,
                        help="the load: wrk (Debian's package wrk; the default where it is installed), raw_load.py"
                             " (a lean Python client; the default without wrk), or this process's aiohttp client")


def apply_load_generator_argument(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> None:
    """The load generator named, or by default wrk where installed (wrk_load.py says why) and
    raw_load.py, with a note on stderr, where not."""
    name = parsed.load_generator
    if name is None:
        name = "wrk" if wrk_load.available() else "raw"
        if name == "raw":
            print(RAW_NOTE, file=sys.stderr)
    try:
        use_load_generator(name)
    except wrk_load.WrkUnavailable as error:
        parser.error(str(error))


async def bare_sql(pool: asyncpg.Pool, account_ids: list, fan_out: int, seconds: float, concurrency: int) -> float:
    """One create transaction per message, straight on asyncpg (the floor the API starts from)."""
    payload = b'{"n":1,"text":"hello"}'
    cycle = itertools.cycle(account_ids)
    count = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            request = messages.MessageRequest(next(cycle), f"fanout{fan_out}", payload)
            await messages.create_message(pool, request, attempts_max=8)
            count += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return count / (time.perf_counter() - started)


async def _setup_accounts(base_url: str, count: int) -> tuple[list[str], list[uuid.UUID]]:
    """Accounts through the API: credits, one endpoint for every type and three more for fanout4."""
    operator = {"Authorization": f"Bearer {OPERATOR_KEY}"}
    keys, ids = [], []
    async with aiohttp.ClientSession() as session:
        async def one(number: int) -> None:
            async with session.post(f"{base_url}/v1/accounts", json={"name": f"bench {number}"}, headers=operator) as r:
                created = await r.json()
            account_id = created["account"]["id"]
            headers = {"Authorization": f"Bearer {created['api_key']['key']}"}
            async with session.post(f"{base_url}/v1/accounts/{account_id}/topups",
                                    json={"order_id": f"bench-{account_id}", "amount": 10**12}, headers=operator):
                pass
            for event_types in (None, ["fanout4"], ["fanout4"], ["fanout4"]):
                async with session.post(f"{base_url}/v1/endpoints", headers=headers,
                                        json={"url": "https://example.com/h", "event_types": event_types}) as r:
                    assert r.status == 201, await r.text()
            keys.append(created["api_key"]["key"])
            ids.append(uuid.UUID(account_id))

        for start in range(0, count, 50):
            await asyncio.gather(*(one(number) for number in range(start, min(count, start + 50))))
    return keys, ids


_GROUP_COMMIT_SERIES = ("hookledger_group_commit_batch_requests_sum", "hookledger_group_commit_batch_requests_count",
                        "hookledger_group_commit_seconds_sum")


async def group_commit_totals(api_url: str) -> tuple[float, float, float]:
    """(requests, transactions, seconds in transactions) of the API's group commit so far, from its /metrics."""
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{api_url}/metrics") as response:
            text = await response.text()
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in _GROUP_COMMIT_SERIES:
            values[name] = float(value)
    requests, transactions, seconds = (values.get(name, 0.0) for name in _GROUP_COMMIT_SERIES)
    return requests, transactions, seconds


async def admin_database(database_url: str, statement: str) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


async def database_backends(database_url: str) -> list[int]:
    """The pids of the client backends connected to this database now (the API's pool, warmed by
    the runs before): on a PostgreSQL server that other work shares, their CPU is this run's alone,
    where 'postgres' counts every PostgreSQL process of the machine."""
    connection = await asyncpg.connect(database_url)
    try:
        return [row["pid"] for row in await connection.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend'"
            " AND pid <> pg_backend_pid()")]
    finally:
        await connection.close()


async def _load_unwritten(unwritten: tuple[str, int], keys: list[str], fan_out: int, seconds: float,
                          concurrency: int) -> dict:
    """One run of the API without writes (its URL and pid): its rate, statuses and CPU shares."""
    url, pid = unwritten
    before = cpu_shares.snapshot({"api": [pid]})
    rate, statuses = await load(url, keys, BODIES[fan_out], seconds, concurrency)
    return {"messages_per_second": rate, "statuses": statuses,
            "cpu_shares": cpu_shares.per_thousand(before, cpu_shares.snapshot({"api": [pid]}), statuses.get(202, 0))}


# Time a process was ready to run and waited for a core: beside the API, three processes hand
# requests to each other on two cores, and each waits there even while a core is idle.
_WAITED = "waited for a core, ms per 1,000 messages"


def _snapshots(roles: dict[str, list[int]]) -> tuple[cpu_shares.Snapshot, cpu_shares.Snapshot]:
    """The roles' CPU and their waits for a core so far."""
    return cpu_shares.snapshot(roles), cpu_shares.snapshot(roles, waits=True)


def _per_thousand(before: tuple[cpu_shares.Snapshot, cpu_shares.Snapshot], roles: dict[str, list[int]],
                  operations: int) -> tuple[dict[str, float], dict[str, float]]:
    """CPU and waits for a core per 1,000 operations since `before` (from _snapshots)."""
    cpu, waits = _snapshots(roles)
    return (cpu_shares.per_thousand(before[0], cpu, operations),
            cpu_shares.per_thousand(before[1], waits, operations))


async def _measure_at(concurrency: int, arguments: argparse.Namespace, api_url: str, trivial_url: str, servers: list,
                      unwritten: tuple[str, int] | None, many_keys: list[str], hot_key: list[str],
                      report: dict, applications: dict | None = None,
                      database_url: str | None = None) -> list[float]:
    """The API's runs at one concurrency, each beside the trivial handler at that concurrency; the
    trivial handler's rates."""
    seconds = arguments.seconds
    # The machine is shared and its speed drifts, so the trivial handler is measured before and
    # after every API run, and each run is compared with the mean of the two beside it.
    before = _snapshots({"trivial": [servers[1].pid]})
    ceiling_rate, ceiling_statuses = await load(trivial_url, hot_key, BODIES[1], seconds, concurrency)
    trivial_shares, trivial_waits = _per_thousand(before, {"trivial": [servers[1].pid]}, ceiling_statuses.get(202, 0))
    ceilings = [ceiling_rate]
    print(f"concurrency {concurrency}")
    print(f"trivial aiohttp handler                {ceilings[0]:9.0f} msg/s")
    print(f"     CPU ms per 1,000 messages: {cpu_shares.describe(trivial_shares)} (bench: the load generator);"
          f" {cpu_shares.cores_busy(trivial_shares, ceiling_rate)}")
    print(f"     {_WAITED}: {cpu_shares.describe(trivial_waits)}")
    for fan_out in arguments.fan_outs:
        for label, these_keys in (("1,000 accounts" if arguments.accounts == 1000 else f"{arguments.accounts} accounts", many_keys),
                                  ("one hot account", hot_key)):
            roles = {"api": [servers[0].pid]}
            before, batches_before = _snapshots(roles), await group_commit_totals(api_url)
            rate, statuses = await load(api_url, these_keys, BODIES[fan_out], seconds, concurrency)
            shares, waits = _per_thousand(before, roles, statuses.get(202, 0))
            batches_after = await group_commit_totals(api_url)
            transactions = batches_after[1] - batches_before[1]
            batch_mean = (batches_after[0] - batches_before[0]) / transactions if transactions else float("nan")
            transaction_ms = (batches_after[2] - batches_before[2]) / transactions * 1000 if transactions else float("nan")
            unwritten_run = None if unwritten is None else await _load_unwritten(
                unwritten, these_keys, fan_out, seconds, concurrency)
            ceilings.append((await load(trivial_url, hot_key, BODIES[1], seconds, concurrency))[0])
            beside = (ceilings[-2] + ceilings[-1]) / 2
            print(f"API  fan-out {fan_out}  {label:16}      {rate:9.0f} msg/s  {rate / beside:5.0%}"
                  f"  (trivial beside it {beside:.0f}/s)  {statuses}")
            print(f"     CPU ms per 1,000 messages: {cpu_shares.describe(shares)} (bench: the load generator);"
                  f" {cpu_shares.cores_busy(shares, rate)};"
                  f" {batch_mean:.1f} requests per group-commit transaction, {transaction_ms:.1f} ms each"
                  f" ({(batches_after[2] - batches_before[2]) / seconds:.0%} of the run in one)")
            print(f"     {_WAITED}: {cpu_shares.describe(waits)}")
            # The bound assumes the two cores limit the ceiling; beside wrk or raw_load the trivial
            # handler's own core does (it runs at 1.00 of one), and the figure would mean nothing.
            bound = cpu_shares.database_bound(trivial_shares, shares) if _load_generator == "aiohttp" else None
            if bound:
                print(f"     what the database alone allows: {bound} of the trivial handler, if the API and the"
                      f" load generator cost no more than beside the trivial handler")
            if unwritten_run is not None:
                unwritten_rate = unwritten_run["messages_per_second"]
                print(f"     the same API without writes  {unwritten_rate:9.0f} msg/s  {unwritten_rate / beside:5.0%}"
                      f"  {unwritten_run['statuses']}; CPU ms per 1,000 messages:"
                      f" {cpu_shares.describe(unwritten_run['cpu_shares'])}")
                report["api_without_writes"].append({
                    **unwritten_run, "concurrency": concurrency, "fan_out": fan_out, "accounts": label,
                    "share_of_trivial": unwritten_rate / beside,
                    "statuses": {str(k): v for k, v in unwritten_run["statuses"].items()}})
            report["api"].append({"concurrency": concurrency, "fan_out": fan_out, "accounts": label,
                                  "messages_per_second": rate, "trivial_beside": beside, "share_of_trivial": rate / beside,
                                  "cpu_shares": shares, "cpu_waits": waits, "requests_per_transaction": batch_mean,
                                  "transaction_ms": transaction_ms,
                                  "statuses": {str(k): v for k, v in dict(statuses).items()}})
    if applications:
        for label, (keys, paths) in applications.items():
            # CPU per message beside the rate: on a shared machine the rate drifts with the other
            # load, while what PostgreSQL and the API spend on each message drifts much less.
            roles = {"api": [servers[0].pid]}
            if database_url is not None:
                roles["database_backends"] = await database_backends(database_url)
            before = _snapshots(roles)
            rate, statuses = await load(api_url, keys, BODIES[1], seconds, concurrency, paths)
            shares, waits = _per_thousand(before, roles, statuses.get(202, 0))
            ceilings.append((await load(trivial_url, hot_key, BODIES[1], seconds, concurrency))[0])
            beside = (ceilings[-2] + ceilings[-1]) / 2
            print(f"API  fan-out 1  {label:22}{rate:9.0f} msg/s  {rate / beside:5.0%}  (trivial beside it {beside:.0f}/s)"
                  f"  {statuses}")
            print(f"     CPU ms per 1,000 messages: {cpu_shares.describe(shares)} (bench: the load generator;"
                  f" database_backends: this database's client backends, of the postgres processes)")
            report["applications"].append({"concurrency": concurrency, "case": label, "messages_per_second": rate,
                                           "trivial_beside": beside, "share_of_trivial": rate / beside,
                                           "cpu_shares": shares, "cpu_waits": waits,
                                           "statuses": {str(k): v for k, v in dict(statuses).items()}})
    print(f"trivial aiohttp handler at concurrency {concurrency}, each run: {', '.join(f'{c:.0f}' for c in ceilings)} msg/s"
          f" (mean {sum(ceilings) / len(ceilings):.0f})")
    report["trivial"].append({"concurrency": concurrency, "each": ceilings, "cpu_shares": trivial_shares,
                              "cpu_waits": trivial_waits})
    return ceilings


OPERATIONAL_PHASES = ("without", "with", "with", "without")


async def _operational_phase(database_url: str, phase: str) -> None:
    """Drop the operational triggers (without) or create them and give every account a threshold (with)."""
    connection = await asyncpg.connect(database_url)
    try:
        async with connection.transaction():
            installed = await connection.fetchval(
                "SELECT count(*) FROM pg_trigger WHERE tgname = 'operational_balance_low'")
            if phase == "without" and installed:
                for statement in operational_outbox.DROP_TRIGGERS:
                    await connection.execute(statement)
            if phase == "with" and not installed:
                for statement in operational_outbox.TRIGGERS:
                    await connection.execute(statement)
            await connection.execute("UPDATE accounts SET low_balance_threshold = $1, low_balance_armed = true",
                                     1 if phase == "with" else None)
    finally:
        await connection.close()


async def _operational_compare(arguments, database_url, api_url, trivial_url, servers, many_keys, hot_key,
                               account_ids, report) -> None:
    """Every API case (and bare-SQL case, unless --no-bare-sql) without and with the operational
    triggers; each case's rate with them over without."""
    rates: dict[tuple, dict[str, list[float]]] = {}
    bare: dict[tuple, dict[str, list[float]]] = {}
    pool = await create_pool(database_url, size_min=BARE_SQL_CONNECTIONS, size_max=BARE_SQL_CONNECTIONS)
    try:
        for phase in OPERATIONAL_PHASES:
            await _operational_phase(database_url, phase)
            print(f"-- operational triggers: {phase}")
            await _compare_phase(arguments, phase, api_url, trivial_url, servers, many_keys, hot_key, report, rates)
            for fan_out in arguments.fan_outs if arguments.bare_sql else ():
                for label, ids in (("many accounts", account_ids[0]), ("one hot account", account_ids[1])):
                    rate = await bare_sql(pool, ids, fan_out, arguments.seconds, arguments.concurrency[0])
                    print(f"bare SQL (1 tx/msg) fan-out {fan_out}  {label:16} {rate:7.0f} msg/s")
                    bare.setdefault((fan_out, label), {"with": [], "without": []})[phase].append(rate)
    finally:
        await pool.close()
    _print_compare(arguments, rates, bare, report)


async def _compare_phase(arguments, phase, api_url, trivial_url, servers, many_keys, hot_key, report, rates) -> None:
    """The API's runs of one phase, each case's share of the trivial handler and PostgreSQL's CPU kept by phase."""
    for concurrency in arguments.concurrency:
        rows_before = len(report["api"])
        await _measure_at(concurrency, arguments, api_url, trivial_url, servers, None, many_keys, hot_key, report)
        for row in report["api"][rows_before:]:
            row["operational"] = phase
            case = (row["concurrency"], row["fan_out"], row["accounts"])
            rates.setdefault(case, {"with": [], "without": [], "cpu with": [], "cpu without": []})
            rates[case][phase].append(row["share_of_trivial"])
            rates[case][f"cpu {phase}"].append(row["cpu_shares"].get("postgres", 0.0))


def _print_compare(arguments, rates, bare, report) -> None:
    report["operational_compare"] = []
    print("with the operational triggers, as a ratio of without (each as a share of the trivial handler beside it,"
          " the mean of its two runs):")
    for (concurrency, fan_out, accounts), by_phase in rates.items():
        with_, without, cpu_with, cpu_without = (sum(by_phase[p]) / len(by_phase[p])
                                                 for p in ("with", "without", "cpu with", "cpu without"))
        ratio = with_ / without if without else float("nan")
        cpu_ratio = cpu_with / cpu_without if cpu_without else float("nan")
        print(f"  C {concurrency:4}  fan-out {fan_out}  {accounts:16}  without {without:5.1%}  with {with_:5.1%}"
              f"  rate ratio {ratio:.3f};  PostgreSQL CPU ms per 1,000 messages {cpu_without:.0f} -> {cpu_with:.0f}"
              f" (ratio {cpu_ratio:.3f})")
        report["operational_compare"].append({"concurrency": concurrency, "fan_out": fan_out, "accounts": accounts,
                                              "share_without": without, "share_with": with_, "ratio": ratio,
                                              "postgres_cpu_without": cpu_without, "postgres_cpu_with": cpu_with,
                                              "postgres_cpu_ratio": cpu_ratio})
    for (fan_out, label), by_phase in bare.items():
        with_, without = (sum(by_phase[p]) / len(by_phase[p]) for p in ("with", "without"))
        print(f"  bare SQL  fan-out {fan_out}  {label:16}  without {without:7.0f} msg/s  with {with_:7.0f} msg/s"
              f"  ratio {with_ / without:.3f}")
        report["operational_compare"].append({"bare_sql": True, "fan_out": fan_out, "accounts": label,
                                              "rate_without": without, "rate_with": with_,
                                              "ratio": with_ / without})
    if arguments.json:
        arguments.json.write_text(json.dumps(report, indent=2, default=str))


def concurrencies(text: str) -> list[int]:
    """--concurrency: one or more whole numbers of 1 to 1024, comma-separated."""
    try:
        values = [int(n) for n in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(1 <= value <= 1024 for value in values):
        raise argparse.ArgumentTypeError(f"a comma-separated list of whole numbers 1 to 1024, got {text!r}")
    return values


def peaks(report: dict) -> list[dict]:
    """Each (fan-out, accounts) case at the concurrency where the API made the most, set against the
    trivial handler at the concurrency where it made the most (the mean of its runs there).

    A closed loop of C requests in flight measures a server's rate only while C keeps it busy:
    rate = C / latency. The trivial handler answers each request at once and runs at capacity from
    a few dozen in flight; the API holds each request for a group-commit transaction, so at the same
    C it can sit partly idle, and what the run then measures is its latency. Each at its best
    compares the two at capacity; the trivial handler's best is usually at the lower concurrency,
    so this is stricter than comparing both at the higher one.
    """
    trivial = max(report["trivial"], key=lambda row: sum(row["each"]) / len(row["each"]))
    trivial_rate = sum(trivial["each"]) / len(trivial["each"])
    best: dict[tuple, dict] = {}
    for row in report["api"]:
        case = (row["fan_out"], row["accounts"])
        if case not in best or row["messages_per_second"] > best[case]["messages_per_second"]:
            best[case] = row
    return [{"fan_out": row["fan_out"], "accounts": row["accounts"], "concurrency": row["concurrency"],
             "messages_per_second": row["messages_per_second"], "trivial_concurrency": trivial["concurrency"],
             "trivial_per_second": trivial_rate, "share_of_trivial": row["messages_per_second"] / trivial_rate}
            for row in best.values()]


async def main(arguments: argparse.Namespace) -> None:
    server_url, redis_url = os.environ.get("DATABASE_URL"), os.environ.get("REDIS_URL")
    if not server_url or not redis_url:
        raise SystemExit("set DATABASE_URL (a server where this may create and drop a database) and REDIS_URL")
    if arguments.partitions:
        await _run_partitions(arguments, server_url, redis_url)
        return
    # No worker runs here, so the API's wake-up jobs stay queued: they go to a Redis database of
    # the run's own, emptied afterwards, not into the queue of the database REDIS_URL names.
    async with scratch_database(server_url) as database_url, scratch_redis(redis_url, arguments.redis_db) as redis_url:
        if arguments.tracing:
            await _run_tracing(arguments, database_url, redis_url)
        else:
            await _run(arguments, database_url, redis_url)


async def _run_partitions(arguments: argparse.Namespace, server_url: str, redis_url: str) -> None:
    """The same runs once per partition count, each on a fresh database migrated with that many
    account partitions, in the order given; then each case beside the first count's."""
    quiet = argparse.Namespace(**{**vars(arguments), "json": None})
    reports = await run_per_partition_count(arguments.partitions, server_url, redis_url, arguments.redis_db,
                                            lambda database_url, run_redis_url: _run(quiet, database_url, run_redis_url))
    comparison = compare_partitions(reports)
    print_partitions(arguments.partitions, comparison)
    if arguments.json:
        arguments.json.write_text(json.dumps({"benchmark": "ingest_partitions", "partitions": arguments.partitions,
                                              "comparison": comparison, "runs": reports}, indent=2) + "\n")


def compare_partitions(reports: dict[int, dict]) -> list[dict]:
    """Each case (the API's at each concurrency, fan-out and accounts; the bare SQL's) at every
    partition count, with its rate and its share of the trivial handler beside it as ratios of the
    first count's. The share's ratio is the fairer one: each run had its own trivial handler beside
    it, so a drift of the shared machine's speed between the counts' runs falls out of it."""
    first, *_ = reports
    rows: dict[tuple, dict] = {}
    for count, report in reports.items():
        cases = [(("api", row["concurrency"], row["fan_out"], row["accounts"]), row) for row in report["api"]]
        cases += [(("bare_sql", None, row["fan_out"], row["accounts"]), row) for row in report["bare_sql"]]
        for case, row in cases:
            entry = rows.setdefault(case, {"kind": case[0], "concurrency": case[1], "fan_out": case[2],
                                           "accounts": case[3], "by_partitions": {}})
            entry["by_partitions"][count] = {"messages_per_second": row["messages_per_second"],
                                             "share_of_trivial": row["share_of_trivial"]}
    for entry in rows.values():
        base = entry["by_partitions"].get(first, {})
        for value in entry["by_partitions"].values():
            value["rate_ratio"] = ratio(value["messages_per_second"], base.get("messages_per_second"))
            value["share_ratio"] = ratio(value["share_of_trivial"], base.get("share_of_trivial"))
    return list(rows.values())


def print_partitions(counts: list[int], comparison: list[dict]) -> None:
    print(f"by account partitions ({', '.join(map(str, counts))}): msg/s, and as ratios of {counts[0]} partition(s)'s:"
          " the rate's, and the share of the trivial handler beside each run's (drift of the machine removed)")
    for entry in comparison:
        kind = f"API C {entry['concurrency']:4}" if entry["kind"] == "api" else "bare SQL  "
        cells = "  ".join(f"{count}: {value['messages_per_second']:7.0f}/s x{value['rate_ratio']:.3f}"
                          f" (share x{value['share_ratio']:.3f})"
                          for count, value in entry["by_partitions"].items())
        print(f"  {kind}  fan-out {entry['fan_out']}  {entry['accounts']:16}  {cells}")


async def _run_tracing(arguments: argparse.Namespace, database_url: str, redis_url: str) -> None:
    """The cost of tracing: one API per mode, loaded in turn (modes, then the same reversed)."""
    modes = arguments.tracing
    sink = subprocess.Popen([sys.executable, str(Path(__file__).with_name("otlp_sink.py"))], stdout=subprocess.PIPE)
    sink_port = int(sink.stdout.readline())
    base = {**otlp_sink.without_tracing(dict(os.environ)), "DATABASE_URL": database_url, "REDIS_URL": redis_url,
            "HOOKLEDGER_OPERATOR_KEY": OPERATOR_KEY, "HOOKLEDGER_SECRET_KEYS": KEYRING,
            "HOOKLEDGER_LOG_LEVEL": "warning", "HOOKLEDGER_EVENT_LOOP": arguments.event_loop,
            "HOOKLEDGER_GROUP_COMMIT_CONCURRENCY": str(arguments.group_commit_concurrency)}
    ports = {mode: free_port() for mode in modes}
    servers = {mode: subprocess.Popen([sys.executable, "-m", "delivery", "api"], env={
        **base, **otlp_sink.environment(mode, sink_port), "HOOKLEDGER_API_PORT": str(ports[mode])}) for mode in modes}
    urls = {mode: f"http://127.0.0.1:{port}" for mode, port in ports.items()}
    try:
        for mode in modes:
            await wait_ready(f"{urls[mode]}/readyz", servers[mode])
        keys, _ = await _setup_accounts(urls[modes[0]], arguments.accounts)
        concurrency, seconds = arguments.concurrency[0], arguments.seconds
        for mode in modes:
            await load(urls[mode], keys, BODIES[1], 1, concurrency)  # warm up
        await admin_database(database_url, "ANALYZE")
        print(f"the cost of tracing: {', '.join(modes)} (one API each, exporting to a discarding collector on"
              f" loopback), {concurrency} in flight, {arguments.accounts} accounts; the load from {_load_generator}")
        report: dict = {"benchmark": "ingest_tracing", "modes": modes, "concurrency": concurrency, "seconds": seconds,
                        "accounts": arguments.accounts, "load_generator": _load_generator, "runs": []}
        for fan_out in arguments.fan_outs:
            runs: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
            for mode in [*modes, *reversed(modes)]:
                roles = {"api": [servers[mode].pid], "collector": [sink.pid]}
                before = _snapshots(roles)
                rate, statuses = await load(urls[mode], keys, BODIES[fan_out], seconds, concurrency)
                shares, _ = _per_thousand(before, roles, statuses.get(202, 0))
                runs[mode].append((rate, shares.get("api", float("nan"))))
                report["runs"].append({"fan_out": fan_out, "mode": mode, "messages_per_second": rate,
                                       "cpu_shares": shares, "statuses": {str(k): v for k, v in statuses.items()}})
                print(f"  fan-out {fan_out}  tracing {mode:5}  {rate:9.0f} msg/s   CPU ms per 1,000 messages:"
                      f" {cpu_shares.describe(shares)}")
            _print_tracing_ratios(fan_out, modes, runs, report)
        if arguments.json:
            arguments.json.write_text(json.dumps(report, indent=2) + "\n")
    finally:
        stop_servers(list(servers.values()))  # before the collector: they export what they hold as they stop
        stop_servers([sink])


def _print_tracing_ratios(fan_out: int, modes: list[str], runs: dict, report: dict) -> None:
    """Each mode's mean rate and the API's mean CPU per message, as ratios of the first mode's."""
    means = {mode: (sum(rate for rate, _ in values) / len(values), sum(cpu for _, cpu in values) / len(values))
             for mode, values in runs.items()}
    base_rate, base_cpu = means[modes[0]]
    for mode in modes:
        rate, cpu = means[mode]
        print(f"fan-out {fan_out}  tracing {mode:5}  {rate:9.0f} msg/s  rate x{rate / base_rate:.3f} of {modes[0]}'s;"
              f" API CPU {cpu:.0f} ms per 1,000 messages, x{cpu / base_cpu:.3f}")
        report.setdefault("ratios", []).append({"fan_out": fan_out, "mode": mode, "messages_per_second": rate,
                                                "rate_ratio": rate / base_rate, "api_cpu_ms_per_1000": cpu,
                                                "cpu_ratio": cpu / base_cpu})


async def _run(arguments: argparse.Namespace, database_url: str, redis_url: str) -> dict:
    """The API's, the trivial handler's and the bare SQL's runs on that database; the report."""
    api_port, trivial_port, unwritten_port = free_port(), free_port(), free_port()
    environment = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url,
                   "HOOKLEDGER_OPERATOR_KEY": OPERATOR_KEY, "HOOKLEDGER_SECRET_KEYS": KEYRING,
                   "HOOKLEDGER_API_PORT": str(api_port), "HOOKLEDGER_LOG_LEVEL": "warning",
                   "HOOKLEDGER_GROUP_COMMIT_CONCURRENCY": str(arguments.group_commit_concurrency),
                   "HOOKLEDGER_EVENT_LOOP": arguments.event_loop}
    servers = [
        subprocess.Popen([sys.executable, "-m", "delivery", "api"], env=environment),
        subprocess.Popen([sys.executable, __file__, "--serve-trivial", str(trivial_port), "--event-loop", arguments.event_loop]),
    ]
    api_url, trivial_url = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{trivial_port}"
    unwritten = None  # the API without writes: its URL and pid
    if arguments.without_writes:
        servers.append(subprocess.Popen([sys.executable, __file__, "--serve-api-without-writes"],
                                        env={**environment, "HOOKLEDGER_API_PORT": str(unwritten_port)}))
        unwritten = (f"http://127.0.0.1:{unwritten_port}", servers[2].pid)
    try:
        await wait_ready(f"{api_url}/readyz", servers[0])
        await wait_ready(f"{trivial_url}/v1/messages", servers[1])
        if unwritten is not None:
            await wait_ready(f"{unwritten[0]}/readyz", servers[2])
        keys, account_ids = await _setup_accounts(api_url, arguments.accounts + 1)
        many_keys, hot_key = keys[:-1], keys[-1:]
        many_ids, hot_id = account_ids[:-1], account_ids[-1:]
        seconds, concurrencies = arguments.seconds, arguments.concurrency
        await load(trivial_url, hot_key, BODIES[1], 1, concurrencies[0])  # warm up both servers
        await load(api_url, many_keys, BODIES[1], 1, concurrencies[0])
        if unwritten is not None:
            await load(unwritten[0], many_keys, BODIES[1], 1, concurrencies[0])
        # Planner statistics as autovacuum keeps them in a running system (it analyzes a table once a
        # tenth of it changed, within a minute); a database made seconds ago has none, and PostgreSQL
        # then plans the create's account and endpoint read as scans of whole tables.
        await admin_database(database_url, "ANALYZE")
        loop_name = event_loop.chosen(arguments.event_loop)
        print(f"the API and the trivial handler run on the {loop_name} event loop (--event-loop {arguments.event_loop});"
              f" the load comes from {_load_generator} (--load-generator)")
        applications = {}
        if arguments.applications:
            applications.update(await bench_applications.setup(api_url, database_url, OPERATOR_KEY,
                                                               arguments.applications,
                                                               arguments.endpoints_per_application))
        if arguments.schema:
            applications.update(await bench_applications.schema_case(api_url, OPERATOR_KEY))
        if applications:
            await admin_database(database_url, "ANALYZE")
        report = {"benchmark": "ingest", "event_loop": loop_name, "load_generator": _load_generator,
                  "applications": [],
                  "seconds": seconds, "concurrency": concurrencies,
                  "accounts": arguments.accounts, "group_commit_concurrency": arguments.group_commit_concurrency,
                  "api": [], "api_without_writes": [], "bare_sql": [], "trivial": []}
        if arguments.operational_compare:
            await _operational_compare(arguments, database_url, api_url, trivial_url, servers, many_keys, hot_key,
                                       (many_ids, hot_id), report)
            return report
        ceilings_by_concurrency = [
            await _measure_at(concurrency, arguments, api_url, trivial_url, servers, unwritten, many_keys, hot_key, report,
                              applications, database_url)
            for concurrency in concurrencies]
        if arguments.applications:
            report["application_routes"] = await bench_applications.routes(api_url, OPERATOR_KEY, arguments.applications)
        report["peaks"] = peaks(report)
        if len(concurrencies) > 1:
            print("each at its best of the concurrencies measured: the API's rate against the trivial handler's best"
                  " mean (the rates of servers that both run at capacity, where one concurrency may not be both's)")
            for peak in report["peaks"]:
                print(f"  fan-out {peak['fan_out']}  {peak['accounts']:16}  {peak['messages_per_second']:9.0f} msg/s at"
                      f" {peak['concurrency']} in flight  against {peak['trivial_per_second']:.0f}/s at"
                      f" {peak['trivial_concurrency']}:  {peak['share_of_trivial']:5.0%}")
        # The bare-SQL runs use the first concurrency, so they are set beside its trivial handler.
        ceiling = sum(ceilings_by_concurrency[0]) / len(ceilings_by_concurrency[0])
        report["trivial_handler_per_second"] = ceiling
        pool = await create_pool(database_url, size_min=BARE_SQL_CONNECTIONS, size_max=BARE_SQL_CONNECTIONS)
        try:
            for fan_out in arguments.fan_outs if arguments.bare_sql else ():
                for label, ids in (("many accounts", many_ids), ("one hot account", hot_id)):
                    rate = await bare_sql(pool, ids, fan_out, seconds, concurrencies[0])
                    print(f"bare SQL (1 tx/msg) fan-out {fan_out}  {label:16} {rate:7.0f} msg/s  {rate / ceiling:5.0%}")
                    report["bare_sql"].append({"fan_out": fan_out, "accounts": label, "messages_per_second": rate,
                                               "share_of_trivial": rate / ceiling})
        finally:
            await pool.close()
        if arguments.json:
            arguments.json.write_text(json.dumps(report, indent=2) + "\n")
        return report
    finally:
        stop_servers(servers)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=concurrencies, default=[96, 256],
                        help="concurrent requests, or a comma-separated list to measure each (default: 96,256); the"
                             " bare-SQL runs use the first")
    parser.add_argument("--accounts", type=int, default=1000)
    parser.add_argument("--group-commit-concurrency", type=int, default=2)
    parser.add_argument("--fan-outs", type=lambda text: [int(n) for n in text.split(",")], default=[1, 4],
                        help="the fan-outs to measure, of 1 and 4 (default: both)")
    parser.add_argument("--applications", type=int, default=0, metavar="N",
                        help="also send to one application and round-robin over N applications"
                             " of one account, and time creating and listing applications with 1 and with N")
    parser.add_argument("--endpoints-per-application", type=int, default=1, metavar="E",
                        help="with --applications, each application (the one and the N) has E endpoints (fan-out E)")
    parser.add_argument("--schema", action="store_true",
                        help="also send as one hot account whose event type has a JSON Schema every payload is checked"
                             " against (beside the same account's sends without one)")
    parser.add_argument("--no-bare-sql", dest="bare_sql", action="store_false", help="skip the bare-SQL runs")
    parser.add_argument("--operational-compare", action="store_true",
                        help="the API's runs without the operational events' triggers and with them, as ratios")
    parser.add_argument("--without-writes", action="store_true",
                        help="after each API run, run the same API with its group commit answering without writing")
    parser.add_argument("--serve-trivial", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--serve-api-without-writes", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--event-loop", choices=event_loop.CHOICES, default=config.load().event_loop,
                        help="the loop of the API and of the trivial handler (one loop for both, so the ceiling is fair)")
    add_redis_db_argument(parser)
    add_load_generator_argument(parser)
    parser.add_argument("--tracing", type=otlp_sink.modes, default=None, metavar="MODES",
                        help="measure the cost of tracing instead, for each of these modes (say off,1%%,100%%)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    add_partitions_argument(parser)
    parsed = parser.parse_args()
    apply_load_generator_argument(parser, parsed)
    if parsed.partitions and (parsed.tracing or parsed.operational_compare):
        parser.error("--partitions compares the plain runs; it goes with neither --tracing nor --operational-compare")
    if not parsed.fan_outs or set(parsed.fan_outs) - set(BODIES):
        parser.error(f"--fan-outs takes a comma-separated list of {', '.join(map(str, BODIES))}")
    if parsed.serve_trivial:
        serve_trivial(parsed.serve_trivial, parsed.event_loop)
    elif parsed.serve_api_without_writes:
        serve_api_without_writes()
    else:
        asyncio.run(main(parsed))
