"""What a worker does while Redis cannot be reached: it stays up, and delivers from PostgreSQL alone.

arq's worker loop ends at the first Redis error, so one Redis restart used to stop every worker
at once. Redis only holds hints (see delivery.engine.queue): the deliveries themselves are all in
PostgreSQL. While Redis is down the worker runs the engine's sweep in-process: again at once
while sweeps find work, else once per sweep interval (the same fenced claims as the sweep cron,
so workers doing it at once are safe); and it keeps asking Redis every RETRY_SECONDS. When Redis
answers again, arq's loop goes on as before, and the sweep cron finds whatever wake-ups and
retries were lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from delivery import metrics
from delivery.engine.recorder import database_lost

logger = logging.getLogger(__name__)

RETRY_SECONDS = 0.5  # between attempts to reach Redis while it is down
SWEEP_TASK_NAME = "hookledger:sweep-while-redis-is-down"


class RedisOutage:
    """Tracks whether Redis is reachable, and sweeps in-process while it is not.

    `failed` and `answered` are called from the worker's poll loop with the event loop's time.
    The sweep runs as a task that `failed` hands to the caller, so the worker can keep it with its
    jobs: shutdown then waits for it, or cancels it, as it does for them.
    """

    def __init__(self, sweep: Callable[[], Awaitable[int]], sweep_interval_seconds: float) -> None:
        self._sweep = sweep
        self._interval = sweep_interval_seconds
        self.down_since: float | None = None
        self._next_sweep_at = 0.0
        self._sweep_task: asyncio.Task | None = None
        self.sweeps = 0
        metrics.REDIS_REACHABLE.set(1)

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, error: BaseException, now: float) -> asyncio.Task | None:
        """Redis did not answer. Returns a new sweep task when one is due, else None."""
        if self.down_since is None:
            self.down_since = now
            self._next_sweep_at = now
            metrics.REDIS_REACHABLE.set(0)
            logger.error("Redis is unreachable (%r): delivering from PostgreSQL alone (sweeping in-process, at least "
                         "every %g s) until it answers", error, self._interval)
        if now < self._next_sweep_at or (self._sweep_task is not None and not self._sweep_task.done()):
            return None
        self._next_sweep_at = now + self._interval
        self._sweep_task = asyncio.get_running_loop().create_task(self._sweep_logged(), name=SWEEP_TASK_NAME)
        return self._sweep_task

    def answered(self, now: float) -> None:
        """Redis answered (a PING, while it was down)."""
        if self.down_since is None:
            return
        logger.warning("Redis answers again after %.1f s without it; %d sweeps ran meanwhile",
                       now - self.down_since, self.sweeps)
        self.down_since = None
        metrics.REDIS_REACHABLE.set(1)

    async def _sweep_logged(self) -> int:
        try:
            processed = await self._sweep()
        except Exception as error:  # noqa: BLE001 - logged; the next interval tries again
            if database_lost(error):  # PostgreSQL is down too: one line
                logger.warning("a sweep while Redis is down stopped: PostgreSQL is unavailable (%r)", error)
            else:
                logger.exception("a sweep while Redis is down failed")
            return 0
        self.sweeps += 1
        if processed:
            # More may be due (a sweep stops after sweep_batches_max batches): sweep again at the
            # next poll rather than an interval later, or a busy platform would fall behind.
            self._next_sweep_at = 0.0
            logger.info("an outage sweep (Redis unreachable) processed %d deliveries", processed)
        return processed
