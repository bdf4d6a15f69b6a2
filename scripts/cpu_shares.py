"""CPU seconds by role (our processes, PostgreSQL, Redis, the benchmark itself), read from /proc.

The benchmarks share two cores between the load, our processes and the servers, so a rate alone
does not say what limits it; CPU per 1,000 operations for each role does. So does the time each
role was ready to run but waited for a core (`snapshot(..., waits=True)`, from
/proc/PID/schedstat): three processes handing work to each other on two cores wait there even
while a core is idle. Linux only: elsewhere there are no figures (nan).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu(pid: int, *, children: bool = False) -> float:
    """The process's CPU seconds; with `children`, also those of the children it has waited for (a
    load generator it ran, such as wrk; servers it started count only once reaped, after the runs)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / _TICKS


def _waited(pid: int) -> float:
    """Seconds the process was runnable but waited for a core (the run queue), so far."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9


def _named(prefix: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().startswith(prefix):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


Snapshot = dict[str, dict[int, float]]  # role -> pid -> CPU seconds so far


def snapshot(roles: dict[str, list[int]], *, waits: bool = False) -> Snapshot:
    """CPU seconds so far of each process of each role, plus 'postgres' and 'redis' found by name
    and 'bench' (this process, with the children it has waited for); with `waits`, the seconds
    each waited for a core instead (for 'bench', its own only). Empty off Linux (no /proc)."""
    if not Path("/proc/self/stat").exists():
        return {}
    result: Snapshot = {}
    named = {"postgres": _named("postgres"), "redis": _named("redis-server"), "bench": [os.getpid()]}
    for role, pids in {**roles, **named}.items():
        seconds = {}
        for pid in pids:
            try:
                seconds[pid] = _waited(pid) if waits else _cpu(pid, children=role == "bench")
            except (OSError, ValueError, IndexError):
                continue
        result[role] = seconds
    return result


def per_thousand(before: Snapshot, after: Snapshot, operations: int) -> dict[str, float]:
    """CPU milliseconds per 1,000 operations of each role between two snapshots.

    Summed per process: one that started in between counts all its time, one that exited in
    between (an autovacuum worker, say) counts nothing. Subtracting role totals instead would
    take a process's whole life off the role when it exits, and could go below zero.
    """
    if operations <= 0 or not after:
        return {role: float("nan") for role in after} or {"bench": float("nan")}
    return {
        role: sum(seconds - before.get(role, {}).get(pid, 0.0) for pid, seconds in pids.items()) * 1e6 / operations
        for role, pids in after.items()
    }


DATABASE_ROLES = ("postgres", "redis")


def database_bound(ceiling: dict[str, float], run: dict[str, float]) -> str | None:
    """What the database alone allows: the ceiling's CPU per 1,000 over itself plus the run's
    PostgreSQL and Redis CPU per 1,000 (cores are the limit), as "C / (C + D) = share"; None
    without figures."""
    ceiling_cpu = sum(ceiling.values())
    store = sum(run.get(role, 0.0) for role in DATABASE_ROLES)
    if not ceiling_cpu or not store:
        return None
    return f"{ceiling_cpu:.0f} / ({ceiling_cpu:.0f} + {store:.0f}) = {ceiling_cpu / (ceiling_cpu + store):.0%}"


def describe(shares: dict[str, float]) -> str:
    return ", ".join(f"{role} {value:.0f}" for role, value in shares.items())


def cores_busy(shares: dict[str, float], rate: float) -> str:
    """How many cores the roles kept busy at `rate` operations a second, in all and the busiest
    role: a single-process role near 1.0 is what limits the run; all of them near the machine's
    cores, the cores do. "" without figures."""
    busy = {role: value * rate / 1e6 for role, value in shares.items() if not math.isnan(value)}
    if not busy or not rate:
        return ""
    busiest = max(busy, key=busy.get)
    return f"{sum(busy.values()):.2f} of {os.cpu_count()} cores busy, the most by {busiest} ({busy[busiest]:.2f})"
