"""`hookledger api`: serve the HTTP API until SIGINT/SIGTERM.

Opens the pool (migrating first) and the arq queue, builds the app, and closes everything in
reverse order. In dev mode (HOOKLEDGER_DEV=1) a missing operator key or at-rest keyring is
generated and printed once; the worker needs the same HOOKLEDGER_SECRET_KEYS to sign, so copy it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import signal

import structlog
from aiohttp import web

from delivery import event_loop, gc_tuning, tracing
from delivery.platform import config, services
from delivery.engine import queue as job_queue
from delivery.api import logs
from delivery.platform.web_app import create_app
from delivery.platform.database import open_pool
from signing import Keyring, format_keyring, generate_at_rest_key

log = structlog.get_logger("hookledger.api")


def with_dev_defaults(settings: config.Settings) -> config.Settings:
    """Fill in a generated operator key and keyring in dev mode; refuse to start without them otherwise."""
    api = settings.api
    if api.operator_key and settings.secret_keyring:
        return settings
    if not api.dev_mode:
        missing = [name for name, value in (("HOOKLEDGER_OPERATOR_KEY", api.operator_key),
                                            ("HOOKLEDGER_SECRET_KEYS", settings.secret_keyring)) if not value]
        raise config.ConfigError(f"{' and '.join(missing)} must be set (or HOOKLEDGER_DEV=1 to generate them)")
    operator_key = api.operator_key or "hl_op_" + secrets.token_urlsafe(32)
    keyring = settings.secret_keyring or format_keyring(Keyring({"dev1": generate_at_rest_key()}, "dev1"))
    if not api.operator_key:
        print(f"dev mode: generated HOOKLEDGER_OPERATOR_KEY={operator_key}", flush=True)
    if not settings.secret_keyring:
        print(f"dev mode: generated HOOKLEDGER_SECRET_KEYS={keyring} (give the worker the same)", flush=True)
    return dataclasses.replace(settings, api=dataclasses.replace(api, operator_key=operator_key), secret_keyring=keyring)


async def serve(settings: config.Settings) -> None:
    settings = with_dev_defaults(settings)
    pool = await open_pool(settings, run_migrations=True)
    redis = await job_queue.connect(services.redis_url(settings.redis), wait_seconds=settings.redis.start_wait_seconds)
    runner = web.AppRunner(create_app(settings, pool, job_queue.Queue(redis)), access_log=None)
    try:
        await runner.setup()
        try:
            await web.TCPSite(runner, settings.api.host, settings.api.port, backlog=1024).start()
        except OSError as error:
            raise config.ConfigError(
                f"cannot listen on {settings.api.host}:{settings.api.port} ({error.strerror or error});"
                " set HOOKLEDGER_API_HOST / HOOKLEDGER_API_PORT to a free address"
            ) from None
        log.info("listening", host=settings.api.host, port=settings.api.port,
                 event_loop=event_loop.name(asyncio.get_running_loop()))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signal_number in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signal_number, stop.set)
        await stop.wait()
        log.info("stopping")
    finally:
        await runner.cleanup()
        await redis.aclose()
        await pool.close()


def api() -> None:
    """Serve the HTTP API (/v1, /openapi.json, /docs, /metrics) until SIGTERM."""
    settings = config.load()
    tracing.configure("hookledger-api")  # before the logs, whose lines then carry the trace ids
    logs.configure(settings.api.log_level)
    tune_collector(settings)
    event_loop.run(serve(settings), settings.event_loop)


def tune_collector(settings: config.Settings) -> None:
    """In the API process only, once everything is imported (as the worker does; see gc_tuning).

    Each request allocates a few hundred objects, and those of the requests in flight (about a
    group-commit transaction's worth) survive young collections and set off older ones: with
    the young collection every 50,000 allocations instead of 700, the API spent 10% to 22% less
    CPU per message in scripts/bench_ingest.py."""
    gc_tuning.tune(settings.api.gc_gen0_threshold)
