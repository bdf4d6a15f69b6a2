"""Worker processes under fire: SIGKILL mid-send, SIGTERM, Redis losing every key or going away, PostgreSQL restarting.

Each worker here is a real `python -m delivery worker` process; receivers are real HTTP servers
in the test process; PostgreSQL and Redis are real.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import redis.asyncio as redis_asyncio

from billing.audit import audit
from billing.database import create_pool
from billing.messages import MessageRequest, create_messages
from delivery.platform import migrate, services
from engine_helpers import (PRICE, add_account, add_endpoint, all_finished, fast_environment, ledger_of, states,
                            wait_for)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def start_worker(environment: dict[str, str]) -> subprocess.Popen:
    full = {**os.environ, **environment, "PYTHONUNBUFFERED": "1"}
    log = tempfile.NamedTemporaryFile(prefix="worker-", suffix=".log", delete=False)
    process = subprocess.Popen([sys.executable, "-m", "delivery", "worker"], cwd=ROOT, env=full,
                               stdout=log, stderr=subprocess.STDOUT)
    process.log_path = log.name  # type: ignore[attr-defined]
    return process


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
        process.wait(10)


def worker_log(process: subprocess.Popen, *, whole: bool = False) -> str:
    text = Path(process.log_path).read_text()  # type: ignore[attr-defined]
    return text if whole else text[-3000:]


async def _create(pool, account_id, count: int, attempts_max: int = 3) -> list:
    results = await create_messages(
        pool, [MessageRequest(account_id, "e", b'{"n": %d}' % n) for n in range(count)], attempts_max=attempts_max)
    return [d.id for created in results for d in created.deliveries]


async def _failing_each_first_try(pool, keyring, receiver_factory):
    """A receiver that answers 500 to the first request of each webhook-id and 200 after, and an
    account with one endpoint there."""

    def fail_first_try(number):
        ids = [request["id"] for request in receiver.received]
        return 500 if ids.count(ids[-1]) == 1 else 200

    receiver = await receiver_factory(fail_first_try)
    account_id = await add_account(pool, balance=10_000)
    await add_endpoint(pool, account_id, receiver, keyring)
    return receiver, account_id


async def test_sigkill_mid_send_loses_nothing(pool, database_url, redis_url, keyring, receiver_factory):
    """SIGKILL the worker while a send is in flight; another worker finishes the delivery: delivered,
    charged once, never refunded, and the receiver saw the same webhook-id twice (it dedupes)."""
    first_request = asyncio.Event()

    async def stall_first(number):
        if number == 1:
            first_request.set()
            await asyncio.sleep(5)
        return 200

    receiver = await receiver_factory(stall_first)
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring, timeout_ms=2000)
    environment = fast_environment(database_url, redis_url, keyring, HOOKLEDGER_LEASE_MS="3500")
    (delivery_id,) = await _create(pool, account_id, 1)
    doomed = start_worker(environment)
    try:
        await asyncio.wait_for(first_request.wait(), 30)
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(10)
        successor = start_worker(environment)
        try:
            await wait_for(lambda: all_finished(pool, [delivery_id]), timeout_seconds=40)
        finally:
            stop(successor)
    finally:
        stop(doomed)
    row = (await states(pool, [delivery_id]))[delivery_id]
    assert row["state"] == "delivered", row
    assert await ledger_of(pool, delivery_id) == {"charge": -PRICE}
    ids = [request["id"] for request in receiver.received]
    assert ids.count(str(delivery_id)) >= 2 and all(request["valid"] for request in receiver.received)
    assert (await audit(pool)).clean


async def test_sigterm_finishes_the_send_in_flight_and_records_it(pool, database_url, redis_url, keyring,
                                                                  receiver_factory):
    """SIGTERM while a send is in flight: the worker stops claiming, lets the send finish within the
    grace period, records it (delivered on the first attempt), and exits by itself."""
    first_request = asyncio.Event()

    async def slow(number):
        first_request.set()
        await asyncio.sleep(0.7)
        return 200

    receiver = await receiver_factory(slow)
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring, timeout_ms=2000)
    environment = fast_environment(database_url, redis_url, keyring, HOOKLEDGER_SHUTDOWN_GRACE_SECONDS="5")
    (delivery_id,) = await _create(pool, account_id, 1)
    worker = start_worker(environment)
    try:
        await asyncio.wait_for(first_request.wait(), 30)
        worker.send_signal(signal.SIGTERM)
        started = time.monotonic()
        while worker.poll() is None and time.monotonic() - started < 20:
            await asyncio.sleep(0.1)  # keep the receiver (this event loop) answering
        assert worker.poll() is not None, "the worker did not exit after SIGTERM"
    finally:
        stop(worker)
    row = (await states(pool, [delivery_id]))[delivery_id]
    assert (row["state"], row["attempt"]) == ("delivered", 1), worker_log(worker)
    assert len(receiver.received) == 1


async def test_redis_losing_every_key_loses_no_delivery(pool, database_url, redis_url, keyring, receiver_factory):
    """Redis loses every key twice (queued wake-ups, deferred retries): every delivery still finishes.
    FLUSHDB empties the database the test and its worker use; FLUSHALL would empty every database on
    a server that may be the user's own (REDIS_URL)."""

    _, account_id = await _failing_each_first_try(pool, keyring, receiver_factory)
    environment = fast_environment(database_url, redis_url, keyring, HOOKLEDGER_RETRY_SCHEDULE="0,1,1")
    client = redis_asyncio.Redis.from_url(redis_url)
    delivery_ids = await _create(pool, account_id, 60)
    from delivery.engine import queue as job_queue

    arq_redis = await job_queue.connect(redis_url)
    await job_queue.Queue(arq_redis).wake([(account_id, delivery_id) for delivery_id in delivery_ids])
    await client.flushdb()  # the wake-up jobs are gone before any worker saw them
    worker = start_worker(environment)
    try:
        await wait_for(lambda: pool.fetchval(
            "SELECT count(*) > 0 FROM deliveries WHERE state = 'pending' AND attempt >= 1"), timeout_seconds=30)
        await client.flushdb()  # now the deferred retries are gone too
        await wait_for(lambda: all_finished(pool, delivery_ids), timeout_seconds=60)
    finally:
        stop(worker)
        await client.aclose()
        await arq_redis.aclose()
    found = await states(pool, delivery_ids)
    assert all(row["state"] == "delivered" for row in found.values())
    assert (await audit(pool)).clean


async def test_postgresql_restart_mid_run_the_worker_reconnects(redis_url, keyring, receiver_factory, tmp_path):
    """PostgreSQL restarts while the worker runs: it reconnects and delivers what is created afterwards.

    Runs on an embedded PostgreSQL of its own, so restarting it disturbs nothing else."""
    data_dir = tmp_path / "pg"
    server_url = services.start_embedded_postgres(data_dir, delete_on_exit=True)
    await migrate.upgrade_async(server_url)
    pool = await create_pool(server_url, size_min=1, size_max=4)
    receiver = await receiver_factory()
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring)
    environment = fast_environment(server_url, redis_url, keyring)
    worker = start_worker(environment)
    try:
        before = await _create(pool, account_id, 5)
        await wait_for(lambda: all_finished(pool, before), timeout_seconds=30)
        await pool.close()
        await asyncio.to_thread(services.restart_embedded_postgres, data_dir)
        pool = await create_pool(server_url, size_min=1, size_max=4)
        after = await _create(pool, account_id, 5)
        await wait_for(lambda: all_finished(pool, after), timeout_seconds=40)
        found = await states(pool, before + after)
        assert all(row["state"] == "delivered" for row in found.values()), worker_log(worker)
        assert (await audit(pool)).clean
    finally:
        stop(worker)
        await pool.close()



async def test_redis_outage_the_worker_delivers_from_postgresql_and_reconnects(pool, database_url, keyring,
                                                                              receiver_factory, private_redis):
    """Redis goes away mid-run: the worker stays up and keeps delivering from PostgreSQL alone, first
    attempts and retries; when Redis is back it goes on through Redis; SIGTERM during an outage
    still ends it cleanly. arq's own loop ended the worker at the first Redis error."""

    _, account_id = await _failing_each_first_try(pool, keyring, receiver_factory)
    environment = fast_environment(database_url, private_redis.url, keyring, HOOKLEDGER_RETRY_SCHEDULE="0,0.5,0.5")
    worker = start_worker(environment)
    try:
        before = await _create(pool, account_id, 5)
        await wait_for(lambda: all_finished(pool, before), timeout_seconds=30)

        private_redis.stop()
        during = await _create(pool, account_id, 10)
        await wait_for(lambda: all_finished(pool, during), timeout_seconds=30)
        assert worker.poll() is None, worker_log(worker)

        private_redis.start()
        await wait_for(lambda: asyncio.sleep(0, "Redis answers again" in worker_log(worker, whole=True)), timeout_seconds=10)
        after = await _create(pool, account_id, 5)
        await wait_for(lambda: all_finished(pool, after), timeout_seconds=30)

        private_redis.stop()
        await wait_for(lambda: asyncio.sleep(0, worker_log(worker, whole=True).count("Redis is unreachable") >= 2),
                       timeout_seconds=10)
        worker.send_signal(signal.SIGTERM)
        started = time.monotonic()
        while worker.poll() is None and time.monotonic() - started < 20:
            await asyncio.sleep(0.1)
        assert worker.poll() == 0, worker_log(worker)
    finally:
        stop(worker)
    found = await states(pool, before + during + after)
    assert all(row["state"] == "delivered" for row in found.values()), found
    assert all(row["attempt"] == 2 for row in found.values())  # each failed once and was retried
    log = worker_log(worker, whole=True)
    assert "Traceback" not in log, log
    assert (await audit(pool)).clean
