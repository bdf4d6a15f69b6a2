#!/usr/bin/env python3
"""Ingest A/B: several API configurations on one database, their loads interleaved every few seconds.

`bench_ingest.py` measures one API and its ceiling in one run; comparing two configurations with
it means runs minutes apart, on a machine whose speed drifts by tens of percent within minutes.
Here every configuration is an `hookledger api` process of its own (its environment and, if
given, a checkout of other code), all on one database with the same 1,000 accounts and one hot
account, and each round loads each of them for `--seconds`, with a run of the trivial aiohttp
handler between every two, so that every run is set beside the mean of the ceilings measured
just before and just after it. Rounds alternate the
order of the configurations. It prints each round's rates, then per configuration and case the
median rate, the median share of its ceiling (with the range), and the median CPU
per 1,000 messages of the API, PostgreSQL and the load generator.

A configuration is NAME, NAME:ENV=VALUE,ENV=VALUE, or NAME:ENV=VALUE@DIR where DIR is a checkout
whose code that API runs (`git worktree add /tmp/before HEAD~1`, say); `NAME@DIR` without
settings works too.

Usage: DATABASE_URL=... REDIS_URL=... scripts/bench_ingest_ab.py [--rounds 5] [--seconds 5] [--fan-out 1]
       [--load-generator wrk|raw|aiohttp] [--concurrency 96]
       default 'threshold-1:HOOKLEDGER_GROUP_COMMIT_PARALLEL_WAITING_MIN=1' ...
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import bench_ingest  # scripts/, beside this file
import cpu_shares  # scripts/, beside this file
from scratch_database import add_redis_db_argument, scratch_database, scratch_redis  # scripts/, beside this file

ROOT = Path(__file__).resolve().parent.parent
CONCURRENCY = 96  # bench_ingest.py's first; --concurrency 1 measures a lone request's latency (1 / its rate)
CASES = ("1,000 accounts", "one hot account")


@dataclass
class Configuration:
    name: str
    environment: dict[str, str]
    directory: Path
    runs: dict[str, list[tuple[float, float, dict]]] = field(default_factory=lambda: {case: [] for case in CASES})


def configuration(text: str) -> Configuration:
    """NAME[:ENV=VALUE,...][@DIR]."""
    text, _, directory = text.partition("@")
    name, _, settings = text.partition(":")
    environment = {}
    for setting in filter(None, settings.split(",")):
        key, equals, value = setting.partition("=")
        if not equals or not key:
            raise argparse.ArgumentTypeError(f"{setting!r} is not ENV=VALUE")
        environment[key] = value
    path = Path(directory).resolve() if directory else ROOT
    if not (path / "delivery" / "__main__.py").exists():
        raise argparse.ArgumentTypeError(f"{path} is not a checkout of hookledger")
    if not name:
        raise argparse.ArgumentTypeError("a configuration needs a name")
    return Configuration(name, environment, path)


async def main(arguments: argparse.Namespace) -> None:
    server_url, redis_url = os.environ.get("DATABASE_URL"), os.environ.get("REDIS_URL")
    if not server_url or not redis_url:
        raise SystemExit("set DATABASE_URL (a server where this may create and drop a database) and REDIS_URL")
    configurations: list[Configuration] = arguments.configurations
    if len({c.name for c in configurations}) != len(configurations):
        raise SystemExit("configuration names must differ")
    async with scratch_database(server_url) as database_url, scratch_redis(redis_url, arguments.redis_db) as redis_url:
        await _run(arguments, configurations, database_url, redis_url)


async def _run(arguments: argparse.Namespace, configurations: list[Configuration], database_url: str,
               redis_url: str) -> None:
    processes: list[subprocess.Popen] = []
    try:
        environment = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url,
                       "HOOKLEDGER_OPERATOR_KEY": bench_ingest.OPERATOR_KEY, "HOOKLEDGER_SECRET_KEYS": bench_ingest.KEYRING,
                       "HOOKLEDGER_LOG_LEVEL": "warning"}
        trivial_port = bench_ingest.free_port()
        processes.append(subprocess.Popen([sys.executable, str(Path(__file__).parent / "bench_ingest.py"),
                                           "--serve-trivial", str(trivial_port)]))
        urls = []
        for each in configurations:
            port = bench_ingest.free_port()
            # PYTHONPATH first: the checkout's own packages, not the ones installed in .venv.
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "delivery", "api"], cwd=each.directory,
                env={**environment, **each.environment, "HOOKLEDGER_API_PORT": str(port), "PYTHONPATH": str(each.directory)}))
            urls.append(f"http://127.0.0.1:{port}")
        trivial_url = f"http://127.0.0.1:{trivial_port}"
        await bench_ingest.wait_ready(f"{trivial_url}/v1/messages", processes[0])
        for url, process in zip(urls, processes[1:]):
            await bench_ingest.wait_ready(f"{url}/readyz", process)
        keys, _ = await bench_ingest._setup_accounts(urls[0], 1001)
        keys_by_case = {CASES[0]: keys[:-1], CASES[1]: keys[-1:]}
        body = bench_ingest.BODIES[arguments.fan_out]
        await bench_ingest.admin_database(database_url, "ANALYZE")
        for url in urls:  # each API's key cache, and both servers' first requests
            await bench_ingest.load(url, keys_by_case[CASES[0]], body, 1.5, arguments.concurrency)
        await bench_ingest.load(trivial_url, keys[-1:], bench_ingest.BODIES[1], 1.5, arguments.concurrency)
        indexed = list(zip(configurations, urls, processes[1:]))

        async def trivial() -> float:
            rate, _ = await bench_ingest.load(trivial_url, keys[-1:], bench_ingest.BODIES[1], arguments.seconds,
                                              arguments.concurrency)
            return rate

        ceilings = [await trivial()]  # one before every API run, and one after the last
        for number in range(arguments.rounds):
            line = []
            for case in CASES:
                for each, url, process in indexed if number % 2 == 0 else indexed[::-1]:
                    before = cpu_shares.snapshot({"api": [process.pid]})
                    rate, statuses = await bench_ingest.load(url, keys_by_case[case], body, arguments.seconds,
                                                              arguments.concurrency)
                    shares = cpu_shares.per_thousand(before, cpu_shares.snapshot({"api": [process.pid]}),
                                                     statuses.get(202, 0))
                    if set(statuses) != {202}:
                        raise SystemExit(f"{each.name}, {case}: statuses {statuses}")
                    ceilings.append(await trivial())
                    ceiling = (ceilings[-2] + ceilings[-1]) / 2
                    each.runs[case].append((rate, ceiling, shares))
                    line.append(f"{each.name} {case}: {rate:.0f} ({rate / ceiling:.0%} of {ceiling:.0f})")
            print(f"round {number + 1}: " + "; ".join(line), flush=True)
        print(f"medians over {arguments.rounds} rounds of {arguments.seconds:g} s, fan-out {arguments.fan_out},"
              f" {arguments.concurrency} in flight, the load from {bench_ingest.load_generator()} (share: of the mean of the"
              f" trivial handler's runs just before and after):")
        for each in configurations:
            for case in CASES:
                runs = each.runs[case]
                ratios = [rate / ceiling for rate, ceiling, _ in runs]
                cpu = {role: statistics.median(shares.get(role, 0.0) for _, _, shares in runs)
                       for role in ("api", "postgres", "bench")}
                print(f"  {each.name:20} {case:16} {statistics.median(rate for rate, _, _ in runs):7.0f} msg/s"
                      f"  {statistics.median(ratios):5.1%} ({min(ratios):.0%} to {max(ratios):.0%})"
                      f"  CPU ms per 1,000: {cpu_shares.describe(cpu)}")
    finally:
        bench_ingest.stop_servers(processes)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configurations", nargs="+", type=configuration, metavar="NAME[:ENV=VALUE,...][@DIR]")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY, help="requests in flight (default: %(default)s)")
    parser.add_argument("--fan-out", type=int, choices=sorted(bench_ingest.BODIES), default=1)
    add_redis_db_argument(parser)
    bench_ingest.add_load_generator_argument(parser)
    parsed = parser.parse_args()
    bench_ingest.apply_load_generator_argument(parser, parsed)
    if parsed.rounds < 1 or parsed.seconds <= 0 or not 1 <= parsed.concurrency <= 1024:
        parser.error("--rounds must be at least 1, --seconds above 0 and --concurrency 1 to 1024")
    asyncio.run(main(parsed))
