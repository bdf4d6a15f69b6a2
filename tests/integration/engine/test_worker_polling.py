"""The worker's poll (DeliveryWorker.start_jobs): its period is a setting, running jobs (here or in
another worker) neither hide new ones nor cost arq's three round trips each, and a backlog costs
one chunk of EXISTS per free slot, not one per waiting job.

The commands counted are the worker's own, on a Redis client of the test's that counts what it
sends (not the server's commandstats, which every other client of a shared Redis moves too), and
polls are counted, not inferred from a sleep.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import types
import uuid

from arq.connections import ArqRedis
from arq.constants import in_progress_key_prefix, job_key_prefix
from arq.jobs import serialize_job
from arq.utils import timestamp_ms

from delivery.engine import queue as job_queue
from delivery.platform.worker import EXISTS_CHUNK, build_worker
from engine_helpers import running_worker, wait_for

RUNNING_ELSEWHERE = 300  # 15 workers' worth of running jobs at the default of 20 each


async def _enqueue_with_id(redis, job_id: str, function: str = "deliver") -> None:
    """A job under a chosen id, written as delivery.engine.queue writes one."""
    now_ms = timestamp_ms()
    job = serialize_job(function, ([str(uuid.uuid4())],), {}, None, now_ms, serializer=job_queue.serialize)
    await redis.psetex(job_key_prefix + job_id, 60_000, job)
    await redis.zadd(job_queue.QUEUE_NAME, {job_id: now_ms})


def _counting_redis(redis_url: str) -> tuple[ArqRedis, collections.Counter]:
    """A Redis client set up as delivery.engine.queue.connect sets one up, and a count of the
    commands it sends, by lower-case name (each command of a pipeline or MULTI counted)."""
    redis = ArqRedis.from_url(redis_url, socket_connect_timeout=job_queue.CONNECT_TIMEOUT_SECONDS,
                              socket_timeout=job_queue.COMMAND_TIMEOUT_SECONDS)
    redis.job_serializer, redis.job_deserializer = job_queue.serialize, job_queue.deserialize
    redis.default_queue_name = job_queue.QUEUE_NAME
    sent: collections.Counter = collections.Counter()
    base = redis.connection_pool.connection_class

    class CountingConnection(base):  # every command, alone or in a pipeline, is packed here
        def pack_command(self, *args):
            name = args[0].decode() if isinstance(args[0], bytes) else str(args[0])
            sent[name.split()[0].lower()] += 1
            return super().pack_command(*args)

    redis.connection_pool.connection_class = CountingConnection  # before any connection is made
    return redis, sent


def _counting_polls(worker) -> types.SimpleNamespace:
    """Count the worker's polls (arq's main loop calls _poll_iteration once a poll)."""
    polls = types.SimpleNamespace(count=0)
    poll = worker._poll_iteration

    async def counted() -> None:
        polls.count += 1
        await poll()

    worker._poll_iteration = counted
    return polls


async def _polls_go_by(polls, number: int) -> None:
    start = polls.count
    await wait_for(lambda: asyncio.sleep(0, polls.count >= start + number), timeout_seconds=60)


async def test_a_job_running_here_is_not_started_again_and_a_finished_one_is(settings, pool, arq_queue):
    redis = arq_queue.redis
    async with running_worker(settings, pool) as worker:
        await wait_for(lambda: asyncio.sleep(0, "engine" in worker.ctx))
        polls = _counting_polls(worker)
        job_id = uuid.uuid4().hex
        release = asyncio.Event()
        worker.tasks[job_id] = asyncio.create_task(release.wait())  # this worker "runs" the job
        await _enqueue_with_id(redis, job_id)
        await _polls_go_by(polls, 50)
        # Skipped before any Redis round trip: arq would have taken it (no in-progress key exists
        # for it), set its in-progress key and run it.
        assert not await redis.exists(in_progress_key_prefix + job_id)
        assert await redis.zscore(job_queue.QUEUE_NAME, job_id) is not None

        release.set()  # the task is done; the id is in the queue again, so it must run
        await wait_for(lambda: _left_queue(redis, job_id))


async def test_a_job_running_in_another_worker_costs_no_watch_per_poll(settings, pool, arq_queue):
    """Its in-progress key is found by one pipelined EXISTS; arq's WATCH, EXISTS, ZSCORE are not spent on it."""
    redis = arq_queue.redis
    worker_redis, sent = _counting_redis(settings.redis.url)
    async with running_worker(settings, pool, worker_redis) as worker:
        await wait_for(lambda: asyncio.sleep(0, "engine" in worker.ctx))
        polls = _counting_polls(worker)
        job_id = uuid.uuid4().hex
        await redis.psetex(in_progress_key_prefix + job_id, 60_000, b"1")  # another worker runs it
        await _enqueue_with_id(redis, job_id)
        await _polls_go_by(polls, 1)  # a poll that began before the job was queued does not count
        watches_before = sent["watch"]
        await _polls_go_by(polls, 50)
        # arq alone would WATCH it on every poll (50 or more); the sweep cron may add one or two.
        assert sent["watch"] - watches_before < 10, sent
        assert await redis.zscore(job_queue.QUEUE_NAME, job_id) is not None

        await redis.delete(in_progress_key_prefix + job_id)  # that worker died and its key expired
        await wait_for(lambda: _left_queue(redis, job_id))  # so this one runs the job


async def test_a_new_job_behind_many_running_elsewhere_still_starts(settings, pool, arq_queue):
    """Many workers' running jobs at the head of the queue do not hide a new job from a worker with free slots.

    arq reads at most queue_read_limit ids from the head each poll (100 by default), and a job stays
    in the queue while it runs: six workers of 20 jobs each filled that window, and the next
    delivery waited until one of their (possibly 15-second) sends finished.
    """
    redis = arq_queue.redis
    async with running_worker(settings, pool) as worker:
        await wait_for(lambda: asyncio.sleep(0, "engine" in worker.ctx))
        elsewhere = [uuid.uuid4().hex for _ in range(RUNNING_ELSEWHERE)]
        for job_id in elsewhere:
            await redis.psetex(in_progress_key_prefix + job_id, 60_000, b"1")
            await _enqueue_with_id(redis, job_id)
        await asyncio.sleep(0.002)  # the new job's score is later than every running one's
        new_job = uuid.uuid4().hex
        await _enqueue_with_id(redis, new_job)
        await wait_for(lambda: _left_queue(redis, new_job))
        assert all([await redis.zscore(job_queue.QUEUE_NAME, job_id) is not None for job_id in elsewhere])


async def test_one_free_slot_behind_a_backlog_asks_about_one_chunk_not_every_job(settings, arq_queue):
    """With one slot free and 300 jobs waiting, the pre-check asks Redis about the first chunk only."""
    redis = arq_queue.redis
    worker = build_worker(settings, settings.redis.url, handle_signals=False)
    worker_redis, sent = _counting_redis(settings.redis.url)
    worker._pool = worker_redis  # as arq's main() would set it; the worker is not running
    try:
        waiting = [uuid.uuid4().hex for _ in range(300)]
        for job_id in waiting:
            await _enqueue_with_id(redis, job_id, function="not_a_function")  # arq fails it at once: nothing runs
        worker.job_counter = worker.max_jobs - 1
        for _ in range(worker.job_counter):
            await worker.sem.acquire()
        await worker.start_jobs([job_id.encode() for job_id in waiting])
        # One chunk of the pre-check, then arq's own EXISTS for the one job it started: the worker's
        # client sent nothing else, so the count is exact.
        assert sent["exists"] == EXISTS_CHUNK + 1, sent
        assert list(worker.tasks) == [waiting[0]]
    finally:
        await asyncio.gather(*worker.tasks.values())
        await worker_redis.aclose()


async def _left_queue(redis, job_id: str) -> bool:
    return await redis.zscore(job_queue.QUEUE_NAME, job_id) is None


def test_the_poll_period_is_the_setting(settings) -> None:
    """HOOKLEDGER_WORKER_POLL_MS is what arq waits between reads of the queue (10 ms unless set)."""
    assert build_worker(settings, settings.redis.url, handle_signals=False).poll_delay_s == settings.worker.poll_ms / 1000
    slower = dataclasses.replace(settings, worker=dataclasses.replace(settings.worker, poll_ms=250))
    assert build_worker(slower, settings.redis.url, handle_signals=False).poll_delay_s == 0.25
