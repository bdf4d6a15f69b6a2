"""Closing the worker: a job task that ended cancelled must not abort the shutdown."""

from __future__ import annotations

import asyncio

from delivery.platform.worker import build_worker
from engine_helpers import wait_for, worker_task_ended


async def test_close_survives_a_job_cancelled_while_arq_finished_it(settings, pool):
    """arq's own close() gathers job tasks without return_exceptions: a job cancelled while arq awaited
    finish_job raised CancelledError out of close() and on_shutdown (sender, pool) never ran. It flaked CI."""
    worker = build_worker(settings, settings.redis.url, handle_signals=False, pool=pool)
    running = asyncio.create_task(worker.async_run())
    await wait_for(lambda: asyncio.sleep(0, "engine" in worker.ctx))
    sender = worker.ctx["sender"]

    async def finishing_forever():
        await asyncio.sleep(3600)

    job = asyncio.create_task(finishing_forever())
    worker.tasks["finishing"] = job
    await worker.close()  # cancels the job; with arq's close this raised CancelledError
    running.cancel()
    await worker_task_ended(running)  # cancelled, not crashed
    assert job.cancelled()
    assert worker.ctx["engine"].accepting is False
    assert sender.closed
    assert await pool.fetchval("SELECT 1") == 1  # the test's pool is shared, not closed by the worker
