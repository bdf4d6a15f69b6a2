"""Fixtures for the delivery engine: programmable receivers on loopback, a worker in this process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import asyncpg
import pytest
from aiohttp import web

from billing import accounts, ids
from billing.database import SERVER_SETTINGS
from delivery.platform import config
from delivery.engine import claims, queue as job_queue
from delivery.store.signer_cache import endpoint_secret_context
from delivery.platform.worker import build_worker
from signing import encrypt_secret, generate_at_rest_key, generate_secret, Keyring, format_keyring, verify

PRICE = 5


@dataclass
class Receiver:
    """A real HTTP server on 127.0.0.1 whose answer to each request is programmed by the test."""

    secret: str
    behaviour: Callable[[int], object] = lambda number: 200  # request number -> status or coroutine
    received: list[dict] = field(default_factory=list)
    verified: int = 0
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        number = len(self.received) + 1
        entry = {"id": request.headers.get("webhook-id"), "body": body, "headers": dict(request.headers)}
        self.received.append(entry)
        try:
            verify(request.headers, body, self.secret)
            self.verified += 1
            entry["valid"] = True
        except Exception:  # noqa: BLE001 - counted, not raised: the test asserts on it
            entry["valid"] = False
        answer = self.behaviour(number)
        if asyncio.iscoroutine(answer):
            answer = await answer
        if answer == "drop":
            # Close the connection without answering: the sender sees a reset / disconnect.
            request.transport.close()
            return web.Response(status=200)
        if isinstance(answer, web.StreamResponse):
            return answer
        return web.Response(status=answer, text="ok" if answer < 300 else "no")


@pytest.fixture
async def receiver_factory():
    runners = []

    async def make(behaviour=lambda number: 200) -> Receiver:
        receiver = Receiver(secret=generate_secret(), behaviour=behaviour)
        app = web.Application()
        app.router.add_post("/hook", receiver.handle)
        runner = web.AppRunner(app, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        receiver.url = f"http://127.0.0.1:{port}/hook"
        runners.append(runner)
        return receiver

    yield make
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
def keyring() -> Keyring:
    return Keyring({"k1": generate_at_rest_key()}, "k1")


def fast_environment(database_url: str, redis_url: str, keyring: Keyring, **overrides: str) -> dict[str, str]:
    environment = {
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "HOOKLEDGER_DEV": "1",
        "HOOKLEDGER_RETRY_SCHEDULE": "0,0.2,0.2",
        "HOOKLEDGER_LEASE_MS": "4000",
        "HOOKLEDGER_SEND_TIMEOUT_MS": "1000",
        "HOOKLEDGER_SEND_TIMEOUT_MS_MAX": "2000",
        "HOOKLEDGER_SWEEP_SECONDS": "1",
        "HOOKLEDGER_SHUTDOWN_GRACE_SECONDS": "2",
        "HOOKLEDGER_WORKER_POLL_MS": "10",  # the tests' retries are due within tenths of a second
        "HOOKLEDGER_SECRET_KEYS": format_keyring(keyring),
    }
    # CI's partitioned run sets HOOKLEDGER_ACCOUNT_SHARDS too: every worker and API of these tests
    # then claims, sweeps and group-commits shard by shard.
    for name in ("HOOKLEDGER_ACCOUNT_SHARDS", "HOOKLEDGER_ACCOUNT_SHARD_HASH"):
        if name in os.environ:
            environment[name] = os.environ[name]
    environment.update(overrides)
    return environment


@pytest.fixture
def settings(database_url: str, redis_url: str, keyring: Keyring) -> config.Settings:
    return config.load(fast_environment(database_url, redis_url, keyring))


async def add_account(pool, *, balance: int = 1000, price: int = PRICE) -> uuid.UUID:
    account = await accounts.create_account(pool, "engine test", price_per_delivery=price)
    if balance:
        await accounts.top_up(pool, account.id, f"order-{account.id}", balance)
    return account.id


async def add_endpoint(pool, account_id: uuid.UUID, receiver: Receiver, keyring: Keyring,
                       *, timeout_ms: int = 1000) -> uuid.UUID:
    endpoint_id = ids.new_id()
    ciphertext = encrypt_secret(receiver.secret, keyring, context=endpoint_secret_context(endpoint_id))
    await pool.execute(
        "INSERT INTO endpoints (id, account_id, url, secret, timeout_ms) VALUES ($1, $2, $3, $4, $5)",
        endpoint_id, account_id, receiver.url, ciphertext, timeout_ms,
    )
    return endpoint_id


@contextlib.asynccontextmanager
async def running_worker(settings: config.Settings, pool, redis_pool=None):
    """A real arq worker in this event loop, on the real Redis, sharing the test's pool (and the
    test's Redis client when given: the worker closes it)."""
    worker = build_worker(settings, settings.redis.url, handle_signals=False, pool=pool,
                          redis_pool=redis_pool or await job_queue.connect(settings.redis.url))
    task = asyncio.create_task(worker.async_run())
    try:
        yield worker
    finally:
        # Stopped as the worker process stops (arq's run(): the signal cancels the poll loop, then
        # close() runs). close() while the loop still polls closes the Redis pool under it, and under
        # load the loop went on to fail on that pool (close() had set it to None).
        await _cancel_until_done(task)
        try:
            await worker.close()
        finally:
            await worker_task_ended(task)


async def startup_crons_done(worker) -> None:
    """Wait until the crons a worker runs at startup (the sweep and the operational cron) have ended.

    Not the first job to end: the operational cron usually ends first, and a sweep still running
    claims in bulk the deliveries a test creates next, so their deliver jobs find nothing to claim."""
    startup = sum(1 for job in worker.cron_jobs if job.run_at_startup)
    await wait_for(lambda: asyncio.sleep(0, worker.jobs_complete + worker.jobs_failed >= startup
                                          and worker.job_counter == 0))


def stop_sweeping(worker) -> None:
    """No more sweeps from this worker: with HOOKLEDGER_SWEEP_SECONDS=60 one still runs at each
    minute's second 0, and claims every due delivery in bulk."""
    worker.cron_jobs = [job for job in worker.cron_jobs if job.name != "sweep"]


async def _cancel_until_done(task: asyncio.Task, seconds_max: float = 30) -> None:
    """Cancel the task until it has ended (a cancellation that lands as a library call ends can be
    lost, and the loop then goes on); fail if it has not ended within seconds_max."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds_max
    while not task.done():
        assert loop.time() < deadline, f"the worker's poll loop did not end within {seconds_max} s of its cancellation"
        task.cancel()
        await asyncio.wait([task], timeout=0.5)


async def worker_task_ended(task: asyncio.Task) -> None:
    """Wait for an in-process worker's task, cancelled at teardown. Cancellation is how it is meant to
    end; any exception it ended with (the worker crashed, mid-test or while closing) fails the test."""
    await asyncio.wait([task])
    if not task.cancelled() and task.exception() is not None:
        raise AssertionError(f"the worker ended with {task.exception()!r}") from task.exception()


@pytest.fixture
async def arq_queue(redis_url: str):
    redis = await job_queue.connect(redis_url)
    yield job_queue.Queue(redis)
    await redis.aclose()


async def wait_for(predicate, *, timeout_seconds: float = 20.0, interval_seconds: float = 0.05):
    """Poll an async predicate until it is truthy; fail the test with a clear message otherwise."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_seconds} s")
        await asyncio.sleep(interval_seconds)


async def states(pool, delivery_ids) -> dict:
    rows = await pool.fetch("SELECT id, state, dead_reason, attempt FROM deliveries WHERE id = ANY($1::uuid[])",
                            list(delivery_ids))
    return {row["id"]: row for row in rows}


async def all_finished(pool, delivery_ids) -> bool:
    found = await states(pool, delivery_ids)
    return len(found) == len(list(delivery_ids)) and all(r["state"] in ("delivered", "dead") for r in found.values())


async def keys_of(pool, delivery_ids) -> list:
    """The deliveries' keys (account_id, id), as queue jobs and claims take them, in the order given."""
    rows = await pool.fetch("SELECT account_id, id FROM deliveries WHERE id = ANY($1::uuid[])", list(delivery_ids))
    account_of = {row["id"]: row["account_id"] for row in rows}
    return [claims.DeliveryKey(account_of[delivery_id], delivery_id) for delivery_id in delivery_ids]


async def ledger_of(pool, delivery_id) -> dict[str, int]:
    rows = await pool.fetch("SELECT kind, amount FROM ledger_entries WHERE delivery_id = $1", delivery_id)
    return {row["kind"]: row["amount"] for row in rows}


async def create_logged_pool(database_url: str, on_query: Callable, *, size_max: int = 10) -> asyncpg.Pool:
    """A pool as billing.database.create_pool makes it (same session settings and statement cache),
    each connection handing every statement it sends, with its arguments, to `on_query` (asyncpg's
    LoggedQuery): what the server receives, for tests that check the statements themselves."""

    async def init(connection: asyncpg.Connection) -> None:
        connection.add_query_logger(on_query)

    return await asyncpg.create_pool(database_url, min_size=1, max_size=size_max, statement_cache_size=256,
                                     server_settings=SERVER_SETTINGS, init=init)
