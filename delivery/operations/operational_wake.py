"""Send operational events as soon as they are written, not at the worker's next cron.

billing.operational_outbox's statement trigger on operational_events notifies WAKE_CHANNEL when a
transaction that wrote events commits (whichever process or path wrote them, psql included).
The worker holds one pooled connection LISTENing on it and runs the operational sender at each
notice; between notices it sleeps until the next thing due (a delivery.dead batch's window ending,
a retry's time), at most IDLE_SECONDS_MAX. Redis plays no part, so an outage of Redis delays
nothing; a notice missed while the connection was down is made up for by a run when it listens
again, and by the worker's `operational` cron, which stays the fallback.

Runs here and the cron's may overlap: every step of a run is SKIP LOCKED or fenced by attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import asyncpg

from billing.database import listen_forever
from billing.operational_outbox import DEAD_BATCH_WINDOW_SECONDS, WAKE_CHANNEL
from delivery.operations.operational_sender import OperationalSender

logger = logging.getLogger(__name__)

IDLE_SECONDS_MAX = 60.0  # the longest sleep without a notice (the cron runs meanwhile too)
RUN_GAP_SECONDS_MIN = 0.2  # after a run that found nothing to do (what is due is locked by another transaction)
ERROR_PAUSE_SECONDS = 1.0

# Seconds until the next thing a run would do: an open delivery.dead batch's window ending, or a
# pending delivery's next attempt (both through their partial indexes); NULL when nothing waits.
_NEXT_DUE = (
    "SELECT extract(epoch FROM least("
    "   (SELECT min(created_at) + $1 * interval '1 second' FROM operational_events"
    "    WHERE dispatched_at IS NULL AND batch_key IS NOT NULL),"
    "   (SELECT min(created_at) FROM operational_events WHERE dispatched_at IS NULL AND batch_key IS NULL),"
    "   (SELECT min(next_attempt_at) FROM operational_deliveries WHERE state = 'pending')) - now())::float8"
)


class OperationalWake:
    """Runs `operational.run_once` when events are written and when the next one is due."""

    def __init__(self, pool: asyncpg.Pool, operational: OperationalSender) -> None:
        self.pool = pool
        self.operational = operational
        self._woken = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.runs = 0  # completed runs (the tests read it)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._listen(), name="operational-listen"),
                       asyncio.create_task(self._run(), name="operational-wake")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def _on_notice(self, connection, pid: int, channel: str, payload: str) -> None:
        self._woken.set()

    async def _listen(self) -> None:
        """Hold one pooled connection LISTENing until cancelled, listening again when it drops; run
        whenever listening starts or stops, since events may have been written while nobody listened."""
        await listen_forever(self.pool, {WAKE_CHANNEL: self._on_notice}, on_unheard=self._woken.set,
                             what="operational events")

    async def _run(self) -> None:
        """Wait for a notice or the next due time, then run the sender; a failed run waits a moment."""
        wait_seconds = IDLE_SECONDS_MAX
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_seconds):
                    await self._woken.wait()
            self._woken.clear()
            try:
                report = await self.operational.run_once()
                self.runs += 1
                due = await self.pool.fetchval(_NEXT_DUE, DEAD_BATCH_WINDOW_SECONDS)
            except Exception as error:  # noqa: BLE001 - PostgreSQL away: the cron and the next notice retry
                logger.warning("the operational events run failed (%r); the cron or the next notice retries", error)
                wait_seconds = ERROR_PAUSE_SECONDS
                continue
            idle = report.dispatched == 0 and report.sent == 0 and report.dead == 0 and report.expired == 0
            wait_seconds = IDLE_SECONDS_MAX if due is None else min(IDLE_SECONDS_MAX, max(0.0, due))
            if idle:
                wait_seconds = max(wait_seconds, RUN_GAP_SECONDS_MIN)
