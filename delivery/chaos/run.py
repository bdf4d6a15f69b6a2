"""The chaos run's command line (`scripts/chaos.py`): sizes, orchestration, the summary.

    start servers -> receivers -> API processes and workers -> accounts and endpoints
    -> workload, fault schedule and erasure together over the window -> faults stop, drain -> checks

Exit 0 only if every check holds. `--seed` makes the workload and the fault schedule
repeatable (the interleaving of real processes is not, which is the point of running it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

from billing.database import create_pool
from delivery.chaos import checks as chaos_checks, erasure
from delivery.chaos.cluster import (
    Cluster,
    platform_environment,
    start_servers,
    work_directory,
)
from delivery.chaos.faults import Injector, schedule
from delivery.chaos.receivers import ReceiverFarm
from delivery.chaos.workload import Sizes, Workload

SIZES = {
    "short": Sizes(accounts=30, endpoints_min=3, endpoints_max=5, deliveries=2_000, window_seconds=30.0,
                   concurrency=12, fault_cycles=2),
    "long": Sizes(accounts=300, endpoints_min=3, endpoints_max=5, deliveries=100_000, window_seconds=480.0,
                  concurrency=48, fault_cycles=8),
}
SLOW_SECONDS = 1.5  # the slow receiver's delay: past HOOKLEDGER_SEND_TIMEOUT_MS
GONE_AFTER_SHARE = 0.4  # of the window, after which the `gone` receiver answers 410
DRAIN_SECONDS_MIN = 150.0  # covers the sweep resuming a lost deletion job (after 60 s)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--short", action="store_const", const="short", dest="size", help="~2,000 deliveries, about a minute")
    size.add_argument("--long", action="store_const", const="long", dest="size", help="100,000 deliveries (manual)")
    parser.add_argument("--deliveries", type=int, help="override the size's number of deliveries")
    parser.add_argument("--accounts", type=int, help="override the size's number of accounts")
    parser.add_argument("--window", type=float, help="seconds of workload and faults (override)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--apis", type=int, default=2, help="API processes (at least 2)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (at least 2)")
    parser.add_argument("--summary", type=Path, help="write the JSON summary here")
    parser.add_argument("--allow-pg-restart", action="store_true",
                        help="with DATABASE_URL set, restart that server (only with --pg-data-dir of an embedded one)")
    parser.add_argument("--pg-data-dir", type=Path, help="data directory of DATABASE_URL's embedded server")
    parser.add_argument("--redis-db", type=int, default=13, help="with REDIS_URL set: the run's own database number")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) even when the run passed")
    options = parser.parse_args(argv)
    options.size = options.size or "short"
    if options.apis < 2 or options.workers < 2:
        parser.error("--apis and --workers must be at least 2")
    return options


def sizes_of(options: argparse.Namespace) -> Sizes:
    base = SIZES[options.size]
    changes = {"deliveries": options.deliveries, "accounts": options.accounts, "window_seconds": options.window}
    values = {**base.__dict__, **{name: value for name, value in changes.items() if value is not None}}
    if options.window is not None or options.deliveries is not None:
        values["fault_cycles"] = max(1, int(values["window_seconds"] // 60))
    return Sizes(**values)


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    return asyncio.run(run(options))


async def run(options: argparse.Namespace) -> int:
    sizes = sizes_of(options)
    seeds = random.Random(options.seed)
    rngs = {name: random.Random(seeds.randrange(2**32)) for name in ("receivers", "workload", "faults")}
    work_dir = work_directory()
    log_dir = work_dir / "logs"
    log_dir.mkdir()
    began = time.monotonic()
    print(f"chaos run ({options.size}, seed {options.seed}): {sizes}; logs in {log_dir}", flush=True)
    servers = await start_servers(work_dir, allow_pg_restart=options.allow_pg_restart,
                                  pg_data_dir=options.pg_data_dir, redis_db=options.redis_db)
    for note in servers.notes:
        print(f"note: {note}", flush=True)
    receivers = ReceiverFarm(rngs["receivers"], SLOW_SECONDS, sizes.window_seconds * GONE_AFTER_SHARE)
    cluster = Cluster(platform_environment(servers, {}), log_dir)
    workload = pool = None
    passed = False
    try:
        await receivers.start()
        for _ in range(options.apis):
            cluster.start_api()
        for _ in range(options.workers):
            cluster.start_worker()
        for api in cluster.apis:
            await cluster.wait_ready(api)
        workload = Workload(cluster.api_urls, cluster.operator_key, receivers, sizes, rngs["workload"])
        await workload.setup()
        setup_seconds = time.monotonic() - began
        print(f"setup done in {setup_seconds:.1f} s: {len(workload.accounts)} accounts,"
              f" {workload.tally['endpoints']} endpoints", flush=True)
        faults = schedule(rngs["faults"], sizes.window_seconds, sizes.fault_cycles)
        injector = Injector(cluster, servers, receivers, rngs["faults"], sizes.window_seconds)
        receivers.restart_clock()
        window_began = time.monotonic()
        eraser, window_over = erasure.Eraser(servers.database_url), asyncio.Event()

        async def window() -> None:
            try:
                await asyncio.gather(workload.drive(), injector.run(faults, window_began))
            finally:
                window_over.set()

        await asyncio.gather(window(), eraser.run(window_over))
        window_seconds = time.monotonic() - window_began
        print(f"workload and faults done in {window_seconds:.1f} s; draining", flush=True)
        pool = await create_pool(servers.database_url, size_min=1, size_max=4)
        drain_seconds = await chaos_checks.drain(pool, workload, max(DRAIN_SECONDS_MIN, sizes.window_seconds))
        results, facts = await chaos_checks.run_checks(pool, workload, receivers, cluster.exited_unexpectedly())
        erasure_results, facts["erasure"] = await erasure.erasure_checks(pool, workload, receivers, eraser)
        results.extend(erasure_results)
        passed = all(check.passed for check in results)
        if workload.tally["deletion_rerequests"]:
            servers.notes.append(
                f"{workload.tally['deletion_rerequests']} account deletion(s) had to be requested again: a deletion"
                " job lost with Redis (FLUSHALL) or with a killed worker was not resumed by the platform's sweep"
                " within 120 s")
        summary = _summary(options, sizes, workload, injector, receivers, results, facts, servers.notes,
                           {"setup": setup_seconds, "window": window_seconds, "drain": drain_seconds,
                            "total": time.monotonic() - began})
        summary["api_logs"] = api_log_counts(log_dir)
        # What the run's schema was: plain tables, or each distributed table hash-partitioned by
        # account (HOOKLEDGER_ACCOUNT_PARTITIONS at migrate time), read from the catalog.
        summary["account_partitions"] = await pool.fetchval(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'deliveries'::regclass") or 1
        # And how many shards the API and the workers split their claims, sweeps and group commits
        # into (HOOKLEDGER_ACCOUNT_SHARDS, from the environment every process of the run shares).
        summary["account_shards"] = int({**os.environ, **cluster.environment}.get("HOOKLEDGER_ACCOUNT_SHARDS", "1"))
        print_summary(summary)
        if options.summary:
            options.summary.parent.mkdir(parents=True, exist_ok=True)
            options.summary.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    finally:
        if workload is not None:
            await workload.close()
        if pool is not None:
            await pool.close()
        await asyncio.to_thread(cluster.stop)
        await receivers.stop()
        if passed:
            await servers.drop()
        else:
            print(f"FAILED: logs kept in {log_dir}"
                  + (f"; database {servers.database_name} kept" if servers.database_name else ""), flush=True)
    if passed and not options.keep:
        shutil.rmtree(log_dir, ignore_errors=True)
    print("chaos run " + ("passed" if passed else "FAILED"), flush=True)
    return 0 if passed else 1


def _summary(options, sizes, workload, injector, receivers, results, facts, notes, durations) -> dict:
    ids_duplicated, extra_copies = receivers.duplicates()
    received = sum(r.received for r in receivers.receipts.values())
    return {
        "seed": options.seed,
        "size": options.size,
        "passed": all(check.passed for check in results),
        "processes": {"apis": options.apis, "workers": options.workers},
        "load": {
            "accounts": len(workload.accounts), "endpoints": workload.tally["endpoints"],
            "sends": workload.tally["sends"], "messages": workload.tally["messages"],
            "deliveries_accepted": len(workload.accepted_deliveries),
            "idempotent_resends": workload.tally["idempotent_resends"],
            "replayed_on_sdk_retry": workload.tally["replayed_on_retry"],
            "replays_of_dead": workload.tally["replays_done"],
            "endpoints_deleted": workload.tally["delete_endpoint"], "endpoints_disabled": workload.tally["disable_endpoint"],
            "accounts_deleted": len(workload.deleted_accounts),
            "deletion_rerequests": workload.tally["deletion_rerequests"],
            "topups": workload.tally["topups"], "topup_repeats": workload.tally["topup_repeats"],
            "reversals": len(workload.reversed_orders), "failovers": workload.tally["failovers"],
            "refused": dict(workload.refused),
        },
        "faults": {"injected": dict(injector.injected), "skipped": dict(injector.skipped), "log": injector.log},
        "deliveries": facts["outcomes"],
        "erasure": facts["erasure"],
        "refunds_by_reason": facts["refunds_by_reason"],
        "ledger_by_kind": facts["ledger_by_kind"],
        "receivers": {"requests": received, "ids": len(receivers.receipts), "invalid": receivers.invalid,
                      "ids_answered_2xx_more_than_once": ids_duplicated, "duplicate_2xx_copies": extra_copies,
                      "answers": {f"{b}:{a}": n for (b, a), n in sorted(receivers.answers.items())}},
        "checks": [check.__dict__ for check in results],
        "notes": notes,
        "seconds": {name: round(value, 1) for name, value in durations.items()},
        "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0]},
    }


# What the API processes logged that a reader of a run wants counted: requests that ended in an
# unhandled error (a 500 with a traceback), and group commits whose COMMIT answer was lost, by
# what the database said afterwards (delivery/api/group_commit.py).
API_LOG_EVENTS = {
    "unhandled_errors": '"event": "unhandled error"',
    "commits_lost_then_written": "new messages were written; their requests answer as usual",
    "commits_lost_not_written": "new messages were not written",
    "commits_lost_unknown": "could not tell within",
}


def api_log_counts(log_dir: Path) -> dict[str, int]:
    """Counts of API_LOG_EVENTS over every API process's log (informational, not a check)."""
    counts = dict.fromkeys(API_LOG_EVENTS, 0)
    for log in sorted(log_dir.glob("api*.log")):
        text = log.read_text(errors="replace")
        for name, marker in API_LOG_EVENTS.items():
            counts[name] += text.count(marker)
    return counts


def print_summary(summary: dict) -> None:
    load = summary["load"]
    print("\n== load")
    for name, value in load.items():
        if name != "refused":
            print(f"  {name:<28} {value:>10}")
    print(f"  {'refused (by problem)':<28} {load['refused']}")
    print("== faults injected")
    for kind, count in sorted(summary["faults"]["injected"].items()):
        print(f"  {kind:<28} {count:>10}")
    for kind, count in sorted(summary["faults"]["skipped"].items()):
        print(f"  {kind + ' (skipped)':<28} {count:>10}")
    print("== deliveries by outcome")
    for row in summary["deliveries"]:
        label = row["state"] + (f" ({row['reason']})" if row["reason"] else "")
        print(f"  {label:<40} {row['n']:>8}")
    print("== refunds by reason")
    for row in summary["refunds_by_reason"]:
        print(f"  {row['reason']:<40} {row['n']:>8} {row['credits']:>10} credits")
    receivers = summary["receivers"]
    print(f"== receivers: {receivers['requests']} requests for {receivers['ids']} ids,"
          f" {receivers['invalid']} invalid signatures; duplicates (2xx more than once):"
          f" {receivers['ids_answered_2xx_more_than_once']} ids, {receivers['duplicate_2xx_copies']} extra copies")
    erasure_facts = summary["erasure"]
    print(f"== erasure: by whom {erasure_facts['erased_by']}; expunged {erasure_facts['expunged']}"
          f" ({erasure_facts['expunged_twice']} twice), refused while live {erasure_facts['expunge_refused_live']};"
          f" retention passes {erasure_facts['eraser']}")
    if "api_logs" in summary:
        print("== API logs: " + ", ".join(f"{name.replace('_', ' ')} {count}"
                                          for name, count in summary["api_logs"].items()))
    for note in summary["notes"]:
        print(f"note: {note}")
    print("== checks")
    for check in summary["checks"]:
        print(f"  [{'ok' if check['passed'] else 'FAIL'}] {check['name']}: {check['detail']}")
    seconds = summary["seconds"]
    print(f"== duration: setup {seconds['setup']} s, workload+faults {seconds['window']} s, drain {seconds['drain']} s,"
          f" total {seconds['total']} s", flush=True)
