"""The aiohttp application: context, middlewares, routes, and the group commit's lifecycle."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
from aiohttp import web, web_response

from delivery.api import (
    cache_notices,
    docs_page,
    logs,
    middleware,
    routes_accounts,
    routes_api_keys,
    routes_applications,
    routes_deliveries,
    routes_endpoints,
    routes_event_types,
    routes_messages,
    routes_operator_endpoints,
    routes_operator_reads,
    routes_ops,
    routes_operational,
    routes_recover,
)
from delivery.api.application_uids import ApplicationUids
from delivery.api.auth import Authenticator
from delivery.api.context import CONTEXT, ApiContext
from delivery.api.event_catalog import EventCatalog
from delivery.api.group_commit import Coalescer
from delivery import dashboard
from delivery.platform.config import ConfigError, Settings
from delivery.engine.queue import Queue
from delivery.engine.ssrf import AddressPolicy
from signing import SigningError, parse_keyring

logger = logging.getLogger(__name__)

# What every answer says in its Server header, instead of aiohttp's "Python/3.x aiohttp/3.y" (which
# tells a scanner which known flaws to try). Set on aiohttp's module constant, the only thing that
# also reaches the 400s its parser writes before any handler or middleware runs.
SERVER_NAME = "hookledger"


def create_app(settings: Settings, pool: asyncpg.Pool, queue: Queue | None) -> web.Application:
    """Build the app. The caller owns the pool and the queue and closes them after the app stops.

    settings.api.operator_key and settings.secret_keyring must be set (`hookledger api`
    generates both in dev mode). queue None means no wake-ups: the sweeper finds new deliveries.
    """
    api = settings.api
    if not api.operator_key:
        raise ConfigError("HOOKLEDGER_OPERATOR_KEY is required (dev mode generates one)")
    if not settings.secret_keyring:
        raise ConfigError("HOOKLEDGER_SECRET_KEYS is required to seal endpoint secrets (dev mode generates one)")
    try:
        keyring = parse_keyring(settings.secret_keyring)
    except SigningError as error:
        raise ConfigError(f"HOOKLEDGER_SECRET_KEYS: {error}") from None
    web_response.SERVER_SOFTWARE = SERVER_NAME
    try:
        policy = AddressPolicy.from_strings(api.allowed_networks, allow_loopback=api.dev_mode)
    except ValueError as error:
        raise ConfigError(f"HOOKLEDGER_ALLOWED_NETWORKS: {error}") from None
    coalescer = Coalescer(
        pool,
        attempts_max=settings.ledger.attempts_max,
        batch_max=api.group_commit_batch_max,
        concurrency=api.group_commit_concurrency,
        parallel_waiting_min=api.group_commit_parallel_waiting_min,
        stall_seconds=api.group_commit_stall_ms / 1000,
        queue_max=api.group_commit_queue_max,
        wake=queue.wake if queue is not None else None,
        outcome_wait_seconds=api.commit_outcome_wait_seconds,
        account_shards=api.account_shards,
        account_shard_hash=api.account_shard_hash,
    )
    app = web.Application(
        middlewares=[middleware.observe, middleware.errors_as_problems],
        client_max_size=routes_messages.body_bytes_max(api.payload_bytes_max),
        handler_args={"logger": logs.SERVER_LOG},  # a malformed request: one line, no traceback
    )
    app[CONTEXT] = ApiContext(
        settings=settings, pool=pool, queue=queue, keyring=keyring, policy=policy,
        auth=Authenticator(pool, api.operator_key, api.auth_cache_ttl_ms), coalescer=coalescer,
        catalog=EventCatalog(pool), uids=ApplicationUids(pool),
    )
    for module in (routes_accounts, routes_api_keys, routes_endpoints, routes_messages, routes_deliveries, routes_ops,
                   routes_operator_reads, routes_operator_endpoints, routes_recover, routes_operational,
                   routes_applications,
                   routes_event_types, docs_page):
        app.add_routes(module.routes)
    dashboard.setup(app)  # the web dashboard under /dashboard (delivery/dashboard)
    app.cleanup_ctx.append(_cache_listener)
    app.on_shutdown.append(_drain)
    return app


async def _cache_listener(app: web.Application):
    """Every process hears, at commit, every key revocation and every change to an account's event
    catalog or application uids (delivery.api.cache_notices), while the app runs.

    The listener holds one pooled connection and the group commit keeps its own, so a pool too
    small to spare one more for requests goes without: the changes then reach this process within
    each cache's TTL (the auth cache's, CATALOG_CACHE_SECONDS, UID_CACHE_SECONDS).
    """
    ctx = app[CONTEXT]
    if ctx.pool.get_max_size() < ctx.settings.api.group_commit_concurrency + 2:
        logger.warning("the database pool is too small to listen for key revocations and catalog changes;"
                       " the caches' TTLs bound them")
        yield
        return
    task = asyncio.create_task(cache_notices.listen(ctx.pool, (ctx.auth, ctx.catalog, ctx.uids)))
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _drain(app: web.Application) -> None:
    """Finish the creates in flight (their clients get answers), then stop taking new ones."""
    await app[CONTEXT].coalescer.close()
