#!/usr/bin/env python3
"""Delivery benchmark: drain rate of real workers beside the raw ceiling and a naive baseline.

In one run, on a fresh database (created on DATABASE_URL's server, or an embedded one; dropped at
the end) and a dedicated Redis database number (flushed before and after):

1. ceiling: a plain aiohttp client (one ClientSession, the worker's connection concurrency, the
   same body size and headers) against the receiver. Nothing can deliver faster than this.
2. drain: N deliveries created with `create_messages` and woken with `Queue.wake` (what the API
   does after commit), then `python -m delivery worker` started (1, then 2 processes); rate from
   the first to the last arrival at the receiver, and from worker start.
3. latency: deliveries offered at --rate per second for --seconds while one worker runs; p50/p99
   from the create's commit to arrival at the receiver. Then the same load sent as
   POST /v1/messages to a real `hookledger api` process: p50/p99 from each 202 to arrival (what an
   app sees: the API's group commit and its wake-up of the worker included).
   With --throttled-deliveries, each drain runs again beside that many deliveries of one more
   endpoint limited to --throttle-rate per second (rate_limit_per_second): the unthrottled
   deliveries' rate beside the plain drain's, and the most the throttled endpoint received in any
   second of the receiver's clock.
4. naive: one arq job per delivery, one transaction per step (claim, load, record each its own),
   a new ClientSession per send (`--naive-worker`, a subprocess), on a smaller N.

With `--tracing off,1%,100%` it measures the cost of tracing instead: for each mode, in the order
given and then reversed (so a drift of the shared machine's speed falls on every mode alike), a
drain of --deliveries by one worker, with tracing off, or on and exporting over OTLP/HTTP to a
loopback collector that discards (scripts/otlp_sink.py); that share of the messages carries a
sampled trace context, as the API stores one for the requests it samples. It prints each mode's
rate and the worker's CPU per 1,000 deliveries as ratios of the first mode's.

With `--sender-clients aiohttp,wire` it compares the sender's HTTP clients the same way: a drain by
one worker per client (HOOKLEDGER_SENDER_CLIENT), in the order given and then reversed, with the
ceiling measured before the first drain and after each; each client's rate, its share of the
ceiling beside it and the worker's CPU per 1,000 deliveries, as ratios of the first client's.

With `--custom-headers` it measures the cost of endpoints' custom headers the same way: a drain by
one worker with every endpoint carrying none, then three (CUSTOM_HEADERS: sent on every request and
recorded on every attempt, delivery_attempts.sent_headers), then the two again in reverse order;
each run's rate and worker CPU per 1,000 deliveries as ratios of the run without headers.

Every engine feature stays on: encrypted secrets and signing, fencing, the pre-send check, the
batched record, the SSRF guard (loopback allowed by HOOKLEDGER_DEV=1). The receiver is its own
process (`--serve-receiver`); it counts requests, records each webhook-id's arrival time and
verifies the signature of the first requests of every phase. Several endpoints share the one
receiver so that the per-endpoint concurrency bound is not what limits. The ceiling's client, the
workers and the naive worker run on one event loop (`--event-loop`, by default the platform's:
uvloop where installed); the receiver, the same in every run, on asyncio's. Beside each run's rates
it prints the CPU each process spent per 1,000 deliveries, and the share of the ceiling that the
CPU PostgreSQL and Redis spent leaves room for.

With `--answer-ms 50` the receiver answers each request that long after it arrived, as a real
receiver across a network does, and each endpoint has a loopback address of its own (127.0.0.2,
127.0.0.3, ...: one host each, as customers' endpoints are). A drain is then bound by the
connections each worker may hold open in all (HOOKLEDGER_SENDER_CONNECTIONS, as the ceiling's one
client is), not by the cores: it shows what a second worker adds when the machine is not the
limit. Arrival times are still taken on arrival.

    .venv/bin/python scripts/bench_delivery.py [--deliveries 20000] [--naive-deliveries 2000]
        [--workers 1,2] [--endpoints 24] [--rate 500] [--seconds 10] [--body-bytes 512] [--event-loop auto]
        [--tracing off,1%,100%] [--custom-headers] [--sender-clients aiohttp,wire]
        [--throttled-deliveries 0] [--throttle-rate 50] [--partitions 1,8] [--answer-ms 0]

With `--partitions 1,8` the runs above (ceiling, drains, latency, naive) are made once per count, in
the order given, each on a fresh database migrated with HOOKLEDGER_ACCOUNT_PARTITIONS set to the
count (1: unset; the account-scoped tables hash-partitioned by account_id), and each run's figures
are then set beside the first count's as ratios; a drain's also as its share of the ceiling beside
it, which leaves out a drift of the shared machine's speed between the counts.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
from aiohttp import web

from billing import accounts, ids
from billing.database import create_pool
from billing.messages import MessageRequest, create_messages
from delivery import event_loop
from delivery.engine import claims
from delivery.platform import config
from delivery.engine import presend, queue as job_queue
from delivery.platform import services
from delivery.api import api_keys
from delivery.engine.results import AttemptResult, record_results
from delivery.engine.sender import CLIENTS as SENDER_CLIENTS, SESSION_HEADERS, Sender, SendRequest
from delivery.store.signer_cache import SignerCache, endpoint_secret_context
import cpu_shares  # scripts/, beside this file
import otlp_sink  # scripts/, beside this file
from bench_ingest import free_port, stop_servers, wait_ready  # scripts/, beside this file
from scratch_database import (  # scripts/, beside this file
    add_partitions_argument, add_redis_db_argument, ratio, run_per_partition_count, scratch_database, scratch_redis)
from signing import Keyring, encrypt_secret, format_keyring, generate_at_rest_key, generate_secret, parse_keyring, verify

ROOT = Path(__file__).resolve().parents[1]
NAIVE_QUEUE = "hookledger:bench-naive"
NAIVE_JOBS_MAX = 64
CREATE_BATCH_MAX = 1000
VERIFIED_PER_PHASE = 200  # the receiver checks the signature of this many requests per phase
PHASE_TIMEOUT_SECONDS = 600


# ---------------------------------------------------------------------------------------------
# The receiver (its own process): answers 200, records arrivals.

class ReceiverState:
    def __init__(self, secret: str, answer_seconds: float = 0.0) -> None:
        self.secret = secret
        self.answer_seconds = answer_seconds
        self.reset(0)

    def reset(self, verify_count: int) -> None:
        self.requests = 0
        self.arrivals: dict[str, float] = {}
        self.first = self.last = 0.0
        self.verify_left = verify_count
        self.verified = self.invalid = 0


async def _receive(request: web.Request) -> web.Response:
    state: ReceiverState = request.app["state"]
    body = await request.read()
    now = time.time()
    state.requests += 1
    state.first = state.first or now
    state.last = now
    state.arrivals.setdefault(request.headers.get("webhook-id", ""), now)
    if state.verify_left > 0:
        state.verify_left -= 1
        try:
            verify(request.headers, body, state.secret)
            state.verified += 1
        except Exception:  # noqa: BLE001 - counted and reported, not raised
            state.invalid += 1
    if state.answer_seconds:
        await asyncio.sleep(state.answer_seconds)
    return web.Response(text="ok")


async def _stats(request: web.Request) -> web.Response:
    state: ReceiverState = request.app["state"]
    return web.json_response({"requests": state.requests, "distinct": len(state.arrivals), "first": state.first,
                              "last": state.last, "verified": state.verified, "invalid": state.invalid})


async def _arrivals(request: web.Request) -> web.Response:
    return web.json_response(request.app["state"].arrivals)


async def _reset(request: web.Request) -> web.Response:
    request.app["state"].reset(int(request.query.get("verify", "0")))
    return web.json_response({})


async def serve_receiver(port: int) -> None:
    app = web.Application()
    app["state"] = ReceiverState(os.environ["BENCH_SECRET"], int(os.environ.get("BENCH_ANSWER_MS", "0")) / 1000)
    app.router.add_post("/hook/{endpoint}", _receive)
    app.router.add_get("/stats", _stats)
    app.router.add_get("/arrivals", _arrivals)
    app.router.add_post("/reset", _reset)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    port = runner.addresses[0][1]
    for number in range(int(os.environ.get("BENCH_HOSTS", "0"))):  # the same port on endpoint hosts of their own
        await web.TCPSite(runner, _endpoint_host(number), port, backlog=1024).start()
    print(port, flush=True)
    await asyncio.Event().wait()


# ---------------------------------------------------------------------------------------------
# The naive worker (its own process): one job per delivery, one transaction per step.

async def naive_deliver(ctx: dict, account_id: str, delivery_id: str) -> int:
    settings: config.Settings = ctx["settings"]
    pool = ctx["pool"]
    key = claims.DeliveryKey(uuid.UUID(account_id), uuid.UUID(delivery_id))
    claimed = await claims.claim_ids(pool, [key], lease_ms=settings.worker.engine.lease_ms)
    outgoing, _ = await presend.load_for_send(pool, claimed)
    for item in outgoing:
        signer = ctx["signers"].signer(item.claimed.endpoint_id, item.secret, item.previous_secret)
        headers = signer.headers(delivery_id, int(time.time()), item.payload)
        async with Sender(settings.worker.sender) as sender:  # a new ClientSession per send
            sent = await sender.send(SendRequest(delivery_id, item.claimed.attempt, item.url, item.payload, headers,
                                                 item.timeout_ms, str(item.claimed.endpoint_id)))
        await record_results(pool, [AttemptResult(
            item.claimed.id, item.claimed.attempt, item.claimed.account_id, sent.success, sent.latency_ms,
            sent.status_code, sent.error, sent.response_excerpt or None, 0.0 if sent.success else 1.0)])
    return len(outgoing)


async def _naive_startup(ctx: dict) -> None:
    settings: config.Settings = ctx["settings"]
    ctx["pool"] = await create_pool(settings.database.url, size_min=2, size_max=settings.database.pool_size_max)
    ctx["signers"] = SignerCache(parse_keyring(settings.secret_keyring))


async def _naive_shutdown(ctx: dict) -> None:
    await ctx["pool"].close()


def run_naive_worker() -> None:
    from arq import Worker, func

    settings = config.load()
    asyncio.set_event_loop(event_loop.new_event_loop(settings.event_loop))
    Worker(
        functions=[func(naive_deliver, name="naive_deliver", max_tries=1)],
        redis_settings=job_queue.redis_settings(settings.redis.url), queue_name=NAIVE_QUEUE,
        job_serializer=job_queue.serialize, job_deserializer=job_queue.deserialize,
        on_startup=_naive_startup, on_shutdown=_naive_shutdown, ctx={"settings": settings},
        max_jobs=NAIVE_JOBS_MAX, keep_result=0, poll_delay=0.05, log_results=False,
    ).run()


# ---------------------------------------------------------------------------------------------
# The orchestrator.

class Bench:
    def __init__(self, arguments, database_url: str, redis_url: str, keyring: Keyring, secret: str) -> None:
        self.arguments = arguments
        self.database_url = database_url
        self.redis_url = redis_url
        self.keyring = keyring
        self.secret = secret
        self.body = _body(arguments.body_bytes)
        self.logs: list[str] = []
        self.receiver_pid = 0
        self.throttled_endpoint: uuid.UUID | None = None

    def environment(self) -> dict[str, str]:
        return {**otlp_sink.without_tracing(dict(os.environ)), "DATABASE_URL": self.database_url, "REDIS_URL": self.redis_url, "HOOKLEDGER_DEV": "1",
                "HOOKLEDGER_SECRET_KEYS": format_keyring(self.keyring), "PYTHONUNBUFFERED": "1",
                "HOOKLEDGER_EVENT_LOOP": self.arguments.event_loop}

    def start(self, *extra: str, command: str | None = None, environment: dict[str, str] | None = None) -> subprocess.Popen:
        """`python -m delivery <command>` (worker, api), or this script with extra arguments."""
        log = tempfile.NamedTemporaryFile(prefix="bench-delivery-", suffix=".log", delete=False)
        self.logs.append(log.name)
        argv = [sys.executable, "-m", "delivery", command] if command else [sys.executable, __file__, *extra]
        return subprocess.Popen(argv, cwd=ROOT, env={**self.environment(), **(environment or {})}, stdout=log,
                                stderr=subprocess.STDOUT)

    async def setup(self, receiver_port: int) -> None:
        self.pool = await create_pool(self.database_url, size_min=2, size_max=8)
        self.redis = await job_queue.connect(self.redis_url)
        self.queue = job_queue.Queue(self.redis)
        self.http = aiohttp.ClientSession()
        self.receiver = f"http://127.0.0.1:{receiver_port}"
        self.receiver_port = receiver_port
        account = await accounts.create_account(self.pool, "bench", price_per_delivery=1)
        await accounts.top_up(self.pool, account.id, f"bench-{account.id}", 10**12)
        self.account_id = account.id
        for number in range(self.arguments.endpoints):
            endpoint_id = ids.new_id()
            ciphertext = encrypt_secret(self.secret, self.keyring, context=endpoint_secret_context(endpoint_id))
            await self.pool.execute(
                "INSERT INTO endpoints (id, account_id, url, secret, timeout_ms, event_types) VALUES ($1, $2, $3, $4, 15000, $5)",
                endpoint_id, account.id, self.endpoint_url(number), ciphertext, [f"bench.{number}"])
        self.created = 0

    def endpoint_url(self, number: int) -> str:
        """Endpoint `number`'s URL: on the receiver's address, or with --answer-ms on a host of its own."""
        if self.arguments.answer_ms:
            return f"http://{_endpoint_host(number)}:{self.receiver_port}/hook/{number}"
        return f"{self.receiver}/hook/{number}"

    async def close(self) -> None:
        await self.http.close()
        await self.redis.aclose()
        await self.pool.close()

    def keys(self, delivery_ids: list[uuid.UUID]) -> list[tuple[uuid.UUID, uuid.UUID]]:
        """The deliveries' (account, id) keys, as queue jobs carry them: every delivery here is the one account's."""
        return [(self.account_id, delivery_id) for delivery_id in delivery_ids]

    async def create(self, count: int, traced_share: float = 0.0) -> list[uuid.UUID]:
        """Create count deliveries (fan-out 1, endpoints in turn); ids in creation order. That share
        of the messages carries a sampled W3C trace context, as the API stores for a sampled request."""
        made: list[uuid.UUID] = []
        while len(made) < count:
            batch = min(CREATE_BATCH_MAX, count - len(made))
            requests = [MessageRequest(self.account_id, f"bench.{(self.created + n) % self.arguments.endpoints}", self.body,
                                       trace_context=_trace_context() if random.random() < traced_share else None)
                        for n in range(batch)]
            self.created += batch
            results = await create_messages(self.pool, requests, attempts_max=8)
            made.extend(d.id for created in results for d in created.deliveries)
        return made

    async def steady_state(self) -> None:
        """Planner statistics as autovacuum keeps them in a running system (it analyzes a table once
        a tenth of it changed, within a minute). A bench database made seconds ago has none, and
        PostgreSQL then plans the claim as a scan of the whole due index."""
        await self.pool.execute("ANALYZE")

    async def reset_receiver(self, verify_count: int) -> None:
        async with self.http.post(f"{self.receiver}/reset", params={"verify": str(verify_count)}) as response:
            response.raise_for_status()

    async def receiver_stats(self) -> dict:
        async with self.http.get(f"{self.receiver}/stats") as response:
            return await response.json()

    async def wait_for_arrivals(self, count: int, timeout_seconds: float = PHASE_TIMEOUT_SECONDS,
                                processes: list[subprocess.Popen] = ()) -> dict:
        """Poll the receiver until count deliveries arrived. With processes, also the CPU time per
        1000 deliveries of them, the receiver, PostgreSQL and Redis from the first arrival on (so
        start-up is not counted)."""
        deadline = time.monotonic() + timeout_seconds
        start = None
        roles = {"workers": [process.pid for process in processes], "receiver": [self.receiver_pid]}
        while True:
            stats = await self.receiver_stats()
            if processes and start is None and stats["distinct"] > 0:
                start = (cpu_shares.snapshot(roles), stats["distinct"])
            if stats["distinct"] >= count or time.monotonic() > deadline:
                if start is not None and stats["distinct"] > start[1]:
                    shares = cpu_shares.per_thousand(start[0], cpu_shares.snapshot(roles), stats["distinct"] - start[1])
                    stats["cpu_shares"] = shares
                    stats["cpu_ms_per_1000"] = shares["workers"]
                return stats
            await asyncio.sleep(0.1)

    async def ceiling(self, count: int, concurrency: int) -> dict:
        """The same receiver, driven by a plain aiohttp client: one session, no database, no signing.

        Its requests have the shape of the worker's (the same headers, values of the same length),
        so the receiver does the same work for each; the signature is made once, not per request.
        """
        await self.reset_receiver(0)
        pending = iter(range(count))
        connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
        signature = "v1," + base64.b64encode(b"\0" * 32).decode()
        timestamp = str(int(time.time()))
        async with aiohttp.ClientSession(connector=connector, headers=SESSION_HEADERS) as session:
            async def client() -> None:
                for number in pending:
                    headers = {"webhook-id": str(uuid.UUID(int=number)), "webhook-timestamp": timestamp,
                               "webhook-signature": signature}
                    async with session.post(self.endpoint_url(number % self.arguments.endpoints),
                                            data=self.body, headers=headers) as response:
                        await response.read()
            roles = {"receiver": [self.receiver_pid]}
            started, cpu_started = time.time(), cpu_shares.snapshot(roles)
            await asyncio.gather(*(client() for _ in range(concurrency)))
            shares = cpu_shares.per_thousand(cpu_started, cpu_shares.snapshot(roles), count)
        stats = await self.wait_for_arrivals(count, 10)
        return {**_rates(stats, count, started), "cpu_ms_per_1000": shares["bench"], "cpu_shares": shares}

    async def drain(self, count: int, workers: int, environment: dict[str, str] | None = None,
                    traced_share: float = 0.0) -> dict:
        """Create count deliveries, then start the workers (with `environment` added to theirs: the
        OTEL_* variables that turn tracing on, or the sender's client) and time them from the first
        arrival to the last."""
        await self.reset_receiver(VERIFIED_PER_PHASE)
        delivery_ids = await self.create(count, traced_share)
        await self.steady_state()
        await self.queue.wake(self.keys(delivery_ids))  # what the API does right after the commit
        started = time.time()
        processes = [self.start(command="worker", environment=environment) for _ in range(workers)]
        try:
            stats = await self.wait_for_arrivals(count, processes=processes)
        finally:
            stop_servers(processes)
        return {**_rates(stats, count, started), **await self.check(delivery_ids, stats),
                "cpu_ms_per_1000": stats.get("cpu_ms_per_1000", float("nan")), "cpu_shares": stats.get("cpu_shares", {})}

    async def drain_beside_throttled(self, count: int, workers: int, throttled: int, rate_limit: int) -> dict:
        """The drain again, with `throttled` deliveries of one more endpoint limited to rate_limit per
        second created first (so they are the oldest due): the unthrottled ones' rate, first to last
        arrival, and the most of the throttled ones that arrived in any second."""
        await self.reset_receiver(VERIFIED_PER_PHASE)
        if self.throttled_endpoint is None:
            self.throttled_endpoint = ids.new_id()
            ciphertext = encrypt_secret(self.secret, self.keyring, context=endpoint_secret_context(self.throttled_endpoint))
            await self.pool.execute(
                "INSERT INTO endpoints (id, account_id, url, secret, timeout_ms, event_types, rate_limit_per_second)"
                " VALUES ($1, $2, $3, $4, 15000, $5, $6)", self.throttled_endpoint, self.account_id,
                f"{self.receiver}/hook/throttled", ciphertext, ["bench.throttled"], rate_limit)
        throttled_ids = []
        while len(throttled_ids) < throttled:
            requests = [MessageRequest(self.account_id, "bench.throttled", self.body)
                        for _ in range(min(CREATE_BATCH_MAX, throttled - len(throttled_ids)))]
            throttled_ids += [d.id for created in await create_messages(self.pool, requests, attempts_max=8)
                              for d in created.deliveries]
        delivery_ids = await self.create(count)
        await self.steady_state()
        await self.queue.wake(self.keys(throttled_ids))
        await self.queue.wake(self.keys(delivery_ids))
        started = time.time()
        processes = [self.start(command="worker") for _ in range(workers)]
        deadline = time.monotonic() + PHASE_TIMEOUT_SECONDS
        try:
            stats = await self.wait_for_arrivals(count, processes=processes)
            wanted = {str(delivery_id) for delivery_id in delivery_ids}
            while True:
                async with self.http.get(f"{self.receiver}/arrivals") as response:
                    arrivals = await response.json()
                if wanted <= arrivals.keys() or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
        finally:
            stop_servers(processes)
            # The throttled backlog left is parked (a scratch database) so that the next drain is plain.
            await self.pool.execute("UPDATE deliveries SET next_attempt_at = now() + interval '1 day'"
                                    " WHERE endpoint_id = $1 AND state = 'pending'", self.throttled_endpoint)
        times = [arrivals[key] for key in wanted if key in arrivals]
        throttled_times = sorted(arrivals[str(key)] for key in throttled_ids if str(key) in arrivals)
        span = max(max(times) - min(times), 1e-9) if times else 1e-9
        most = max((bisect.bisect_left(throttled_times, start + 1.0) - index
                    for index, start in enumerate(throttled_times)), default=0)
        return {"arrived": len(times), "rate": len(times) / span, "wall_rate": len(times) / max(max(times, default=started) - started, 1e-9),
                "throttled_arrived": len(throttled_times), "throttled_most_in_a_second": most,
                "delivered": await self.pool.fetchval("SELECT count(*) FROM deliveries WHERE id = ANY($1::uuid[])"
                                                      " AND state = 'delivered'", delivery_ids),
                "cpu_ms_per_1000": stats.get("cpu_ms_per_1000", float("nan")), "cpu_shares": stats.get("cpu_shares", {})}

    async def latency(self, rate: float, seconds: float) -> dict:
        process = self.start(command="worker")
        try:
            await self.reset_receiver(VERIFIED_PER_PHASE)
            warm = await self.create(50)
            await self.queue.wake(self.keys(warm))
            await self.wait_for_arrivals(len(warm), 60)
            await self.reset_receiver(VERIFIED_PER_PHASE)
            committed: dict[str, float] = {}
            wakes = []
            started = time.monotonic()
            while (elapsed := time.monotonic() - started) < seconds:
                due = int(elapsed * rate) - len(committed)
                if due > 0:
                    made = await self.create(due)
                    now = time.time()
                    committed.update((str(delivery_id), now) for delivery_id in made)
                    wakes.append(asyncio.create_task(self.queue.wake(self.keys(made))))
                await asyncio.sleep(0.01)
            offered = len(committed) / (time.monotonic() - started)
            await asyncio.gather(*wakes)
            return await self._latencies(committed, offered)
        finally:
            stop_servers([process])

    async def _latencies(self, sent: dict[str, float], offered: float) -> dict:
        """Wait until every delivery in `sent` (id -> time.time() it counts from) arrived; p50/p99/max to arrival."""
        stats = await self.wait_for_arrivals(len(sent), 120)
        async with self.http.get(f"{self.receiver}/arrivals") as response:
            arrivals = await response.json()
        latencies = sorted((arrivals[key] - value) * 1000 for key, value in sent.items() if key in arrivals)
        return {"offered": offered, "count": len(sent), "arrived": len(latencies),
                "p50_ms": _percentile(latencies, 0.50), "p99_ms": _percentile(latencies, 0.99),
                "max_ms": latencies[-1] if latencies else float("nan"), "verified": stats["verified"],
                "invalid": stats["invalid"]}

    async def latency_through_api(self, rate: float, seconds: float) -> dict:
        """The latency run's load sent as POST /v1/messages to a real API process, one worker behind it."""
        port = free_port()
        key = (await api_keys.create_key(self.pool, self.account_id)).key
        api = self.start(command="api", environment={"HOOKLEDGER_API_PORT": str(port), "HOOKLEDGER_LOG_LEVEL": "warning",
                                                     "HOOKLEDGER_OPERATOR_KEY": "op_bench_" + "d" * 32})
        worker = self.start(command="worker")
        url, headers = f"http://127.0.0.1:{port}/v1/messages", {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        accepted: dict[str, float] = {}
        refused: list[int] = []

        async def post(number: int) -> None:
            body = b'{"event_type":"bench.%d","payload":%s}' % (number % self.arguments.endpoints, self.body)
            async with self.http.post(url, data=body, headers=headers) as response:
                if response.status != 202:
                    refused.append(response.status)
                    return
                now = time.time()
                accepted.update((delivery["id"], now) for delivery in (await response.json())["deliveries"])

        try:
            await wait_ready(f"http://127.0.0.1:{port}/readyz", api)
            await self.reset_receiver(VERIFIED_PER_PHASE)
            await asyncio.gather(*(post(number) for number in range(50)))  # warm up the API and the worker
            await self.wait_for_arrivals(len(accepted), 60)
            await self.reset_receiver(VERIFIED_PER_PHASE)
            accepted.clear()
            posts: list[asyncio.Task] = []
            started = time.monotonic()
            while (elapsed := time.monotonic() - started) < seconds:
                for _ in range(int(elapsed * rate) - len(posts)):
                    posts.append(asyncio.create_task(post(len(posts))))
                await asyncio.sleep(0.002)
            offered = len(posts) / (time.monotonic() - started)
            await asyncio.gather(*posts)
            return {**await self._latencies(accepted, offered), "refused": len(refused)}
        finally:
            stop_servers([worker, api])

    async def naive(self, count: int) -> dict:
        await self.reset_receiver(VERIFIED_PER_PHASE)
        delivery_ids = await self.create(count)
        await self.steady_state()
        for delivery_id in delivery_ids:  # one job per delivery
            await self.redis.enqueue_job("naive_deliver", str(self.account_id), str(delivery_id), _queue_name=NAIVE_QUEUE,
                                         _job_id=uuid.uuid4().hex)
        started = time.time()
        process = self.start("--naive-worker")
        try:
            stats = await self.wait_for_arrivals(count, processes=[process])
        finally:
            stop_servers([process])
        return {**_rates(stats, count, started), **await self.check(delivery_ids, stats),
                "cpu_ms_per_1000": stats.get("cpu_ms_per_1000", float("nan")), "cpu_shares": stats.get("cpu_shares", {})}

    async def check(self, delivery_ids: list[uuid.UUID], stats: dict) -> dict:
        delivered = await self.pool.fetchval(
            "SELECT count(*) FROM deliveries WHERE id = ANY($1::uuid[]) AND state = 'delivered'", delivery_ids)
        return {"delivered": delivered, "duplicates": stats["requests"] - stats["distinct"],
                "verified": stats["verified"], "invalid": stats["invalid"]}


def _trace_context() -> str:
    """A sampled W3C traceparent of a trace of its own."""
    return f"00-{random.getrandbits(128):032x}-{random.getrandbits(64) or 1:016x}-01"


async def measure_tracing(bench: Bench, arguments) -> dict:
    """The cost of tracing: a drain by one worker per mode, the modes in order and then reversed."""
    modes = arguments.tracing
    sink = subprocess.Popen([sys.executable, str(Path(__file__).with_name("otlp_sink.py"))], stdout=subprocess.PIPE)
    try:
        port = int(sink.stdout.readline())
        runs: dict[str, list[dict]] = {mode: [] for mode in modes}
        for mode in [*modes, *reversed(modes)]:
            share = otlp_sink.ratio(mode)
            drain = await bench.drain(arguments.deliveries, 1, otlp_sink.environment(mode, port), share or 0.0)
            runs[mode].append(drain)
            print(f"  tracing {mode:5}  {drain['rate']:7.0f} deliveries/s  worker CPU {drain['cpu_ms_per_1000']:.0f} ms"
                  f" per 1,000  delivered {drain['delivered']}/{drain['arrived']}", flush=True)
    finally:
        stop_servers([sink])
    base = runs[modes[0]]
    base_rate = statistics.mean(run["rate"] for run in base)
    base_cpu = statistics.mean(run["cpu_ms_per_1000"] for run in base)
    ratios = []
    print(f"the cost of tracing, a drain of {arguments.deliveries} deliveries by one worker, each mode twice:")
    for mode in modes:
        rate = statistics.mean(run["rate"] for run in runs[mode])
        cpu = statistics.mean(run["cpu_ms_per_1000"] for run in runs[mode])
        ratios.append({"mode": mode, "rate": rate, "rate_ratio": rate / base_rate, "worker_cpu_ms_per_1000": cpu,
                       "cpu_ratio": cpu / base_cpu})
        print(f"  tracing {mode:5}  {rate:7.0f} deliveries/s  rate x{rate / base_rate:.3f} of {modes[0]}'s;"
              f" worker CPU {cpu:.0f} ms per 1,000 deliveries, x{cpu / base_cpu:.3f}")
    return {"modes": modes, "runs": runs, "ratios": ratios}


# What each endpoint carries in the with-headers runs of --custom-headers: a size that custom headers
# typically have (a tenant name, a gateway's bearer token, a routing tag).
CUSTOM_HEADERS = {"X-Tenant": "acme-eu-west", "Authorization": "Bearer " + "t" * 40, "X-Route": "billing/v2"}


async def measure_custom_headers(bench: Bench, arguments) -> dict:
    """The cost of custom headers: a drain by one worker without and with them, then in reverse order."""
    modes = ["without", "with"]
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    for mode in [*modes, *reversed(modes)]:
        headers = json.dumps(CUSTOM_HEADERS) if mode == "with" else None
        await bench.pool.execute("UPDATE endpoints SET headers = $1::jsonb WHERE account_id = $2", headers,
                                 bench.account_id)
        drain = await bench.drain(arguments.deliveries, 1)
        recorded = await bench.pool.fetchval("SELECT count(*) FROM delivery_attempts WHERE sent_headers IS NOT NULL")
        runs[mode].append(drain)
        print(f"  headers {mode:7}  {drain['rate']:7.0f} deliveries/s  worker CPU {drain['cpu_ms_per_1000']:.0f} ms"
              f" per 1,000  delivered {drain['delivered']}/{drain['arrived']}  attempts with headers so far {recorded}",
              flush=True)
    base_rate = statistics.mean(run["rate"] for run in runs["without"])
    base_cpu = statistics.mean(run["cpu_ms_per_1000"] for run in runs["without"])
    ratios = []
    print(f"the cost of custom headers ({len(CUSTOM_HEADERS)} per endpoint), a drain of {arguments.deliveries}"
          f" deliveries by one worker, each mode twice:")
    for mode in modes:
        rate = statistics.mean(run["rate"] for run in runs[mode])
        cpu = statistics.mean(run["cpu_ms_per_1000"] for run in runs[mode])
        ratios.append({"mode": mode, "rate": rate, "rate_ratio": rate / base_rate, "worker_cpu_ms_per_1000": cpu,
                       "cpu_ratio": cpu / base_cpu})
        print(f"  headers {mode:7}  {rate:7.0f} deliveries/s  rate x{rate / base_rate:.3f} of without;"
              f" worker CPU {cpu:.0f} ms per 1,000 deliveries, x{cpu / base_cpu:.3f}")
    return {"modes": modes, "runs": runs, "ratios": ratios}


async def measure_sender_clients(bench: Bench, arguments, concurrency: int) -> dict:
    """The sender's HTTP clients side by side: a drain by one worker per client (the worker's
    HOOKLEDGER_SENDER_CLIENT), the clients in the order given and then reversed, with the ceiling
    measured before the first drain and after each, so each drain is set beside the mean of the two
    ceilings around it (its share of the ceiling leaves out a drift of the shared machine's speed)."""
    clients = arguments.sender_clients
    runs: dict[str, list[dict]] = {client: [] for client in clients}
    ceilings = [await bench.ceiling(arguments.deliveries, concurrency)]
    for client in [*clients, *reversed(clients)]:
        drain = await bench.drain(arguments.deliveries, 1, {"HOOKLEDGER_SENDER_CLIENT": client})
        ceilings.append(await bench.ceiling(arguments.deliveries, concurrency))
        drain["ceiling"] = (ceilings[-2]["rate"] + ceilings[-1]["rate"]) / 2
        drain["share_of_ceiling"] = drain["rate"] / drain["ceiling"]
        runs[client].append(drain)
        print(f"  client {client:8} {drain['rate']:7.0f} deliveries/s  {drain['share_of_ceiling']:.0%} of the ceiling"
              f" ({drain['ceiling']:.0f}/s)  worker CPU {drain['cpu_ms_per_1000']:.0f} ms per 1,000"
              f"  delivered {drain['delivered']}/{drain['arrived']}", flush=True)
    first = clients[0]
    base = {field: statistics.mean(run[field] for run in runs[first])
            for field in ("rate", "share_of_ceiling", "cpu_ms_per_1000")}
    ratios = []
    print(f"the sender's HTTP clients, a drain of {arguments.deliveries} deliveries by one worker, each client twice"
          f" (ceiling: plain aiohttp, c={concurrency}, {', '.join(str(round(c['rate'])) for c in ceilings)}/s):")
    for client in clients:
        figures = {field: statistics.mean(run[field] for run in runs[client]) for field in base}
        ratios.append({"client": client, "rate": figures["rate"], "rate_ratio": figures["rate"] / base["rate"],
                       "share_of_ceiling": figures["share_of_ceiling"],
                       "share_ratio": figures["share_of_ceiling"] / base["share_of_ceiling"],
                       "worker_cpu_ms_per_1000": figures["cpu_ms_per_1000"],
                       "cpu_ratio": figures["cpu_ms_per_1000"] / base["cpu_ms_per_1000"]})
        print(f"  client {client:8} {figures['rate']:7.0f} deliveries/s x{figures['rate'] / base['rate']:.3f} of {first}'s;"
              f" {figures['share_of_ceiling']:.0%} of the ceiling x{figures['share_of_ceiling'] / base['share_of_ceiling']:.3f};"
              f" worker CPU {figures['cpu_ms_per_1000']:.0f} ms per 1,000 deliveries x{figures['cpu_ms_per_1000'] / base['cpu_ms_per_1000']:.3f}")
    return {"clients": clients, "runs": runs, "ceilings": [c["rate"] for c in ceilings], "ratios": ratios}


def _mean_shares(runs: list[dict]) -> dict:
    roles = runs[0].get("cpu_shares", {})
    return {role: statistics.mean(run["cpu_shares"][role] for run in runs) for role in roles}


def _body(size: int) -> bytes:
    prefix = b'{"type": "bench.event", "data": "'
    return prefix + b"x" * max(0, size - len(prefix) - 2) + b'"}'


def _rates(stats: dict, count: int, started: float) -> dict:
    arrived = stats["distinct"]
    span = max(stats["last"] - stats["first"], 1e-9)
    return {"arrived": arrived, "rate": arrived / span, "wall_rate": arrived / max(stats["last"] - started, 1e-9),
            "complete": arrived >= count}


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(share * len(values)))]


async def orchestrate(arguments) -> None:
    settings = config.load()
    if arguments.partitions:
        await _measure_partitions(arguments, services.database_url(settings.database), services.redis_url(settings.redis))
        return
    async with (scratch_database(services.database_url(settings.database)) as database_url,
                scratch_redis(services.redis_url(settings.redis), arguments.redis_db) as redis_url):
        await _measure(arguments, database_url, redis_url)


async def _measure_partitions(arguments, server_url: str, server_redis_url: str) -> None:
    """The same runs once per partition count, each on a fresh database migrated with that many
    account partitions, in the order given; then each run beside the first count's."""
    quiet = argparse.Namespace(**{**vars(arguments), "json": None})
    results = await run_per_partition_count(arguments.partitions, server_url, server_redis_url, arguments.redis_db,
                                            lambda database_url, redis_url: _measure(quiet, database_url, redis_url))
    comparison = compare_partitions(results)
    print_partitions(arguments.partitions, comparison)
    if arguments.json:
        arguments.json.write_text(json.dumps({"benchmark": "delivery_partitions", "partitions": arguments.partitions,
                                              "deliveries": arguments.deliveries, "workers": arguments.workers,
                                              "comparison": comparison, "runs": results},
                                             indent=2, default=str) + "\n")


# What --partitions sets side by side: each run's deliveries per second (higher is better) and,
# for the latency runs, the p50 and p99 (lower is better).
COMPARED = {"ceiling": ("rate",), "naive": ("rate",), "latency": ("p50_ms", "p99_ms"),
            "latency_api": ("p50_ms", "p99_ms")}


def compare_partitions(results: dict[int, dict]) -> list[dict]:
    """Each run (drain by N workers, ceiling, naive, latency) at every partition count, its figures
    and their ratios to the first count's; a drain's rate also as a share of the ceiling beside it,
    whose ratio leaves out a drift of the shared machine's speed between the counts' runs."""
    first, *_ = results
    rows = []
    runs = sorted((name for name in results[first] if name.startswith(("drain", "throttled")) or name in COMPARED),
                  key=lambda name: name != "ceiling")  # the ceiling first, the rest in the order they ran
    for name in runs:
        fields = COMPARED.get(name, ("rate",))
        by_count = {}
        for count, result in results.items():
            run = result.get(name, {})
            value = {field: run.get(field, float("nan")) for field in fields}
            if "ceiling" in run and name.startswith("drain"):
                value["share_of_ceiling"] = ratio(run["rate"], run["ceiling"])
            by_count[count] = value
        for value in by_count.values():
            for field in list(value):
                value[f"{field}_ratio"] = ratio(value[field], by_count[first].get(field))
        rows.append({"run": name, "by_partitions": by_count})
    return rows


def print_partitions(counts: list[int], comparison: list[dict]) -> None:
    print(f"\nby account partitions ({', '.join(map(str, counts))}), each figure with its ratio to"
          f" {counts[0]} partition(s)'s (rates per second; latencies in ms; a drain's share of the ceiling beside it):")
    for row in comparison:
        cells = []
        for count, value in row["by_partitions"].items():
            figures = ", ".join(f"{field} {value[field]:.0f} x{value[f'{field}_ratio']:.3f}" if field != "share_of_ceiling"
                                else f"of ceiling {value[field]:.0%} x{value[f'{field}_ratio']:.3f}"
                                for field in value if not field.endswith("_ratio"))
            cells.append(f"{count}: {figures}")
        print(f"  {row['run']:<12} " + ";  ".join(cells))


async def _measure(arguments, database_url: str, redis_url: str) -> dict:
    """Every run the arguments ask for on that database; their results."""
    keyring, secret = Keyring({"k1": generate_at_rest_key()}, "k1"), generate_secret()
    bench = Bench(arguments, database_url, redis_url, keyring, secret)
    receiver = subprocess.Popen([sys.executable, __file__, "--serve-receiver", "0"], cwd=ROOT, stdout=subprocess.PIPE,
                                env={**os.environ, "BENCH_SECRET": secret, "BENCH_ANSWER_MS": str(arguments.answer_ms),
                                     "BENCH_HOSTS": str(arguments.endpoints if arguments.answer_ms else 0)})
    sender_settings = config.load({**os.environ, "HOOKLEDGER_DEV": "1"}).worker.sender
    concurrency = min(sender_settings.connections_max, sender_settings.connections_per_host_max)
    if arguments.answer_ms:  # each endpoint its own host: only the bound in all limits
        concurrency = sender_settings.connections_max
    results: dict = {"event_loop": event_loop.name(asyncio.get_running_loop())}
    try:
        bench.receiver_pid = receiver.pid
        await bench.setup(int(receiver.stdout.readline()))
        # A comparison the arguments ask for is the whole run: its modes side by side, nothing else.
        comparisons = (("sender_clients", lambda: measure_sender_clients(bench, arguments, concurrency)),
                       ("custom_headers", lambda: measure_custom_headers(bench, arguments)),
                       ("tracing", lambda: measure_tracing(bench, arguments)))
        for name, measure in comparisons:
            if getattr(arguments, name):
                results = {**results, name: await measure()}
                await bench.close()
                if arguments.json:
                    arguments.json.write_text(json.dumps({"benchmark": f"delivery_{name}", "deliveries": arguments.deliveries,
                                                          "results": results}, indent=2, default=str) + "\n")
                return results
        # The machine is shared, so the ceiling is measured right before and after every drain
        # and each drain is compared with the mean of the two beside it.
        ceilings = [await bench.ceiling(arguments.deliveries, concurrency)]
        for workers in arguments.workers:
            drain = await bench.drain(arguments.deliveries, workers)
            ceilings.append(await bench.ceiling(arguments.deliveries, concurrency))
            drain["ceiling"] = (ceilings[-2]["rate"] + ceilings[-1]["rate"]) / 2
            results[f"drain{workers}"] = drain
            print(f"drain, {workers} worker(s): {drain}; ceilings {[round(c['rate']) for c in ceilings]}", flush=True)
            if arguments.throttled_deliveries > 0:
                beside = await bench.drain_beside_throttled(arguments.deliveries, workers, arguments.throttled_deliveries,
                                                            arguments.throttle_rate)
                beside["versus_drain"] = beside["rate"] / drain["rate"]
                results[f"throttled{workers}"] = beside
                print(f"drain beside a {arguments.throttle_rate}/s endpoint, {workers} worker(s): {beside}", flush=True)
        results["ceiling"] = {**ceilings[0], "rate": statistics.mean(c["rate"] for c in ceilings),
                              "cpu_ms_per_1000": statistics.mean(c["cpu_ms_per_1000"] for c in ceilings),
                              "wall_rate": statistics.mean(c["wall_rate"] for c in ceilings),
                              "each": [c["rate"] for c in ceilings], "cpu_shares": _mean_shares(ceilings)}
        if arguments.seconds > 0:
            results["latency"] = await bench.latency(arguments.rate, arguments.seconds)
            print(f"latency: {results['latency']}", flush=True)
            results["latency_api"] = await bench.latency_through_api(arguments.rate, arguments.seconds)
            print(f"latency through the API: {results['latency_api']}", flush=True)
        if arguments.naive_deliveries > 0:
            results["naive"] = await bench.naive(arguments.naive_deliveries)
            print(f"naive: {results['naive']}", flush=True)
        await bench.close()
    finally:
        stop_servers([receiver])
    report(arguments, results, concurrency, sender_settings.sends_per_endpoint_max, bench.logs)
    if arguments.json:
        arguments.json.write_text(json.dumps({
            "benchmark": "delivery", "deliveries": arguments.deliveries, "naive_deliveries": arguments.naive_deliveries,
            "workers": arguments.workers, "endpoints": arguments.endpoints, "body_bytes": arguments.body_bytes,
            "offered_rate": arguments.rate, "latency_seconds": arguments.seconds, "connections": concurrency, "answer_ms": arguments.answer_ms,
            "results": results,
        }, indent=2, default=str) + "\n")
    return results


def report(arguments, results: dict, concurrency: int, per_endpoint: int, logs: list[str]) -> None:
    ceiling = results["ceiling"]["rate"]
    naive = results.get("naive", {}).get("rate")
    answering = f" answering {arguments.answer_ms} ms after each arrival," if arguments.answer_ms else ""
    print(f"\ndelivery benchmark: body {arguments.body_bytes} B, {arguments.endpoints} endpoints on one receiver,{answering}"
          f" the {results['event_loop']} event loop for the ceiling's client and the workers"
          f" ({arguments.endpoints} x {per_endpoint} per-endpoint sends = {arguments.endpoints * per_endpoint}"
          f" > {concurrency} connections {'in all' if arguments.answer_ms else 'per host'}: the per-endpoint bound does not limit)")
    print(f"{'run':<28} {'deliveries':>10} {'rate /s':>9} {'wall /s':>9} {'/ceiling':>9} {'/naive':>7}"
          f" {'cpu ms/1000':>11}  checks")
    rows = [("ceiling (plain aiohttp, c=%d)" % concurrency, results["ceiling"])]
    rows += [(f"drain, {workers} worker(s)", results[f"drain{workers}"]) for workers in arguments.workers]
    if naive:
        rows.append(("naive (job per delivery)", results["naive"]))
    for label, row in rows:
        checks = ""
        if "delivered" in row:
            checks = (f"delivered {row['delivered']}/{row['arrived']}, dup {row['duplicates']},"
                      f" signatures ok {row['verified']} bad {row['invalid']}")
        versus_naive = f"{row['rate'] / naive:>6.1f}x" if naive else "      -"
        print(f"{label:<28} {row['arrived']:>10} {row['rate']:>9.0f} {row['wall_rate']:>9.0f}"
              f" {row['rate'] / row.get('ceiling', ceiling):>9.0%} {versus_naive} {row['cpu_ms_per_1000']:>11.0f}  {checks}")
    print("CPU ms per 1,000 deliveries, by process (the two cores are shared by all of them):")
    for label, row in rows:
        if row.get("cpu_shares"):
            print(f"  {label:<28} {cpu_shares.describe(row['cpu_shares'])};"
                  f" {cpu_shares.cores_busy(row['cpu_shares'], row['rate'])}")
    bounds = [(label, cpu_shares.database_bound(results["ceiling"].get("cpu_shares", {}), row.get("cpu_shares", {})))
              for label, row in rows[1:]]
    if any(bound for _, bound in bounds):
        print("what the database alone allows: the share of the ceiling a drain could reach if the worker and the"
              " receiver cost no more than in the ceiling, with PostgreSQL's and Redis's CPU added (cores are the limit):")
        for label, bound in bounds:
            if bound:
                print(f"  {label:<28} {bound}")
    if "latency" in results:
        latency = results["latency"]
        print(f"latency at {latency['offered']:.0f}/s offered ({latency['count']} deliveries, 1 worker):"
              f" p50 {latency['p50_ms']:.0f} ms, p99 {latency['p99_ms']:.0f} ms, max {latency['max_ms']:.0f} ms,"
              f" arrived {latency['arrived']}, signatures ok {latency['verified']} bad {latency['invalid']}")
    if "latency_api" in results:
        latency = results["latency_api"]
        print(f"latency through the API at {latency['offered']:.0f}/s offered ({latency['count']} deliveries, one API"
              f" process, 1 worker; from each 202 to arrival): p50 {latency['p50_ms']:.0f} ms, p99 {latency['p99_ms']:.0f} ms,"
              f" max {latency['max_ms']:.0f} ms, arrived {latency['arrived']}, refused {latency['refused']},"
              f" signatures ok {latency['verified']} bad {latency['invalid']}")
    for workers in arguments.workers:
        if f"throttled{workers}" in results:
            row = results[f"throttled{workers}"]
            print(f"drain beside a {arguments.throttle_rate}/s endpoint with {arguments.throttled_deliveries} due,"
                  f" {workers} worker(s): {row['arrived']} unthrottled at {row['rate']:.0f}/s"
                  f" = {row['versus_drain']:.0%} of the plain drain's rate beside it; the throttled endpoint got"
                  f" {row['throttled_arrived']} meanwhile, at most {row['throttled_most_in_a_second']} in any second")
    print("rate: first to last arrival at the receiver; wall: worker start to last arrival; cpu: CPU time of the"
          " client (ceiling) or the worker processes per 1000 deliveries, less sensitive to a shared machine.")
    print("ceiling measured before and after each drain: " + ", ".join(f"{rate:.0f}" for rate in results["ceiling"]["each"])
          + "/s; each drain is compared with the mean of the two beside it, the naive run with the mean of all.")
    if arguments.answer_ms:
        print(f"the receiver answers {arguments.answer_ms} ms late: the ceiling's one client, like each worker, is bound by"
              f" its {concurrency} connections, so N workers can reach N times it (/ceiling above 100%).")
    print("worker logs: " + " ".join(logs))


def _sender_clients(text: str) -> list[str]:
    clients = [client.strip() for client in text.split(",") if client.strip()]
    unknown = [client for client in clients if client not in SENDER_CLIENTS]
    if not clients or unknown or len(set(clients)) != len(clients):
        raise argparse.ArgumentTypeError(f"a comma-separated list of distinct clients of {', '.join(SENDER_CLIENTS)}")
    return clients


def _endpoint_host(number: int) -> str:
    """A loopback address of endpoint `number`'s own (Linux routes all of 127.0.0.0/8 to loopback)."""
    return f"127.0.{(number + 2) // 256}.{(number + 2) % 256}"


def _answer_ms(text: str) -> int:
    if not text.isdigit() or int(text) > 60_000:
        raise argparse.ArgumentTypeError("a whole number of milliseconds, 0 to 60000")
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=20_000)
    parser.add_argument("--naive-deliveries", type=int, default=2_000)
    parser.add_argument("--workers", type=lambda text: [int(n) for n in text.split(",")], default=[1, 2])
    parser.add_argument("--endpoints", type=int, default=24)
    parser.add_argument("--rate", type=float, default=500.0, help="deliveries per second offered in the latency run")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the latency run (0 skips it)")
    parser.add_argument("--body-bytes", type=int, default=512)
    parser.add_argument("--throttled-deliveries", type=int, default=0,
                        help="also run each drain beside this many deliveries of an endpoint at --throttle-rate (0 skips it)")
    parser.add_argument("--throttle-rate", type=int, default=50, help="that endpoint's rate_limit_per_second")
    add_redis_db_argument(parser)
    parser.add_argument("--serve-receiver", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--naive-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--event-loop", choices=event_loop.CHOICES, default=config.load().event_loop,
                        help="the loop of the workers, the naive worker and the ceiling's client (the receiver keeps asyncio's)")
    parser.add_argument("--tracing", type=otlp_sink.modes, default=None, metavar="MODES",
                        help="measure the cost of tracing instead, for each of these modes (say off,1%%,100%%)")
    parser.add_argument("--custom-headers", action="store_true",
                        help="measure the cost of endpoints' custom headers instead (a drain without, with, with, without)")
    parser.add_argument("--sender-clients", type=_sender_clients, default=None, metavar="CLIENTS",
                        help="compare the sender's HTTP clients instead (say aiohttp,wire): a drain by one worker"
                             " per client, in order and then reversed")
    parser.add_argument("--answer-ms", type=_answer_ms, default=0, metavar="MS",
                        help="the receiver answers each request this many ms after it arrives (0 to 60000; default 0)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    add_partitions_argument(parser)
    arguments = parser.parse_args()
    if arguments.partitions and (arguments.tracing or arguments.custom_headers or arguments.sender_clients):
        parser.error("--partitions compares the plain runs; it goes with none of --tracing, --custom-headers"
                     " and --sender-clients")
    if arguments.serve_receiver is not None:
        asyncio.run(serve_receiver(arguments.serve_receiver))
    elif arguments.naive_worker:
        run_naive_worker()
    else:
        event_loop.run(orchestrate(arguments), arguments.event_loop)


if __name__ == "__main__":
    main()
