"""The workers' metrics, shared with the API through Redis: each worker process writes a snapshot of
them, and the API's /metrics publishes the live ones.

Deliveries, attempts, their latency and refunds are counted where they happen, in the worker
processes (delivery.metrics), while Prometheus scrapes the API. So every worker process writes the
samples of its worker-side metrics (metrics.WORKER_SUMMED and WORKER_GAUGES) to Redis every
HOOKLEDGER_WORKER_METRICS_SHARE_SECONDS, in a background task (the hot path does not change), and
once more as it stops: one JSON value under a key of the process's own, which expires after
EXPIRY_PERIODS periods, its name kept in the INDEX set. At each scrape the API reads the live
snapshots (and drops the expired ones' names from the index) and publishes, beside its own series:
the counters and the latency histogram summed over the live workers, each worker's
hookledger_worker_redis_reachable under a `worker` label, the gauges of the latest audit, and
hookledger_workers_reporting, the number of snapshots read.

The sums are over the live workers: a worker that exits leaves them when its last snapshot expires,
and Prometheus reads the drop as a counter reset (rate() and increase() handle resets). A worker
cut off from Redis drops out the same way until it can write again (its own
HOOKLEDGER_WORKER_METRICS_PORT, when set, still shows all of it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time

import msgspec
from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.asyncio import Redis

from delivery import metrics
from delivery.engine.queue import REDIS_ERRORS

logger = logging.getLogger(__name__)

KEY_PREFIX = "hookledger:metrics:worker:"  # + the process's name: its snapshot
INDEX = "hookledger:metrics:workers"  # the names of the processes whose snapshots may be live
EXPIRY_PERIODS = 3  # a snapshot outlives two missed writes
WRITE_TIMEOUT_SECONDS = 1.0  # the last write, as the worker stops, must not hold up its shutdown
_TOKEN = secrets.token_hex(3)  # names stay apart where hostnames and pids repeat (containers)

Sample = tuple[str, dict[str, str], float]  # sample name, labels, value


class Snapshot(msgspec.Struct, frozen=True):
    """One worker process's worker-side samples, by metric family (the _created times left out)."""

    process: str
    taken_at: float
    families: dict[str, list[Sample]]


def process_name() -> str:
    """hostname:pid:token: this process's snapshot key and `worker` label."""
    return f"{socket.gethostname()}:{os.getpid()}:{_TOKEN}"


def take() -> Snapshot:
    """This process's worker-side samples now (a few dozen: microseconds)."""
    families = {}
    for metric in (*metrics.WORKER_SUMMED, *metrics.WORKER_GAUGES):
        for family in metric.collect():
            families[family.name] = [(sample.name, sample.labels, sample.value) for sample in family.samples
                                     if not sample.name.endswith("_created")]
    return Snapshot(process_name(), time.time(), families)


class Publisher:
    """Writes this process's snapshot every period_seconds in a task of its own, and once at stop().

    Started and stopped by the worker (delivery.platform.worker), which may stop it while Redis is down:
    a write that fails is logged at debug level only (the worker's poll reports the outage).
    """

    def __init__(self, redis: Redis, period_seconds: float) -> None:
        self._redis = redis
        self._period = period_seconds
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="hookledger:metrics-share")

    async def stop(self) -> None:
        """Stop the periodic writes, and write what was counted since the last one."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.write()

    async def write(self) -> bool:
        """Write the snapshot now. False when it was not written (Redis did not take it within
        WRITE_TIMEOUT_SECONDS)."""
        snapshot = take()
        try:
            await asyncio.wait_for(self._write(snapshot.process, msgspec.json.encode(snapshot)), WRITE_TIMEOUT_SECONDS)
            return True
        except REDIS_ERRORS as error:
            logger.debug("metrics snapshot not written to Redis: %r", error)
        except Exception:  # a bug here must end neither the snapshots nor the worker's shutdown
            logger.exception("metrics snapshot not written")
        return False

    async def _write(self, name: str, body: bytes) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(KEY_PREFIX + name, body, px=round(self._period * EXPIRY_PERIODS * 1000))
            pipe.sadd(INDEX, name)
            await pipe.execute()

    async def _run(self) -> None:
        try:  # prunes the index of the processes gone before this one, even where no API scrapes
            await read(self._redis)
        except REDIS_ERRORS as error:
            logger.debug("metrics snapshots not read: %r", error)
        while True:
            await asyncio.sleep(self._period)
            await self.write()


async def read(redis: Redis) -> list[Snapshot]:
    """The live snapshots, by process name; the names of the expired ones leave the index.

    A worker whose snapshot expires as its next write lands can lose its name here: that write
    still stands, and the following one names it again.
    """
    names = sorted(await redis.smembers(INDEX))
    if not names:
        return []
    bodies = await redis.mget([KEY_PREFIX + name.decode() for name in names])
    expired = [name for name, body in zip(names, bodies) if body is None]
    if expired:
        await redis.srem(INDEX, *expired)
    snapshots = []
    for name, body in zip(names, bodies):
        if body is None:
            continue
        try:
            snapshots.append(msgspec.json.decode(body, type=Snapshot))
        except msgspec.DecodeError as error:  # another version's format: left out of this scrape only
            logger.warning("metrics snapshot of %s not read: %s", name.decode(), error)
    return snapshots


def exposition(snapshots: list[Snapshot] | None) -> bytes:
    """The API's /metrics body: its own series, and the workers' from their snapshots. None: the
    snapshots could not be read, and the workers' families are left without samples."""
    return generate_latest(_Exposition(snapshots))


_WORKER_FAMILIES = {metric.describe()[0].name for metric in (*metrics.WORKER_SUMMED, *metrics.WORKER_GAUGES)}


class _Exposition(Collector):
    def __init__(self, snapshots: list[Snapshot] | None) -> None:
        self._snapshots = snapshots

    def collect(self):
        # The worker-side series of this process's registry never move in the API: zeros, left out.
        for family in metrics.REGISTRY.collect():
            if family.name not in _WORKER_FAMILIES:
                yield family
        snapshots = self._snapshots or []
        for metric in metrics.WORKER_SUMMED:
            yield _summed(metric, snapshots)
        yield _per_worker(metrics.REDIS_REACHABLE, snapshots)
        # Per worker: the retention cron runs on one worker at a time, and each keeps its last run's figures.
        yield _per_worker(metrics.RETENTION_BACKLOG, snapshots)
        yield _per_worker(metrics.RETENTION_ERASED, snapshots)
        yield from _latest_audit(snapshots)
        if self._snapshots is not None:
            yield GaugeMetricFamily(
                "hookledger_workers_reporting",
                "Worker processes whose metrics snapshot in Redis is live: the workers' series above are theirs.",
                value=len(snapshots))


def _family(metric) -> Metric:
    """An empty family named, described and typed as this metric."""
    described = metric.describe()[0]
    return Metric(described.name, described.documentation, described.type)


def _summed(metric, snapshots: list[Snapshot]) -> Metric:
    family = _family(metric)
    sums: dict[tuple[str, tuple], float] = {}
    for snapshot in snapshots:
        for name, labels, value in snapshot.families.get(family.name, ()):
            key = (name, tuple(sorted(labels.items())))
            sums[key] = sums.get(key, 0.0) + value
    for (name, labels), value in sums.items():
        family.add_sample(name, dict(labels), value)
    return family


def _per_worker(metric, snapshots: list[Snapshot]) -> Metric:
    family = _family(metric)
    for snapshot in snapshots:
        for name, labels, value in snapshot.families.get(family.name, ()):
            family.add_sample(name, {**labels, "worker": snapshot.process}, value)
    return family


def _latest_audit(snapshots: list[Snapshot]) -> list[Metric]:
    """The audit runs on one worker at a time (a unique cron): its gauges are those of the latest
    run among the live workers, none when no live worker has run one (not a zero)."""
    found = [_family(metrics.AUDIT_VIOLATIONS), _family(metrics.AUDIT_NOTICES)]
    last_run = _family(metrics.AUDIT_LAST_RUN)
    runs = [(_value(snapshot, last_run.name), snapshot) for snapshot in snapshots]
    runs = [(finished, snapshot) for finished, snapshot in runs if finished]
    if runs:
        finished, latest = max(runs, key=lambda run: run[0])
        last_run.add_sample(last_run.name, {}, finished)
        for family in found:
            family.add_sample(family.name, {}, _value(latest, family.name))
    return [*found, last_run]


def _value(snapshot: Snapshot, family_name: str) -> float:
    samples = snapshot.families.get(family_name)
    return samples[0][2] if samples else 0.0
