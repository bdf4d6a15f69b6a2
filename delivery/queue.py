"""The job queue (arq on Redis), kept behind this one module so it could be replaced.

Redis holds nothing that cannot be rebuilt from PostgreSQL: a job is only a hint that some
deliveries are due. If every job is lost, the sweeper (a cron in the worker) finds the due
deliveries in PostgreSQL within one sweep interval. Jobs carry ids, never rows, and are
serialized as JSON, never pickle.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from datetime import timedelta

from arq.connections import ArqRedis, RedisSettings, create_pool
from arq.constants import job_key_prefix
from arq.jobs import serialize_job
from arq.utils import timestamp_ms
from redis.exceptions import ConnectionError as RedisConnectionError, TimeoutError as RedisTimeoutError

from delivery.errors import ServerUnreachableError

QUEUE_NAME = "hookledger:deliveries"
IDS_PER_JOB_MAX = 500


def serialize(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def deserialize(data: bytes) -> object:
    return json.loads(data)


def redis_settings(redis_url: str, *, wait_seconds: int = 5) -> RedisSettings:
    settings = RedisSettings.from_dsn(redis_url)
    settings.conn_timeout = 2
    settings.conn_retries = wait_seconds
    settings.conn_retry_delay = 1
    return settings


async def connect(redis_url: str, *, wait_seconds: int = 5) -> ArqRedis:
    """A connection pool, once Redis answers a PING: tried again every second for wait_seconds.

    A process that starts while Redis restarts waits for it (HOOKLEDGER_REDIS_START_WAIT_SECONDS);
    one whose REDIS_URL is wrong still stops with ServerUnreachableError.
    """
    try:
        return await create_pool(
            redis_settings(redis_url, wait_seconds=wait_seconds), job_serializer=serialize,
            job_deserializer=deserialize, default_queue_name=QUEUE_NAME,
        )
    except (RedisConnectionError, RedisTimeoutError, OSError) as error:
        from delivery.services import server_address  # services imports config, which imports us

        raise ServerUnreachableError(f"Redis at {server_address(redis_url)} (REDIS_URL): {error}") from error


class Queue:
    """Wake workers for deliveries that are due now or later."""

    def __init__(self, redis: ArqRedis) -> None:
        self.redis = redis

    async def wake(self, delivery_ids: Iterable[uuid.UUID]) -> None:
        """Ask a worker to claim these deliveries now (after their create committed)."""
        await self._enqueue(delivery_ids, None)

    async def defer_by(self, delivery_ids: Iterable[uuid.UUID], delay: timedelta) -> None:
        """Ask a worker to claim these deliveries after `delay` (their next attempt)."""
        await self._enqueue(delivery_ids, delay)

    async def _enqueue(self, delivery_ids: Iterable[uuid.UUID], delay: timedelta | None) -> None:
        """Write the jobs as arq's enqueue_job does (job key, then its score in the queue), all in one
        MULTI/EXEC round trip.

        enqueue_job first WATCHes the job key and checks it does not exist, two more round trips per
        job, to keep job ids unique. Ours are random per call (arq silently refuses a job id it has
        seen recently, arq #137, #432), so that check could never fire; on the ingest path it was
        most of the cost of a wake-up.
        """
        ids = [str(delivery_id) for delivery_id in delivery_ids]
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
            await pipe.execute()
