"""CPU seconds by role (our processes, PostgreSQL, Redis, the benchmark itself), read from /proc.

The benchmarks share two cores between the load, our processes and the servers, so a rate alone
does not say what limits it; CPU per 1,000 operations for each role does. Linux only: elsewhere
every figure is nan.
"""

from __future__ import annotations

import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


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


def snapshot(roles: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds so far of each role's processes, plus 'postgres' and 'redis' found by name and
    'bench' (this process). A process that exited counts nothing from then on."""
    result: dict[str, float] = {}
    named = {"postgres": _named("postgres"), "redis": _named("redis-server"), "bench": [os.getpid()]}
    for role, pids in {**roles, **named}.items():
        total = 0.0
        for pid in pids:
            try:
                total += _cpu(pid)
            except (OSError, ValueError, IndexError):
                continue
        result[role] = total
    return result


def per_thousand(before: dict[str, float], after: dict[str, float], operations: int) -> dict[str, float]:
    """CPU milliseconds per 1,000 operations of each role between two snapshots."""
    if operations <= 0:
        return {role: float("nan") for role in after}
    return {role: (after[role] - before.get(role, 0.0)) * 1e6 / operations for role in after}


def describe(shares: dict[str, float]) -> str:
    return ", ".join(f"{role} {value:.0f}" for role, value in shares.items())
