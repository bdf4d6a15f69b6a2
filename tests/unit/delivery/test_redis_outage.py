"""RedisOutage: one sweep at a time, at most one per interval, and a failed sweep does not stop the next."""

from __future__ import annotations

import asyncio

from delivery import metrics
from delivery.engine.redis_outage import RedisOutage

ERROR = ConnectionError("refused")


async def test_a_sweep_at_once_then_one_per_interval_while_nothing_is_due() -> None:
    calls = []

    async def sweep() -> int:
        calls.append(1)
        return 0

    outage = RedisOutage(sweep, sweep_interval_seconds=5)
    assert not outage.down and metrics.REDIS_REACHABLE._value.get() == 1
    first = outage.failed(ERROR, now=100.0)
    assert outage.down and metrics.REDIS_REACHABLE._value.get() == 0
    assert await first == 0
    assert outage.failed(ERROR, now=101.0) is None and outage.failed(ERROR, now=104.9) is None
    second = outage.failed(ERROR, now=105.0)
    assert second is not None and await second == 0
    assert len(calls) == 2 and outage.sweeps == 2

    outage.answered(now=106.0)
    assert not outage.down and metrics.REDIS_REACHABLE._value.get() == 1
    third = outage.failed(ERROR, now=106.5)  # a new outage sweeps at once again
    assert third is not None and await third == 0


async def test_a_sweep_that_found_work_is_followed_at_once() -> None:
    """A sweep stops after sweep_batches_max batches; while sweeps find deliveries, the next one runs
    at the next poll, not an interval later."""
    found = [500, 120, 0]

    async def sweep() -> int:
        return found.pop(0)

    outage = RedisOutage(sweep, sweep_interval_seconds=5)
    assert await outage.failed(ERROR, now=0.0) == 500
    assert await outage.failed(ERROR, now=0.5) == 120
    assert await outage.failed(ERROR, now=1.0) == 0
    assert outage.failed(ERROR, now=1.5) is None  # nothing was due: back to once per interval
    outage.answered(now=2.0)


async def test_never_two_sweeps_at_once() -> None:
    release = asyncio.Event()

    async def slow_sweep() -> int:
        await release.wait()
        return 0

    outage = RedisOutage(slow_sweep, sweep_interval_seconds=1)
    running = outage.failed(ERROR, now=0.0)
    await asyncio.sleep(0)
    assert outage.failed(ERROR, now=10.0) is None  # due, but the last one is still running
    release.set()
    await running
    assert outage.failed(ERROR, now=10.5) is not None


async def test_a_failing_sweep_is_logged_and_the_next_interval_tries_again(caplog) -> None:
    outcomes = [RuntimeError("a bug"), ConnectionRefusedError("PostgreSQL is down too"), 7]

    async def sweep() -> int:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    outage = RedisOutage(sweep, sweep_interval_seconds=1)
    assert await outage.failed(ERROR, now=0.0) == 0
    assert "a sweep while Redis is down failed" in caplog.text and outage.sweeps == 0
    caplog.clear()
    assert await outage.failed(ERROR, now=1.0) == 0  # one line, no traceback
    assert "PostgreSQL is unavailable" in caplog.text and "Traceback" not in caplog.text
    assert await outage.failed(ERROR, now=2.0) == 7
    assert outage.sweeps == 1
    outage.answered(now=3.0)
