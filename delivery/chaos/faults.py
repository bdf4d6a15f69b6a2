"""The fault schedule (pure, seeded) and the injector that carries it out on a running cluster.

Every kind appears at least once per cycle; a cycle's faults are shuffled and spread evenly over
their share of the window with some jitter, so the same seed gives the same schedule. The
`down` receiver's outage is a fault too: it is taken down and brought back on the schedule.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field

from delivery.chaos.cluster import Cluster, Servers
from delivery.chaos.receivers import ReceiverFarm

logger = logging.getLogger(__name__)

KINDS = ("sigkill_worker", "sigterm_worker", "flush_redis", "restart_postgres", "restart_api", "receiver_outage",
         "redis_outage")
JITTER_SHARE = 0.3  # of the gap between two faults
OUTAGE_SHARE = 0.15  # of the window the `down` receiver stays down each time (at least OUTAGE_SECONDS_MIN)
OUTAGE_SECONDS_MIN = 6.0
REDIS_OUTAGE_SHARE = 0.05  # of the window Redis stays stopped each time (3 to 20 s)
REDIS_OUTAGE_SECONDS = (3.0, 20.0)


@dataclass(frozen=True)
class Fault:
    at_seconds: float
    kind: str


def schedule(rng: random.Random, window_seconds: float, cycles: int) -> list[Fault]:
    """`cycles` rounds of every kind, in a seeded order, over the first 90% of the window."""
    faults: list[Fault] = []
    usable = window_seconds * 0.9
    count = cycles * len(KINDS)
    gap = usable / count
    kinds = []
    for _ in range(cycles):
        cycle = list(KINDS)
        rng.shuffle(cycle)
        kinds.extend(cycle)
    for number, kind in enumerate(kinds):
        at = gap * (number + 0.5) + rng.uniform(-JITTER_SHARE, JITTER_SHARE) * gap
        faults.append(Fault(round(max(0.0, at), 3), kind))
    return faults


@dataclass
class Injector:
    cluster: Cluster
    servers: Servers
    receivers: ReceiverFarm
    rng: random.Random
    window_seconds: float
    injected: Counter = field(default_factory=Counter)
    skipped: Counter = field(default_factory=Counter)
    log: list[dict] = field(default_factory=list)
    _outages: list[asyncio.Task] = field(default_factory=list)
    _redis_outages: list[asyncio.Task] = field(default_factory=list)

    async def run(self, faults: list[Fault], started: float) -> None:
        for fault in faults:
            delay = started + fault.at_seconds - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await self.inject(fault.kind, time.monotonic() - started)
        if self._outages or self._redis_outages:
            await asyncio.gather(*self._outages, *self._redis_outages)

    async def inject(self, kind: str, elapsed: float) -> None:
        detail = await getattr(self, "_" + kind)()
        entry = {"at_seconds": round(elapsed, 2), "kind": kind, "detail": detail}
        if detail.startswith("skipped"):
            self.skipped[kind] += 1
        else:
            self.injected[kind] += 1
        self.log.append(entry)
        print(f"  fault at {elapsed:6.1f} s: {kind:<18} {detail}", flush=True)

    async def _sigkill_worker(self) -> str:
        victim = self.cluster.signal_worker(self.rng.randrange(len(self.cluster.workers)), signal.SIGKILL)
        return f"{victim.name} killed, replacement started"

    async def _sigterm_worker(self) -> str:
        victim = self.cluster.signal_worker(self.rng.randrange(len(self.cluster.workers)), signal.SIGTERM)
        return f"{victim.name} terminated, replacement started"

    async def _flush_redis(self) -> str:
        if self.servers.redis_down or self.servers.redis_frozen:
            return "skipped: Redis is out"
        return await self.servers.flush_redis()

    async def _redis_outage(self) -> str:
        """Stop Redis and start it again (empty) later, or freeze it (SIGSTOP: connections stay open,
        nothing answers) and thaw it: the workers keep delivering from PostgreSQL, the APIs keep
        accepting, and processes started meanwhile wait for it."""
        if self.servers.redis_process is None:
            return "skipped: Redis is not the run's own server"
        if self.servers.redis_down or self.servers.redis_frozen:
            return "skipped: Redis is still out"
        low, high = REDIS_OUTAGE_SECONDS
        seconds = max(low, min(self.window_seconds * REDIS_OUTAGE_SHARE, high))
        freeze = self.rng.random() < 0.5
        if freeze:
            self.servers.freeze_redis()
        else:
            await self.servers.stop_redis()

        async def back_later() -> None:
            await asyncio.sleep(seconds)
            if freeze:
                self.servers.thaw_redis()
            else:
                await self.servers.start_redis()

        self._redis_outages.append(asyncio.create_task(back_later()))
        return f"Redis {'frozen' if freeze else 'stopped'} for {seconds:.0f} s"

    async def _restart_postgres(self) -> str:
        if self.servers.pg_data_dir is None:
            return "skipped: PostgreSQL is not the run's own embedded server"
        began = time.monotonic()
        await self.servers.restart_postgres()
        return f"restarted in {time.monotonic() - began:.1f} s"

    async def _restart_api(self) -> str:
        how = self.rng.choice((signal.SIGKILL, signal.SIGTERM))
        began = time.monotonic()
        victim = await self.cluster.restart_api(self.rng.randrange(len(self.cluster.apis)), how)
        return f"{victim.name} {how.name}, back on port {victim.port} in {time.monotonic() - began:.1f} s"

    async def _receiver_outage(self) -> str:
        if any(not task.done() for task in self._outages):
            return "skipped: the 'down' receiver is still down"
        seconds = max(OUTAGE_SECONDS_MIN, min(self.window_seconds * OUTAGE_SHARE, 60.0))
        await self.receivers.take_down()

        async def back_later() -> None:
            await asyncio.sleep(seconds)
            await self.receivers.bring_back()

        self._outages.append(asyncio.create_task(back_later()))
        return f"'down' receiver refuses connections for {seconds:.0f} s"
