"""The in-process worker of the engine tests (engine_helpers.running_worker) fails the test it ran
in when it crashed: cancelled at teardown is how it is meant to end, and anything else surfaces.
Its task was once awaited under suppress(CancelledError, Exception), so a crashed worker passed."""

from __future__ import annotations

import asyncio

import pytest

from engine_helpers import running_worker, wait_for


async def test_a_worker_that_crashed_mid_test_fails_the_test(settings, pool):
    with pytest.raises(AssertionError, match="the worker ended with RuntimeError"):
        async with running_worker(settings, pool) as worker:
            await wait_for(lambda: asyncio.sleep(0, "engine" in worker.ctx))

            async def crash() -> None:
                raise RuntimeError("a bug in the poll")

            worker._poll_iteration = crash
            await wait_for(lambda: asyncio.sleep(0, worker.main_task is not None and worker.main_task.done()))


async def test_a_worker_stopped_at_teardown_passes(settings, pool):
    async with running_worker(settings, pool) as worker:
        await wait_for(lambda: asyncio.sleep(0, "engine" in worker.ctx))
