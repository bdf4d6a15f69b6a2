"""The worker and a Redis (or a PostgreSQL) that goes away: DeliveryWorker's poll, start_jobs and
close, and its jobs.

The Redis tests run a redis-server of their own, stopped and started again for real, beside the
shared PostgreSQL; the PostgreSQL one points the engine at a port where nothing listens. The
subprocess version, with SIGTERM during a Redis outage, is in tests/acceptance.
"""

from __future__ import annotations

import asyncio
import signal
import types
import uuid

import asyncpg
import pytest
from redis.exceptions import ReadOnlyError, WatchError

from billing.messages import MessageRequest, create_messages
from delivery import metrics
from delivery.platform import config
from delivery.engine import queue as job_queue
from delivery.platform import worker as worker_module
from delivery.engine.pipeline import Engine
from delivery.platform.run import free_port  # nothing listens there once it is returned
from delivery.engine.sender import Sender
from delivery.store.signer_cache import SignerCache
from delivery.platform.worker import SWEEP_TASK_NAME
from engine_helpers import (add_account, add_endpoint, all_finished, fast_environment, keys_of, running_worker,
                            startup_crons_done, states, wait_for)


async def _create(pool, account_id, count: int) -> list:
    results = await create_messages(pool, [MessageRequest(account_id, "e", b'{"n": %d}' % n) for n in range(count)],
                                    attempts_max=3)
    return [d.id for created in results for d in created.deliveries]


async def _account_with_endpoint(pool, keyring, receiver_factory):
    account_id = await add_account(pool, balance=10_000)
    await add_endpoint(pool, account_id, await receiver_factory(), keyring)
    return account_id


def _settings(database_url, private_redis, keyring, **overrides):
    # A sweep interval longer than the test: what is delivered while Redis is up came through a wake-up.
    return config.load(fast_environment(database_url, private_redis.url, keyring,
                                        **{"HOOKLEDGER_SWEEP_SECONDS": "60", **overrides}))


def _is_wake_up(job_id: str) -> bool:
    """Whether an arq job id is a delivery wake-up's (delivery.engine.queue: a bare uuid4 hex)."""
    try:
        return uuid.UUID(hex=job_id).hex == job_id
    except ValueError:
        return False


async def test_a_redis_failure_while_starting_a_job_gives_its_slot_back(pool, database_url, keyring, receiver_factory,
                                                                        private_redis):
    """arq takes a slot, then marks the job in progress in Redis; if Redis fails in between, the slot
    was never given back. With one slot, the worker then never started a job again."""
    account_id = await _account_with_endpoint(pool, keyring, receiver_factory)
    settings = _settings(database_url, private_redis, keyring, HOOKLEDGER_WORKER_JOBS="1", HOOKLEDGER_SWEEP_SECONDS="1")
    async with running_worker(settings, pool) as worker:
        await wait_for(lambda: asyncio.sleep(0, "engine" in worker.ctx))
        await startup_crons_done(worker)
        mark, failures = worker._mark_in_progress, []

        async def redis_dies_first(job_id: str) -> bool:
            # Only at the wake-up's own job: a cron job (id `<name>:<time>`, the sweep's and the
            # operational cron's at each minute's second 0) can start meanwhile, and Redis stopped
            # then made the test's own wake-up fail instead.
            if not failures and _is_wake_up(job_id):
                private_redis.stop()  # a real outage, at the worst moment: the slot is taken
                try:
                    return await mark(job_id)
                except Exception as error:
                    failures.append(error)
                    raise
            return await mark(job_id)

        worker._mark_in_progress = redis_dies_first
        redis = await job_queue.connect(private_redis.url)
        try:
            first = await _create(pool, account_id, 1)
            await job_queue.Queue(redis).wake(await keys_of(pool, first))
            await wait_for(lambda: asyncio.sleep(0, bool(failures)))
            assert worker.job_counter == 0 and worker.sem._value == worker.max_jobs + 1
            await wait_for(lambda: all_finished(pool, first))  # swept while Redis is down
            private_redis.start()
            await wait_for(lambda: asyncio.sleep(0, not worker._redis_outage.down))
            second = await _create(pool, account_id, 3)
            await job_queue.Queue(redis).wake(await keys_of(pool, second))
            await wait_for(lambda: all_finished(pool, second), timeout_seconds=10)
        finally:
            await redis.aclose()
    assert len(failures) == 1
    found = await states(pool, first + second)
    assert all(row["state"] == "delivered" for row in found.values())


SWEEP_SECONDS = 2  # four of the poll's RETRY_SECONDS: the retries come between the sweeps


async def test_while_redis_is_down_and_nothing_is_due_the_worker_sweeps_once_per_interval(
        pool, database_url, keyring, receiver_factory, private_redis):
    """One in-process sweep at once, and once nothing more is due one per sweep interval, never two at
    a time; the gauge says Redis is down; once Redis answers a PING, the sweeps stop.

    Judged from the worker's own records, not from counts within a fixed sleep: every call of the
    outage's `failed` (each failed poll, with the loop time the worker passed) and every sweep it ran.
    A loaded machine only spaces those out; the rule they must follow does not change."""
    account_id = await _account_with_endpoint(pool, keyring, receiver_factory)
    settings = _settings(database_url, private_redis, keyring, HOOKLEDGER_SWEEP_SECONDS=str(SWEEP_SECONDS))
    async with running_worker(settings, pool) as worker:
        await wait_for(lambda: asyncio.sleep(0, "engine" in worker.ctx))
        await startup_crons_done(worker)
        outage = worker._outage()  # the one the worker's poll uses from now on
        polls, sweeps = _record_polls_and_sweeps(worker, outage)
        private_redis.stop()
        await wait_for(lambda: asyncio.sleep(0, outage.down))
        assert metrics.REDIS_REACHABLE._value.get() == 0
        created = await _create(pool, account_id, 4)
        await wait_for(lambda: all_finished(pool, created))  # by the sweeps the outage runs
        assert outage.down
        # Three sweeps that found nothing due, however long a loaded machine takes to run them.
        await wait_for(lambda: asyncio.sleep(0, [s["processed"] for s in sweeps.done].count(0) >= 3),
                       timeout_seconds=30)
        down_polls = list(polls.failed)
        started = [(now, task) for now, task in down_polls if task is not None]
        assert started[0][0] == down_polls[0][0]  # the first failed poll sweeps at once
        results = {task: task.result() for _, task in started if task.done()}
        for (earlier, task), (later, _) in zip(started, started[1:]):
            if results.get(task) == 0:  # nothing was due: the next waits a whole interval
                assert later - earlier >= SWEEP_SECONDS, (earlier, later)
        # The poll kept retrying every RETRY_SECONDS in between, and those retries swept nothing.
        assert len(down_polls) > len(started), down_polls
        assert sweeps.peak == 1  # never two at a time

        private_redis.start()
        await wait_for(lambda: asyncio.sleep(0, not outage.down))
        assert metrics.REDIS_REACHABLE._value.get() == 1
        await wait_for(lambda: asyncio.sleep(0, all(task.done() for _, task in started)))  # one may have been running
        failed_calls, sweeps_run, up_at, polls_up = len(polls.failed), sweeps.started, worker.loop.time(), polls.count
        # Two sweep intervals of loop time, and polls that went through meanwhile: no poll failed, so no sweep.
        await wait_for(lambda: asyncio.sleep(0, worker.loop.time() >= up_at + 2 * SWEEP_SECONDS
                                             and polls.count >= polls_up + 5), timeout_seconds=30)
        assert (len(polls.failed), sweeps.started) == (failed_calls, sweeps_run)
        assert SWEEP_TASK_NAME not in worker.tasks or worker.tasks[SWEEP_TASK_NAME].done()
        later = await _create(pool, account_id, 2)
        await job_queue.Queue(worker.pool).wake(await keys_of(pool, later))
        await wait_for(lambda: all_finished(pool, later))
    found = await states(pool, created + later)
    assert all(row["state"] == "delivered" for row in found.values())


def _record_polls_and_sweeps(worker, outage):
    """Wrap the worker's poll, the outage's `failed` and its sweep to keep what they did: the number
    of polls, each failed poll's loop time and the sweep task it started (or None), and the sweeps
    (how many started, the most at once, what each found)."""
    polls = types.SimpleNamespace(count=0, failed=[])
    sweeps = types.SimpleNamespace(started=0, running=0, peak=0, done=[])
    poll, failed, sweep = worker._poll_iteration, outage.failed, outage._sweep

    async def counted_poll():
        polls.count += 1
        await poll()

    def recorded_failed(error, now):
        task = failed(error, now)
        polls.failed.append((now, task))
        return task

    async def recorded_sweep():
        sweeps.started += 1
        sweeps.running += 1
        sweeps.peak = max(sweeps.peak, sweeps.running)
        try:
            processed = await sweep()
        finally:
            sweeps.running -= 1
        sweeps.done.append({"processed": processed})
        return processed

    worker._poll_iteration, outage.failed, outage._sweep = counted_poll, recorded_failed, recorded_sweep
    return polls, sweeps


async def test_jobs_log_one_line_while_postgresql_is_unreachable(settings, caplog):
    """A deliver job or the sweep that finds PostgreSQL gone logs one warning and returns 0, instead of
    arq's traceback per failed job while a restart lasts."""
    dead = await asyncpg.create_pool(f"postgresql://postgres@127.0.0.1:{free_port()}/test", min_size=0, max_size=2)
    sender = Sender(settings.worker.sender)
    try:
        ctx = {"engine": Engine(dead, sender, None, SignerCache(None), settings.worker.engine), "pool": dead}
        assert await worker_module.deliver(ctx, [str(uuid.uuid4())]) == 0
        assert await worker_module.sweep(ctx) == 0
    finally:
        await sender.close()
        await dead.close()
    lines = [record.getMessage() for record in caplog.records if record.name == "delivery.platform.worker"]
    assert len(lines) == 2 and all("PostgreSQL is unavailable" in line for line in lines), lines


async def test_a_redis_that_stops_answering_is_an_outage_not_a_hang(pool, database_url, keyring, receiver_factory,
                                                                    private_redis):
    """Redis frozen (SIGSTOP: connections open, no answers, as behind a path that drops packets). arq's
    pool has no command timeout, so the worker's poll waited for as long as that lasted; ours times out
    after COMMAND_TIMEOUT_SECONDS and the worker delivers from PostgreSQL meanwhile."""
    account_id = await _account_with_endpoint(pool, keyring, receiver_factory)
    settings = _settings(database_url, private_redis, keyring, HOOKLEDGER_SWEEP_SECONDS="1")
    async with running_worker(settings, pool) as worker:
        await wait_for(lambda: asyncio.sleep(0, "engine" in worker.ctx))
        # The startup sweep is done: a sweep that began before the freeze could deliver what is made
        # during it, which would show nothing about the poll.
        await startup_crons_done(worker)
        private_redis.pause()
        try:
            # The poll gives up after COMMAND_TIMEOUT_SECONDS: an outage (a poll without a timeout
            # would still be waiting when this wait fails).
            await wait_for(lambda: asyncio.sleep(0, worker._redis_outage is not None and worker._redis_outage.down),
                           timeout_seconds=job_queue.COMMAND_TIMEOUT_SECONDS + 20)
            assert not worker.ctx["engine"].queue_reachable
            created = await _create(pool, account_id, 3)
            await wait_for(lambda: all_finished(pool, created), timeout_seconds=30)
            assert worker._redis_outage.down  # delivered from PostgreSQL while Redis was still frozen
        finally:
            private_redis.resume()
        await wait_for(lambda: asyncio.sleep(0, not worker._redis_outage.down), timeout_seconds=15)
        assert worker.ctx["engine"].queue_reachable
    found = await states(pool, created)
    assert all(row["state"] == "delivered" for row in found.values())


async def test_a_connection_lost_while_watching_counts_as_an_outage(private_redis):
    """redis-py reports a connection lost between WATCH and EXEC as a WatchError, not a ConnectionError.
    Uncounted, it ended the worker (seen in CI: Redis stopped while a job was being checked under
    WATCH), so the outage errors include it."""
    redis = await job_queue.connect(private_redis.url)
    try:
        async with redis.pipeline(transaction=True) as pipe:
            await pipe.watch("hookledger:test:key")
            private_redis.stop()
            with pytest.raises(WatchError) as raised:
                await pipe.exists("hookledger:test:key")
        assert isinstance(raised.value, job_queue.REDIS_ERRORS)
    finally:
        await redis.aclose()


async def test_a_redis_turned_replica_counts_as_an_outage(private_redis):
    """During a failover the old primary answers writes with READONLY (a ResponseError, not a
    connection error); the worker's poll writes (it marks jobs in progress), so that counts as an
    outage too instead of ending the loop."""
    redis = await job_queue.connect(private_redis.url)
    try:
        await redis.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))  # a primary that is not there
        with pytest.raises(ReadOnlyError) as raised:
            await redis.psetex("hookledger:test:key", 1000, b"1")
        assert isinstance(raised.value, job_queue.REDIS_ERRORS)
    finally:
        await redis.aclose()


async def test_a_shutdown_during_an_outage_ends_once_nothing_runs(pool, database_url, keyring, private_redis):
    """The grace after SIGTERM lasts while jobs run. arq waits for its task dict to empty, and done
    tasks leave it only in the poll that an outage skips: a worker told to stop while Redis was down
    (a killed `hookledger run` takes Redis with it) waited out the whole grace with nothing running."""
    settings = _settings(database_url, private_redis, keyring, HOOKLEDGER_SWEEP_SECONDS="1",
                         HOOKLEDGER_SHUTDOWN_GRACE_SECONDS="60")
    async with running_worker(settings, pool) as worker:
        await wait_for(lambda: asyncio.sleep(0, "engine" in worker.ctx))
        private_redis.stop()
        await wait_for(lambda: asyncio.sleep(0, SWEEP_TASK_NAME in worker.tasks and worker.tasks[SWEEP_TASK_NAME].done()))
        assert worker._redis_outage.down
        worker.handle_sig_wait_for_completion(signal.SIGTERM)
        # The grace is 60 s; the wait for the main task is a third of it.
        await wait_for(lambda: asyncio.sleep(0, worker.main_task.done()), timeout_seconds=20)
        assert worker.main_task.cancelled()
        assert worker.ctx["engine"].accepting is False
