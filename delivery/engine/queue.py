"""The job queue (arq on Redis), kept behind this one module so it could be replaced.

Redis holds nothing that cannot be rebuilt from PostgreSQL: a job is only a hint that some
deliveries are due. If every job is lost, the sweeper (a cron in the worker) finds the due
deliveries in PostgreSQL within one sweep interval. Jobs carry ids, never rows, and are
serialized as JSON, never pickle: a `deliver` job carries `[account_id, delivery_id]` pairs, the
delivery's whole key, so that its claim names each delivery's account (delivery.engine.claims). A
job of the previous version carries bare delivery id strings; workers still claim those by id.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Iterable
from datetime import timedelta

from arq.connections import ArqRedis, RedisSettings
from arq.constants import job_key_prefix
from arq.jobs import serialize_job
from arq.utils import timestamp_ms
from redis.exceptions import (ConnectionError as RedisConnectionError, ReadOnlyError, TimeoutError as RedisTimeoutError,
                              WatchError)

from billing.ids import parse_id
from delivery.engine.claims import DeliveryKey
from delivery.errors import ServerUnreachableError, server_address

QUEUE_NAME = "hookledger:deliveries"
# Operator jobs (account deletion) go to the head of the queue and have slots of their own in every
# worker (delivery.platform.worker), so they never wait behind deliveries; their ids say what they are.
OPERATOR_JOB_PREFIX = "op:"
# Published with every job due now: workers listen on it and read the queue at once, rather than
# polling it every few milliseconds (delivery.platform.worker). A lost message only waits for the
# next read, HOOKLEDGER_WORKER_POLL_MS later.
WAKE_CHANNEL = "hookledger:wake"
IDS_PER_JOB_MAX = 500
CONNECT_TIMEOUT_SECONDS = 2
COMMAND_TIMEOUT_SECONDS = 5  # no command of ours or arq's blocks; 5 s without an answer is an outage
# What a call to Redis raises when Redis is not there (refused, reset, timed out): an outage to ride
# out, never a reason to fail work that PostgreSQL already holds. redis-py reports a connection
# lost between WATCH and EXEC as a WatchError ("A ConnectionError occurred on while watching");
# arq catches the other kind (a watched key changed) itself, and so does DeliveryWorker, so a
# WatchError that reaches a caller of ours is a lost connection. READONLY: a failover is under way.
REDIS_ERRORS = (RedisConnectionError, RedisTimeoutError, WatchError, ReadOnlyError, ConnectionError, OSError,
                asyncio.TimeoutError)
logger = logging.getLogger(__name__)


def serialize(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def deserialize(data: bytes) -> object:
    return json.loads(data)


def redis_settings(redis_url: str) -> RedisSettings:
    """For arq's own pools (the benchmark's naive baseline); ours come from connect()."""
    settings = RedisSettings.from_dsn(redis_url)
    settings.conn_timeout = CONNECT_TIMEOUT_SECONDS
    return settings


async def connect(redis_url: str, *, wait_seconds: int = 5) -> ArqRedis:
    """A connection pool, once Redis answers a PING: asked again every second for wait_seconds.

    A process that starts while Redis restarts waits for it (HOOKLEDGER_REDIS_START_WAIT_SECONDS);
    one whose REDIS_URL is wrong stops with ServerUnreachableError. Unlike arq's create_pool, every
    command has a timeout: a Redis that stops answering (paused, or cut off without a reset) is
    then an error the worker rides out (delivery.engine.redis_outage), not a poll that waits forever.
    """
    redis = ArqRedis.from_url(redis_url, socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
                              socket_timeout=COMMAND_TIMEOUT_SECONDS)
    redis.job_serializer, redis.job_deserializer, redis.default_queue_name = serialize, deserialize, QUEUE_NAME
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            await redis.ping()
            return redis
        except REDIS_ERRORS as error:
            left = deadline - time.monotonic()
            if left <= 0:
                await redis.aclose()
                raise ServerUnreachableError(f"Redis at {server_address(redis_url)} (REDIS_URL): {error}") from error
            logger.warning("Redis at %s does not answer (%s); asking again for %.0f s",
                           server_address(redis_url), error, left)
            await asyncio.sleep(min(1.0, left))


class Queue:
    """Wake workers for deliveries that are due now or later."""

    def __init__(self, redis: ArqRedis) -> None:
        self.redis = redis

    async def wake(self, keys: Iterable[tuple[uuid.UUID, uuid.UUID]]) -> None:
        """Ask a worker to claim these deliveries, (account_id, delivery_id) each, now (after their
        create committed)."""
        await self._enqueue(keys, None)

    async def defer_by(self, keys: Iterable[tuple[uuid.UUID, uuid.UUID]], delay: timedelta) -> None:
        """Ask a worker to claim these deliveries, (account_id, delivery_id) each, after `delay`
        (their next attempt)."""
        await self._enqueue(keys, delay)

    async def _enqueue(self, keys: Iterable[tuple[uuid.UUID, uuid.UUID]], delay: timedelta | None) -> None:
        """Write the jobs as arq's enqueue_job does (job key, then its score in the queue), all in one
        MULTI/EXEC round trip.

        enqueue_job first WATCHes the job key and checks it does not exist, two more round trips per
        job, to keep job ids unique. Ours are random per call (arq silently refuses a job id it has
        seen recently, arq #137, #432), so that check could never fire; on the ingest path it was
        most of the cost of a wake-up.
        """
        ids = [[str(account_id), str(delivery_id)] for account_id, delivery_id in keys]
        if not ids:
            return
        now_ms = timestamp_ms()
        delay_ms = 0 if delay is None else max(0, round(delay.total_seconds() * 1000))
        expires_ms = delay_ms + self.redis.expires_extra_ms
        async with self.redis.pipeline(transaction=True) as pipe:
            for start in range(0, len(ids), IDS_PER_JOB_MAX):
                job_id = uuid.uuid4().hex
                job = serialize_job("deliver", (ids[start:start + IDS_PER_JOB_MAX],), {}, None, now_ms,
                                    serializer=serialize)
                pipe.psetex(job_key_prefix + job_id, expires_ms, job)
                pipe.zadd(QUEUE_NAME, {job_id: now_ms + delay_ms})
            if delay is None:
                pipe.publish(WAKE_CHANNEL, b"")
            await pipe.execute()


def parse_deliver_job(entries: list) -> tuple[list[DeliveryKey], list[uuid.UUID]]:
    """A `deliver` job's argument: its (account, delivery) keys, and the bare delivery ids of a job
    from the previous version (a list of id strings), at most IDS_PER_JOB_MAX in all. Raises
    ValueError on anything else."""
    keys: list[DeliveryKey] = []
    bare: list[uuid.UUID] = []
    for entry in entries[:IDS_PER_JOB_MAX]:
        if isinstance(entry, str):
            bare.append(parse_id(entry))
        elif isinstance(entry, list) and len(entry) == 2:
            account_id, delivery_id = entry
            keys.append(DeliveryKey(parse_id(account_id), parse_id(delivery_id)))
        else:
            raise ValueError(f"not a delivery of a deliver job: {entry!r}")
    return keys, bare


def is_operator_job(job_id: str) -> bool:
    return job_id.startswith(OPERATOR_JOB_PREFIX)


async def enqueue_operator_job(redis: ArqRedis, function: str, *args: object) -> str:
    """Enqueue an operator job at the head of the queue, due now; returns its id.

    Its score is just below the oldest job's (or now, on a queue with none older), so a worker's
    read of the queue's head finds it first however many deliveries wait; the worker starts it in
    a slot kept for operator jobs. A fresh id each call (arq silently refuses an id it has seen,
    arq #137, #432). Raises one of REDIS_ERRORS when Redis is unreachable.
    """
    job_id = f"{OPERATOR_JOB_PREFIX}{function}:{uuid.uuid4().hex}"
    now_ms = timestamp_ms()
    head = await redis.zrange(QUEUE_NAME, 0, 0, withscores=True)
    score = min(now_ms, int(head[0][1]) - 1) if head else now_ms
    job = serialize_job(function, args, {}, None, now_ms, serializer=serialize)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.psetex(job_key_prefix + job_id, redis.expires_extra_ms, job)
        pipe.zadd(QUEUE_NAME, {job_id: score})
        pipe.publish(WAKE_CHANNEL, b"")
        await pipe.execute()
    return job_id
