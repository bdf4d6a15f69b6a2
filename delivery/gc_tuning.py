"""Garbage-collector settings for a long-running process with a high allocation rate.

CPython collects its youngest generation every 700 net allocations. The worker allocates
thousands of short-lived objects per batch (rows, tasks, futures, results) and keeps a batch
alive across its sends, so many survive a young collection, get promoted, and trigger full
collections that walk the whole heap, modules and classes included. Profiled under
scripts/bench_delivery.py, that collection was about a quarter of the worker's CPU.

`tune` freezes what start-up allocated (it is never garbage) and raises the young threshold,
so collections run far less often and never walk the frozen start-up heap. Cycles are still
collected: this makes collection rarer, never off.
"""

from __future__ import annotations

import gc

GEN0_MIN = 700  # CPython's default; smaller makes no sense here
GEN0_MAX = 1_000_000
# How many young (then middle) collections before the next older one runs. CPython's default is
# (10, 10); fewer full collections matter more here than prompt reclaiming of old cycles.
OLDER_THRESHOLDS = (20, 100)


def tune(gen0_threshold: int) -> None:
    """Freeze the start-up heap and collect the young generation every gen0_threshold allocations.

    0 leaves the interpreter's settings untouched.
    """
    if gen0_threshold == 0:
        return
    if not GEN0_MIN <= gen0_threshold <= GEN0_MAX:
        raise ValueError(f"gen0_threshold must be 0 or {GEN0_MIN}..{GEN0_MAX}, got {gen0_threshold}")
    gc.collect()
    gc.freeze()
    gc.set_threshold(gen0_threshold, *OLDER_THRESHOLDS)
