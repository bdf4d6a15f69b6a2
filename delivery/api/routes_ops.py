"""Operations: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from delivery import metrics
from delivery.engine import metrics_share
from delivery.api import reads, responses
from delivery.api.context import ApiContext, context

logger = logging.getLogger(__name__)
routes = web.RouteTableDef()

READY_TIMEOUT_SECONDS = 2.0


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    return responses.json(responses.Health("ok"))


async def _reachable(check) -> bool:
    try:
        await asyncio.wait_for(check(), READY_TIMEOUT_SECONDS)
        return True
    except Exception as error:
        logger.warning("readiness check failed: %r", error)
        return False


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    ctx = context(request)
    postgres = await _reachable(lambda: ctx.pool.fetchval("SELECT 1"))
    redis = ctx.queue is not None and await _reachable(ctx.queue.redis.ping)
    ready = postgres and redis
    return responses.json(responses.Readiness("ready" if ready else "unavailable", postgres, redis), 200 if ready else 503)


@routes.get("/metrics")
async def prometheus_metrics(request: web.Request) -> web.Response:
    """The API's own series, the queue depth read now, and the workers' series from their snapshots
    in Redis (delivery.engine.metrics_share). Either read may fail or time out: the scrape still answers."""
    ctx = context(request)
    _, workers = await asyncio.gather(_read_queue_lag(ctx), _read_workers(ctx))
    response = web.Response(body=metrics_share.exposition(workers))
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


async def _read_queue_lag(ctx: ApiContext) -> None:
    try:
        lag = await asyncio.wait_for(reads.queue_lag(ctx.pool), READY_TIMEOUT_SECONDS)
    except Exception as error:  # a scrape still answers with the counters
        logger.warning("queue lag not read: %r", error)
        return
    metrics.QUEUE_DEPTH.set(lag["due"])
    metrics.OLDEST_DUE_AGE.set(lag["oldest_due_seconds"])
    metrics.DELIVERIES_WAITING.labels("pending").set(lag["pending"])
    metrics.DELIVERIES_WAITING.labels("sending").set(lag["sending"])
    try:
        worst = await asyncio.wait_for(reads.worst_endpoints(ctx.pool, metrics.WORST_ENDPOINTS_MAX),
                                       READY_TIMEOUT_SECONDS)
    except Exception as error:  # the scrape still answers, with the last ranking
        logger.warning("endpoints furthest behind not read: %r", error)
        return
    metrics.set_worst_endpoints(metrics.ENDPOINT_OLDEST_DUE_AGE, worst["lag"])
    metrics.set_worst_endpoints(metrics.ENDPOINT_RETRYING, worst["retrying"])


async def _read_workers(ctx: ApiContext) -> list[metrics_share.Snapshot] | None:
    if ctx.queue is None:
        return None
    try:
        return await asyncio.wait_for(metrics_share.read(ctx.queue.redis), READY_TIMEOUT_SECONDS)
    except Exception as error:  # a scrape still answers with the API's own series
        logger.warning("workers' metrics not read from Redis: %r", error)
        return None
