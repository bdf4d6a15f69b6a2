#!/usr/bin/env python3
"""Benchmark report: runs every scripts/bench_*.py at modest sizes, writes one JSON and one PNG.

Each benchmark runs as a subprocess with `--json`, one after another (the machine has few cores;
two benchmarks at once would measure each other). While the delivery benchmark runs, the CPU
time of every `postgres` process on the machine is sampled from /proc, to show what share of the
machine one PostgreSQL server takes while workers drain (on a shared server this includes
other people's load: the report says so).

    .venv/bin/python scripts/bench.py [--out bench-results] [--only ledger,delivery,...]
        [--ledger-messages 2000] [--delivery-deliveries 10000] [--naive-deliveries 1000]
        [--latency-rate 300] [--latency-seconds 8] [--ingest-seconds 3] [--ingest-accounts 200]
        [--ops-live 20000] [--ops-ledger 200000] [--signing-seconds 1] [--sender-sends 10000]

With DATABASE_URL / REDIS_URL unset, one embedded PostgreSQL and Redis are started here and
handed to every benchmark. matplotlib (the `bench` extra) is imported only to draw the chart.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ("signing", "sender", "ledger", "ingest", "delivery", "ops")
BENCH_SECONDS_MAX = 900  # one benchmark past this is stopped and reported as failed
CPU_SAMPLE_SECONDS = 0.5


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results")
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="comma-separated subset of " + ",".join(BENCHMARKS))
    parser.add_argument("--signing-seconds", type=float, default=1.0)
    parser.add_argument("--sender-sends", type=int, default=10_000)
    parser.add_argument("--ledger-messages", type=int, default=2000)
    parser.add_argument("--ledger-accounts", type=int, default=100)
    parser.add_argument("--ingest-seconds", type=float, default=3.0)
    parser.add_argument("--ingest-accounts", type=int, default=200)
    parser.add_argument("--delivery-deliveries", type=int, default=10_000)
    parser.add_argument("--naive-deliveries", type=int, default=1_000)
    parser.add_argument("--latency-rate", type=float, default=300.0)
    parser.add_argument("--latency-seconds", type=float, default=8.0)
    parser.add_argument("--ops-live", type=int, default=20_000)
    parser.add_argument("--ops-ledger", type=int, default=200_000)
    options = parser.parse_args()
    options.only = [name.strip() for name in options.only.split(",") if name.strip()]
    unknown = set(options.only) - set(BENCHMARKS)
    if unknown:
        parser.error(f"unknown benchmarks: {sorted(unknown)}")
    return options


def arguments_of(name: str, options: argparse.Namespace) -> list[str]:
    return {
        "signing": ["--seconds", str(options.signing_seconds)],
        "sender": ["--sends", str(options.sender_sends), "--rounds", "1"],
        "ledger": ["--messages", str(options.ledger_messages), "--accounts", str(options.ledger_accounts)],
        "ingest": ["--seconds", str(options.ingest_seconds), "--accounts", str(options.ingest_accounts),
                   "--concurrency", "96"],  # one concurrency: its rows are keyed by fan-out and accounts
        "delivery": ["--deliveries", str(options.delivery_deliveries), "--naive-deliveries", str(options.naive_deliveries),
                     "--rate", str(options.latency_rate), "--seconds", str(options.latency_seconds)],
        "ops": ["--live", str(options.ops_live), "--ledger", str(options.ops_ledger)],
    }[name]


# ---- CPU share of PostgreSQL, from /proc ----------------------------------------------------------

def _ticks_of(pid: str) -> int:
    with open(f"/proc/{pid}/stat") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks


def postgres_ticks() -> dict[str, tuple[int, bool]]:
    """CPU ticks of every live `postgres` process: pid -> (ticks, is a benchmark's backend).

    A backend's process title names its database, so the benchmarks' own backends
    (`hookledger_bench...`) are told apart from the server's shared processes and other people's.
    """
    found: dict[str, tuple[int, bool]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as file:
                if file.read().strip() != "postgres":
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                ours = b"hookledger_bench" in file.read()
            found[pid] = (_ticks_of(pid), ours)
        except (OSError, IndexError, ValueError):
            continue  # the process ended between listing and reading
    return found


def machine_ticks() -> int:
    with open("/proc/stat") as file:
        return sum(int(value) for value in file.readline().split()[1:8])


def _spent(before: dict, after: dict) -> tuple[int, int]:
    """(all postgres, benchmark backends) ticks spent between two snapshots; a new pid counts from 0.

    A backend that exited between the snapshots is missing from `after`: its last interval's
    CPU is lost, so the shares are a slight underestimate, never an overestimate.
    """
    total = ours = 0
    for pid, (ticks, is_ours) in after.items():
        spent = ticks - before.get(pid, (0, False))[0]
        total += spent
        ours += spent if is_ours else 0
    return total, ours


class CpuSampler(threading.Thread):
    """Samples PostgreSQL's share of the machine's CPU time every CPU_SAMPLE_SECONDS until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float]] = []  # (all postgres, benchmark backends) shares
        self.spent = [0, 0]
        self.machine = 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        previous, previous_machine = postgres_ticks(), machine_ticks()
        while not self._stop_event.wait(CPU_SAMPLE_SECONDS):
            current, current_machine = postgres_ticks(), machine_ticks()
            total, ours = _spent(previous, current)
            machine = current_machine - previous_machine
            if machine > 0:
                self.samples.append((total / machine, ours / machine))
                self.spent[0] += total
                self.spent[1] += ours
                self.machine += machine
            previous, previous_machine = current, current_machine

    def stop(self) -> dict:
        self._stop_event.set()
        self.join()

        def summary(index: int) -> dict:
            ordered = sorted(sample[index] for sample in self.samples)
            return {"mean": self.spent[index] / self.machine if self.machine else None,
                    "p90": ordered[int(len(ordered) * 0.9)] if ordered else None,
                    "max": ordered[-1] if ordered else None}

        return {"unit": "share of the whole machine's CPU time (1.0 = every core busy)",
                "all_postgres": summary(0), "benchmark_backends": summary(1),
                "samples": len(self.samples), "sample_seconds": CPU_SAMPLE_SECONDS}


# ---- running the benchmarks -------------------------------------------------------------------------

def run_benchmark(name: str, options: argparse.Namespace, environment: dict[str, str], out: Path) -> dict:
    json_path = out / f"{name}.json"
    log_path = out / f"{name}.log"
    command = [sys.executable, str(ROOT / "scripts" / f"bench_{name}.py"), *arguments_of(name, options),
               "--json", str(json_path)]
    print(f"== bench_{name}: {' '.join(command[2:])}", flush=True)
    sampler = CpuSampler() if name in ("delivery", "ingest") else None
    if sampler:
        sampler.start()
    began = time.monotonic()
    with open(log_path, "w") as log:
        try:
            completed = subprocess.run(command, cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT,
                                       timeout=BENCH_SECONDS_MAX, check=False)
            status = completed.returncode
        except subprocess.TimeoutExpired:
            status = "timeout"
    seconds = time.monotonic() - began
    cpu = sampler.stop() if sampler else None
    tail = log_path.read_text()[-2500:]
    print(tail, flush=True)
    if status != 0 or not json_path.exists():
        print(f"bench_{name} failed ({status}); see {log_path}", flush=True)
        return {"ok": False, "status": status, "seconds": seconds, "log": str(log_path)}
    return {"ok": True, "seconds": round(seconds, 1), "result": json.loads(json_path.read_text()),
            "postgres_cpu": cpu}


def servers_environment() -> tuple[dict[str, str], str]:
    """The environment for the benchmarks: DATABASE_URL and REDIS_URL set (embedded ones started here if unset)."""
    from delivery.platform import config, services

    settings = config.load()
    database_url = services.database_url(settings.database)
    redis_url = services.redis_url(settings.redis)
    embedded = "embedded" if not os.environ.get("DATABASE_URL") else "configured"
    return {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url}, embedded


def machine(database_url: str) -> dict:
    import asyncio

    import asyncpg

    async def version() -> str:
        connection = await asyncpg.connect(database_url)
        try:
            return await connection.fetchval("SHOW server_version")
        finally:
            await connection.close()

    with open("/proc/meminfo") as file:
        memory_kib = int(file.readline().split()[1])
    with open("/proc/loadavg") as file:
        load = file.read().split()[:3]
    return {"cores": os.cpu_count(), "memory_gib": round(memory_kib / 2**20, 1), "postgresql": asyncio.run(version()),
            "python": platform.python_version(), "kernel": platform.release(), "load_average_at_start": load,
            "shared": True}


# ---- summary and chart --------------------------------------------------------------------------------

def headline(report: dict) -> dict:
    """The numbers the README table shows, as rates and ratios to their ceilings and baselines."""
    rows: dict = {}
    delivery = report["benchmarks"].get("delivery", {}).get("result", {}).get("results")
    if delivery:
        ceiling = delivery["ceiling"]["rate"]
        naive = delivery.get("naive", {}).get("rate")
        for key, value in delivery.items():
            if key.startswith("drain"):
                rows[f"deliveries/s, {key[5:]} worker(s)"] = {
                    "rate": value["rate"], "ceiling": value.get("ceiling", ceiling),
                    "of_ceiling": value["rate"] / value.get("ceiling", ceiling),
                    "baseline": naive, "times_baseline": value["rate"] / naive if naive else None}
        for key, label in (("latency", "delivery latency"), ("latency_api", "delivery latency through the API")):
            if key in delivery:
                rows[label] = {name: delivery[key][name] for name in ("offered", "p50_ms", "p99_ms", "max_ms")}
    ingest = report["benchmarks"].get("ingest", {}).get("result")
    if ingest:
        trivial = ingest["trivial_handler_per_second"]
        bare = {(row["fan_out"], "hot" in row["accounts"]): row["messages_per_second"] for row in ingest["bare_sql"]}
        for row in ingest["api"]:
            baseline = bare.get((row["fan_out"], "hot" in row["accounts"]))
            rows[f"ingest msg/s, fan-out {row['fan_out']}, {row['accounts']}"] = {
                "rate": row["messages_per_second"], "ceiling": trivial, "of_ceiling": row["share_of_trivial"],
                "baseline": baseline, "times_baseline": row["messages_per_second"] / baseline if baseline else None}
    ledger = report["benchmarks"].get("ledger", {}).get("result")
    if ledger:
        for row in ledger["rows"]:
            rows[f"ledger {row['operation']}/s, {row['scenario']}"] = {
                "rate": row["real_per_second"], "baseline": row["bare_sql_per_second"], "of_baseline": row["ratio"]}
    ops = report["benchmarks"].get("ops", {}).get("result")
    if ops:
        for row in ops["rows"]:
            rows[f"{row['operation']} (s)"] = {"seconds": row["real_seconds"], "baseline": row["bare_sql_seconds"],
                                               "times_baseline": row["ratio"]}
    for name in ("delivery", "ingest"):
        cpu = report["benchmarks"].get(name, {}).get("postgres_cpu")
        if cpu:
            rows[f"PostgreSQL CPU share during bench_{name}"] = {
                "all_mean": cpu["all_postgres"]["mean"], "all_p90": cpu["all_postgres"]["p90"],
                "bench_backends_mean": cpu["benchmark_backends"]["mean"], "bench_backends_p90": cpu["benchmark_backends"]["p90"]}
    sender = report["benchmarks"].get("sender", {}).get("result")
    if sender:
        for row in sender["rows"]:
            rows[f"client CPU per send, {row['way']}"] = {"us": row["best"], "times_plain": row["times_plain"]}
    signing = report["benchmarks"].get("signing", {}).get("result")
    if signing:
        for row in signing["rows"]:
            rows[f"{row['operation']}/s"] = {"rate": row["ours_per_second"], "baseline": row["theirs_per_second"],
                                             "baseline_name": row["compared_with"], "of_baseline": row["ratio"]}
    return rows


def draw(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(14, 9))
    figure.suptitle(f"hookledger benchmarks, {report['started_at'][:16]} — {report['machine']['cores']} cores,"
                    f" PostgreSQL {report['machine']['postgresql']}, shared machine")
    _deliveries_panel(axes[0][0], report)
    _ingest_panel(axes[0][1], report)
    _latency_panel(axes[1][0], report)
    _ledger_panel(axes[1][1], report)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _bars(axis, labels, values, colors, title, unit) -> None:
    positions = range(len(labels))
    bars = axis.bar(positions, values, color=colors)
    axis.set_xticks(list(positions), labels, rotation=35, ha="right", fontsize=7)
    axis.set_title(title, fontsize=10)
    axis.set_ylabel(unit)
    for bar, value in zip(bars, values):
        axis.annotate(f"{value:,.0f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                      ha="center", va="bottom", fontsize=8)


def _deliveries_panel(axis, report) -> None:
    delivery = report["benchmarks"].get("delivery", {}).get("result", {}).get("results")
    if not delivery:
        axis.set_title("delivery benchmark: not run")
        return
    labels, values, colors = ["ceiling\n(plain aiohttp)"], [delivery["ceiling"]["rate"]], ["#999999"]
    for key in sorted(k for k in delivery if k.startswith("drain")):
        labels.append(f"workers: {key[5:]}")
        values.append(delivery[key]["rate"])
        colors.append("#2a7ab0")
    if "naive" in delivery:
        labels.append("naive baseline\n(job per delivery)")
        values.append(delivery["naive"]["rate"])
        colors.append("#d08c2a")
    _bars(axis, labels, values, colors, "deliveries/s (receiver on loopback)", "deliveries/s")


def _ingest_panel(axis, report) -> None:
    ingest = report["benchmarks"].get("ingest", {}).get("result")
    if not ingest:
        axis.set_title("ingest benchmark: not run")
        return
    labels, values, colors = ["trivial aiohttp\nhandler (ceiling)"], [ingest["trivial_handler_per_second"]], ["#999999"]
    for row in ingest["api"]:
        labels.append(f"API f{row['fan_out']}\n{row['accounts']}")
        values.append(row["messages_per_second"])
        colors.append("#2a7ab0")
    for row in ingest["bare_sql"]:
        labels.append(f"1 tx/msg f{row['fan_out']}\n{row['accounts']}")
        values.append(row["messages_per_second"])
        colors.append("#d08c2a")
    _bars(axis, labels, values, colors, "ingest: POST /v1/messages per second (f = fan-out)", "messages/s")


def _latency_panel(axis, report) -> None:
    delivery = report["benchmarks"].get("delivery", {}).get("result", {}).get("results", {})
    latency = delivery.get("latency")
    if not latency:
        axis.set_title("latency: not run")
        return
    labels, values, colors = ["p50", "p99", "max"], [latency["p50_ms"], latency["p99_ms"], latency["max_ms"]], ["#2a7ab0", "#2a7ab0", "#999999"]
    title = f"delivery latency, {latency['offered']:.0f}/s offered, 1 worker: create commit -> receiver"
    through_api = delivery.get("latency_api")
    if through_api:
        labels += ["API p50", "API p99", "API max"]
        values += [through_api["p50_ms"], through_api["p99_ms"], through_api["max_ms"]]
        colors += ["#d08c2a", "#d08c2a", "#999999"]
        title += "; API: 202 -> receiver"
    _bars(axis, labels, values, colors, title, "ms")


def _ledger_panel(axis, report) -> None:
    ledger = report["benchmarks"].get("ledger", {}).get("result")
    if not ledger:
        axis.set_title("ledger benchmark: not run")
        return
    labels = [f"{row['operation']}\n{row['scenario']}" for row in ledger["rows"]]
    real = [row["real_per_second"] for row in ledger["rows"]]
    bare = [row["bare_sql_per_second"] for row in ledger["rows"]]
    width = 0.4
    positions = list(range(len(labels)))
    axis.bar([p - width / 2 for p in positions], real, width, label="billing functions", color="#2a7ab0")
    axis.bar([p + width / 2 for p in positions], bare, width, label="bare SQL (floor work)", color="#d08c2a")
    axis.set_xticks(positions, labels, fontsize=8)
    axis.set_title("ledger: create and settle per second, beside bare SQL", fontsize=10)
    axis.set_ylabel("operations/s")
    axis.legend(fontsize=8)


def print_table(rows: dict) -> None:
    print("\n== headline")
    for name, row in rows.items():
        print(f"  {name:<52} " + ", ".join(f"{k}={v:,.2f}" if isinstance(v, float) else f"{k}={v}"
                                           for k, v in row.items()))


def main() -> int:
    options = parse()
    options.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = options.out / f"run-{stamp}"
    out.mkdir()
    environment, servers = servers_environment()
    report = {"started_at": datetime.now(UTC).isoformat(), "servers": servers,
              "machine": machine(environment["DATABASE_URL"]), "benchmarks": {}}
    began = time.monotonic()
    for name in options.only:
        report["benchmarks"][name] = run_benchmark(name, options, environment, out)
    report["seconds"] = round(time.monotonic() - began, 1)
    report["headline"] = headline(report)
    json_path, png_path = options.out / f"bench-{stamp}.json", options.out / f"bench-{stamp}.png"
    json_path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    written = [(json_path, "latest.json")]
    try:
        draw(report, png_path)
        written.append((png_path, "latest.png"))
    except ModuleNotFoundError as error:
        # The chart is the only part that needs matplotlib (the optional `bench` extra); the
        # figures are all in the JSON file and the table below either way.
        print(f"chart skipped ({error}): .venv/bin/pip install -e '.[bench]' to draw it", flush=True)
    for source, latest in written:
        (options.out / latest).write_bytes(source.read_bytes())
    print_table(report["headline"])
    print(f"\nwrote {' and '.join(str(path) for path, _ in written)} in {report['seconds']} s", flush=True)
    return 0 if all(bench["ok"] for bench in report["benchmarks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
