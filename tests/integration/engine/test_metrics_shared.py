"""The workers' metrics reach the API's /metrics through Redis (delivery.engine.metrics_share): a real worker
delivers, dies and refunds; the real API app publishes what the worker's snapshot in Redis says.

The worker and the API share this process's metrics registry here, so every check that the numbers
came through Redis is made against Redis itself: nothing before a snapshot is written, the key's
own content, the sums of two processes' snapshots, and nothing again once the snapshot is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import msgspec
from aiohttp.test_utils import TestClient, TestServer
from arq.connections import ArqRedis
from prometheus_client.parser import text_string_to_metric_families

from billing.messages import MessageRequest, create_message
from delivery import metrics
from delivery.platform import config
from delivery.engine import metrics_share, queue as job_queue
from delivery.platform.web_app import create_app
from delivery.api.routes_ops import READY_TIMEOUT_SECONDS
from engine_helpers import keys_of, add_account, add_endpoint, all_finished, fast_environment, running_worker, wait_for

OPERATOR_KEY = "op_test_" + "m" * 40
SHARE_SECONDS = 1
WORKER_SERIES = ("hookledger_deliveries_total", "hookledger_delivery_attempts_total", "hookledger_refunds_total",
                 "hookledger_delivery_latency_seconds_count", "hookledger_delivery_latency_seconds_bucket",
                 "hookledger_worker_redis_reachable", "hookledger_audit_violations",
                 "hookledger_audit_notices", "hookledger_audit_last_run_timestamp_seconds")
# (sample name, labels) -> what this test's deliveries add to it
MOVES = {
    ("hookledger_delivery_attempts_total", (("status_class", "2xx"),)): 2,
    ("hookledger_delivery_attempts_total", (("status_class", "5xx"),)): 6,
    ("hookledger_deliveries_total", (("outcome", "delivered"),)): 2,
    ("hookledger_deliveries_total", (("outcome", "dead"),)): 4,
    ("hookledger_refunds_total", (("reason", "out_of_retries"),)): 2,
    ("hookledger_refunds_total", (("reason", "endpoint_disabled"),)): 2,
    ("hookledger_delivery_latency_seconds_count", ()): 2,
    ("hookledger_delivery_latency_seconds_bucket", (("le", "+Inf"),)): 2,
}


def _settings(database_url: str, redis_url: str, keyring) -> config.Settings:
    return config.load(fast_environment(
        database_url, redis_url, keyring, HOOKLEDGER_OPERATOR_KEY=OPERATOR_KEY, HOOKLEDGER_AUDIT_MINUTES="0",
        HOOKLEDGER_WORKER_METRICS_SHARE_SECONDS=str(SHARE_SECONDS)))


@contextlib.asynccontextmanager
async def _api(settings: config.Settings, pool, redis: ArqRedis | None = None):
    """The real API app on loopback, its queue on `redis` (the shared Redis when None)."""
    own = redis is None
    redis = await job_queue.connect(settings.redis.url) if own else redis
    try:
        app = create_app(settings, pool, job_queue.Queue(redis))
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            yield client
    finally:
        if own:
            await redis.aclose()


async def _scrape(client: TestClient) -> dict[tuple[str, tuple], float]:
    """/metrics parsed (so it is valid exposition): (sample name, sorted labels) -> value."""
    response = await client.get("/metrics")
    assert response.status == 200
    text = await response.text()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def _worker_samples(scraped: dict) -> dict:
    return {key: value for key, value in scraped.items() if key[0] in WORKER_SERIES}


def _local() -> dict[tuple[str, tuple], float]:
    """This process's own registry: what its worker counted."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for metric in metrics.WORKER_SUMMED for family in metric.collect() for sample in family.samples
            if not sample.name.endswith("_created")}


async def _deliver_some(pool, settings, keyring, receiver_factory, queue: job_queue.Queue) -> list:
    """Two messages to three endpoints: one answers 200, one 503 until the schedule ends, one is
    disabled before a worker sees them (call it before starting the worker: its sweep needs no
    wake-up). Their deliveries' ids, once enqueued."""
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, await receiver_factory(), keyring)
    await add_endpoint(pool, account_id, await receiver_factory(lambda number: 503), keyring)
    disabled = await add_endpoint(pool, account_id, await receiver_factory(), keyring)
    delivery_ids = []
    for number in range(2):
        created = await create_message(pool, MessageRequest(account_id, "order.paid", b'{"n": %d}' % number),
                                       attempts_max=settings.ledger.attempts_max)
        delivery_ids += [delivery.id for delivery in created.deliveries]
    assert len(delivery_ids) == 6
    await pool.execute("UPDATE endpoints SET enabled = false WHERE id = $1", disabled)
    await queue.wake(await keys_of(pool, delivery_ids))
    return delivery_ids


async def test_the_api_publishes_the_workers_counts_from_their_snapshots_in_redis(
        database_url, redis_url, pool, keyring, receiver_factory):
    """Deliveries by outcome, attempts by status class, the latency histogram and refunds by reason,
    counted in the worker, are on the API's /metrics as the worker's snapshot in Redis has them; the
    API publishes none of the worker-side series from its own registry (no zero gauges)."""
    settings = _settings(database_url, redis_url, keyring)
    redis = await job_queue.connect(redis_url)
    key = metrics_share.KEY_PREFIX + metrics_share.process_name()
    try:
        async with _api(settings, pool) as client:
            before = await _scrape(client)
            # No worker has written a snapshot yet: no worker-side samples at all (the old /metrics
            # printed this process's registry: hookledger_worker_redis_reachable 0.0 and the like).
            assert _worker_samples(before) == {}
            assert before[("hookledger_workers_reporting", ())] == 0
            assert before[("hookledger_queue_depth", ())] == 0  # the API's own series are there
            baseline = _local()
            expected = {series: baseline.get(series, 0.0) + moved for series, moved in MOVES.items()}

            last: dict = {}

            async def shown() -> bool:
                last.update(await _scrape(client))
                return all(last.get(series) == value for series, value in expected.items())

            delivery_ids = await _deliver_some(pool, settings, keyring, receiver_factory, job_queue.Queue(redis))
            async with running_worker(settings, pool):
                await wait_for(lambda: all_finished(pool, delivery_ids))
                with contextlib.suppress(AssertionError):  # a periodic snapshot, while it runs
                    await wait_for(shown, timeout_seconds=5 * SHARE_SECONDS + 5)
                assert {series: last.get(series) for series in expected} == expected, (baseline, _local())
                assert 0 < await redis.pttl(key) <= metrics_share.EXPIRY_PERIODS * SHARE_SECONDS * 1000
            # Stopped: its last snapshot stays until it expires.
            local = _local()
            assert all(local[series] == value for series, value in expected.items())  # nothing counted twice
            snapshot = msgspec.json.decode(await redis.get(key), type=metrics_share.Snapshot)
            assert snapshot.process == metrics_share.process_name()
            scraped = await _scrape(client)
            assert {series: scraped[series] for series in local} == local
            assert scraped[("hookledger_delivery_latency_seconds_sum", ())] == local[
                ("hookledger_delivery_latency_seconds_sum", ())] > 0
            assert scraped[("hookledger_worker_redis_reachable", (("worker", snapshot.process),))] == 1
            assert ("hookledger_worker_redis_reachable", ()) not in scraped
            assert scraped[("hookledger_workers_reporting", ())] == 1

            # The numbers were Redis's: without the snapshot, the API has none again, and the index forgets it.
            await redis.delete(key)
            assert _worker_samples(await _scrape(client)) == {}
            assert await redis.smembers(metrics_share.INDEX) == set()
    finally:
        await redis.aclose()


async def test_the_api_sums_the_live_workers_and_summarizes_their_gauges(
        database_url, redis_url, pool, keyring, receiver_factory):
    """Two worker processes' snapshots: counters and histogram summed, Redis reachability per worker,
    the audit gauges of the latest audit; an expired worker leaves the sums."""
    settings = _settings(database_url, redis_url, keyring)
    redis = await job_queue.connect(redis_url)
    try:
        delivery_ids = await _deliver_some(pool, settings, keyring, receiver_factory, job_queue.Queue(redis))
        async with running_worker(settings, pool):
            await wait_for(lambda: all_finished(pool, delivery_ids))
        ours = msgspec.json.decode(await redis.get(metrics_share.KEY_PREFIX + metrics_share.process_name()),
                                   type=metrics_share.Snapshot)
        # Another worker process's snapshot: the same counts, Redis unreachable, a later audit.
        audit_at = time.time()
        theirs = msgspec.structs.replace(ours, process="elsewhere:7:abc", families={
            **ours.families,
            "hookledger_worker_redis_reachable": [("hookledger_worker_redis_reachable", {}, 0.0)],
            "hookledger_audit_violations": [("hookledger_audit_violations", {}, 3.0)],
            "hookledger_audit_notices": [("hookledger_audit_notices", {}, 2.0)],
            "hookledger_audit_last_run_timestamp_seconds": [
                ("hookledger_audit_last_run_timestamp_seconds", {}, audit_at)],
        })
        ours = msgspec.structs.replace(ours, families={
            **ours.families,
            "hookledger_audit_violations": [("hookledger_audit_violations", {}, 0.0)],
            "hookledger_audit_notices": [("hookledger_audit_notices", {}, 1.0)],
            "hookledger_audit_last_run_timestamp_seconds": [
                ("hookledger_audit_last_run_timestamp_seconds", {}, audit_at - 600)],
        })
        for snapshot in (ours, theirs):
            await redis.set(metrics_share.KEY_PREFIX + snapshot.process, msgspec.json.encode(snapshot), px=60_000)
            await redis.sadd(metrics_share.INDEX, snapshot.process)
        summed = {metric.describe()[0].name for metric in metrics.WORKER_SUMMED}
        one = {(name, tuple(sorted(labels.items()))): value
               for family, samples in ours.families.items() if family in summed for name, labels, value in samples}
        async with _api(settings, pool) as client:
            scraped = await _scrape(client)
            assert {series: scraped[series] for series in one} == {series: 2 * value for series, value in one.items()}
            assert scraped[("hookledger_worker_redis_reachable", (("worker", ours.process),))] == 1
            assert scraped[("hookledger_worker_redis_reachable", (("worker", "elsewhere:7:abc"),))] == 0
            assert scraped[("hookledger_audit_last_run_timestamp_seconds", ())] == audit_at
            assert scraped[("hookledger_audit_violations", ())] == 3
            assert scraped[("hookledger_audit_notices", ())] == 2
            assert scraped[("hookledger_workers_reporting", ())] == 2

            await redis.pexpire(metrics_share.KEY_PREFIX + "elsewhere:7:abc", 1)
            await wait_for(lambda: _expired(redis, metrics_share.KEY_PREFIX + "elsewhere:7:abc"))
            scraped = await _scrape(client)
            assert {series: scraped[series] for series in one} == one
            assert scraped[("hookledger_audit_violations", ())] == 0
            assert scraped[("hookledger_audit_notices", ())] == 1
            assert scraped[("hookledger_workers_reporting", ())] == 1
            assert await redis.smembers(metrics_share.INDEX) == {ours.process.encode()}
    finally:
        await redis.aclose()


async def _expired(redis, key: str) -> bool:
    return await redis.pttl(key) == -2  # Redis says the key is gone


# A scrape against a Redis that never answers must end: its reads give up after READY_TIMEOUT_SECONDS
# (2 s), and this leaves a loaded machine 20 s more. Without the timeout it would wait forever (the
# client below has no command timeout of its own).
SCRAPE_SECONDS_MAX = READY_TIMEOUT_SECONDS + 20


async def test_metrics_answer_with_the_apis_own_series_when_redis_is_unreachable(
        database_url, redis_url, pool, keyring):
    """Redis refusing, or accepting and never answering: /metrics is still 200 with the API's own series,
    its read of Redis given up after the readiness timeout (SCRAPE_SECONDS_MAX), the workers' families
    without samples."""
    settings = _settings(database_url, redis_url, keyring)

    async def silent(reader, writer):  # takes the connection, never answers
        await reader.read()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    silent_port = server.sockets[0].getsockname()[1]
    try:
        for port in (1, silent_port):
            unreachable = ArqRedis(host="127.0.0.1", port=port, socket_connect_timeout=0.2)
            try:
                async with _api(settings, pool, unreachable) as client:
                    response = await asyncio.wait_for(client.get("/metrics"), SCRAPE_SECONDS_MAX)
                    text = await response.text()
                assert response.status == 200
                assert "hookledger_queue_depth 0.0" in text
                assert "# TYPE hookledger_deliveries_total counter" in text
                scraped = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
                assert not scraped & set(WORKER_SERIES) and "hookledger_workers_reporting" not in scraped
            finally:
                await unreachable.aclose()
    finally:
        server.close()
