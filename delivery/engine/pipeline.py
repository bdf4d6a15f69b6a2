"""The delivery pipeline a worker runs: claim, check, sign, send, record, reschedule.

    claim (one short transaction, fenced by attempt)
      -> pre-send check (settles what cannot be sent)
      -> sign and send, concurrently, with NO transaction open and no row locked
      -> record every result of the batch in one transaction, quoting each attempt
      -> wake a worker again at each retry's time; disable endpoints that answered 410

Everything that decides a state change reads the clock of PostgreSQL (`now()`); the local
clock only stamps the signature and times the send.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta

import asyncpg

from delivery import metrics
from delivery.engine import claims
from delivery.store import idempotent_responses
from delivery.engine import presend, retry
from delivery.engine.endpoint_health import EndpointHealth
from delivery.engine.presend import Outgoing
from delivery.engine.queue import IDS_PER_JOB_MAX, Queue
from delivery.engine.results import AttemptResult, RecordSummary, expire_leases, reclaim_late_successes, record_results
from delivery.engine.send_budget import SendBudget
from delivery.engine.sender import NOT_SENT_LATE, Sender, SendRequest, SendResult
from delivery.store import endpoint_headers
from delivery.store.signer_cache import SignerCache
from signing import Signer

logger = logging.getLogger(__name__)
# A batch's sends end this long before its lease does (the larger of the two), to record them in time.
LEASE_MARGIN_SECONDS_MIN = 1.0
LEASE_MARGIN_SHARE = 0.05
CANCELLED_RECORD_SECONDS = 5.0  # how long a cancelled batch may take to record the sends that ended
RELEASED_WAKE_SECONDS = 1  # a claim given back unsent is woken again after this (the sweep finds it too)
_UNSIGNED = SendResult(None, 0, "not sent: the endpoint has no signing secret", "", None, False, False)
_UNDECRYPTABLE = SendResult(None, 0, "not sent: the endpoint's signing secret cannot be decrypted", "", None, False, False)


def _signed_headers(signer: Signer, webhook_id: str, payload: bytes, custom: str | None = None) -> dict[str, str]:
    """The Standard Webhooks headers, after the endpoint's custom ones (which cannot name them)."""
    signed = signer.headers(webhook_id, int(time.time()), payload)
    return signed if custom is None else {**endpoint_headers.for_sending(custom), **signed}


def _settled_future(result: SendResult) -> asyncio.Future[SendResult]:
    future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
    future.set_result(result)
    return future


@dataclass(frozen=True)
class EngineSettings:
    """How a worker claims and paces its work."""

    batch_size: int = 200
    lease_ms: int = 90_000  # longer than the longest per-attempt timeout (60 s), with margin
    sweep_batches_max: int = 50  # a sweep stops after this many batches; the next sweep goes on
    sweep_lanes: int = 4  # batches a sweep keeps in flight at once (claim, send, record each)
    retry: retry.RetrySettings = retry.RetrySettings()

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= claims.CLAIM_BATCH_MAX:
            raise ValueError(f"batch_size must be 1..{claims.CLAIM_BATCH_MAX}")
        if not 1 <= self.sweep_lanes <= 64:
            raise ValueError("sweep_lanes must be 1..64")
        if not claims.LEASE_MS_MIN <= self.lease_ms <= claims.LEASE_MS_MAX:
            raise ValueError(f"lease_ms must be {claims.LEASE_MS_MIN}..{claims.LEASE_MS_MAX}")


@dataclass
class BatchReport:
    claimed: int = 0
    settled_before_send: int = 0
    sent: int = 0
    summary: RecordSummary | None = None


class Engine:
    def __init__(
        self,
        pool: asyncpg.Pool,
        sender: Sender,
        queue: Queue | None,
        signers: SignerCache,
        settings: EngineSettings,
        rng: random.Random | None = None,
    ) -> None:
        self.pool = pool
        self.sender = sender
        self.queue = queue
        self.queue_reachable = True  # False while the worker finds Redis down: retries are not enqueued
        self.signers = signers
        self.settings = settings
        self.rng = rng or random.Random()
        self.health = EndpointHealth(pool, settings.retry.auto_disable)
        self.accepting = True  # cleared on shutdown: claim nothing new
        # Every claim first reserves room in the sender for its whole batch (delivery.engine.send_budget).
        self.budget = SendBudget(sender.sends_pending_max)
        largest_claim = max(IDS_PER_JOB_MAX, settings.batch_size)
        if self.budget.total < largest_claim:
            raise ValueError(f"the sender takes {self.budget.total} pending sends, less than one claim ({largest_claim})")

    async def deliver_ids(self, delivery_ids: list[uuid.UUID]) -> BatchReport:
        """The fast path after a create: claim exactly these deliveries if they are due."""
        if not self.accepting:
            return BatchReport()
        return await self._claim_and_process(
            len(delivery_ids),
            lambda: claims.claim_ids_for_send(self.pool, delivery_ids, lease_ms=self.settings.lease_ms),
        )

    async def _claim_and_process(self, count: int, claim) -> BatchReport:
        """Reserve room for `count` sends, claim (at most that many), then check, send and record them.

        The room is taken before anything is leased, and what the claim did not fill is handed back
        at once; the rest is held until the batch is recorded.
        """
        held = await self.budget.take(count)
        try:
            if not self.accepting:  # shutdown began while this batch waited for room
                return BatchReport()
            # Taken before the claim's statement leaves, so the lease ends no earlier than this says.
            claimed_at = time.monotonic()
            loaded = await claim()
            self.budget.give(held - len(loaded))
            held = len(loaded)
            return await self.process_loaded(loaded, claimed_at)
        finally:
            self.budget.give(held)

    async def sweep(self) -> int:
        """Find what Redis may have lost: expired leases, exhausted deliveries, lost reclaims, due
        deliveries; and purge the API's stored answers past their retention."""
        await expire_leases(self.pool, batch_size=claims.CLAIM_BATCH_MAX, delay_seconds=self._lease_expiry_delay)
        exhausted = await claims.settle_exhausted(self.pool, batch_size=claims.CLAIM_BATCH_MAX)
        metrics.count_deaths("attempts_exhausted", exhausted)
        reclaimed = await reclaim_late_successes(self.pool, batch_size=claims.CLAIM_BATCH_MAX)
        if reclaimed:
            metrics.DELIVERIES.labels("delivered").inc(len(reclaimed))
        try:  # after the deliveries' own work: a purge that fails must not stop that
            await idempotent_responses.purge_expired(self.pool)
        except asyncpg.PostgresError as error:  # say a worker newer than the schema (before migration 0008)
            logger.warning("could not purge the API's stored answers (%r)", error)
        batches_left = [self.settings.sweep_batches_max]

        async def lane() -> int:
            processed = 0
            while self.accepting and batches_left[0] > 0:
                batches_left[0] -= 1
                claimed = (await self._claim_and_process(self.settings.batch_size, lambda: claims.claim_due_for_send(
                    self.pool, batch_size=self.settings.batch_size, lease_ms=self.settings.lease_ms
                ))).claimed
                if not claimed:
                    break
                processed += claimed
            return processed

        # Several lanes, so one batch's slowest send does not hold up the next batch's claim.
        return sum(await asyncio.gather(*(lane() for _ in range(self.settings.sweep_lanes))))

    async def process_loaded(self, loaded: list[tuple[claims.Claimed, asyncpg.Record]], claimed_at: float) -> BatchReport:
        """Check, send and record deliveries claimed (at time.monotonic() `claimed_at`, or just
        after) with their pre-send rows (one round trip)."""
        report = BatchReport(claimed=len(loaded))
        if not loaded:
            return report
        outgoing, settled = await presend.check_loaded(self.pool, loaded)
        return await self._send_and_record(report, outgoing, settled, self._sends_end_by(claimed_at))

    def _sends_end_by(self, claimed_at: float) -> float:
        """When a batch's sends must have ended: its lease's end, less time to record them.

        A batch of hundreds for one slow endpoint queues behind that endpoint's concurrency
        bound; sent after the lease ended, another worker would send each again and this
        worker's results would be stale. So a send that cannot end in time is not started, and
        its claim is given back unused (record_results: released), due again at once.
        """
        lease_seconds = self.settings.lease_ms / 1000
        return claimed_at + lease_seconds - max(LEASE_MARGIN_SECONDS_MIN, lease_seconds * LEASE_MARGIN_SHARE)

    async def _send_and_record(self, report: BatchReport, outgoing: list[Outgoing], settled: list,
                               not_after: float) -> BatchReport:
        report.settled_before_send = len(settled)
        for item in settled:
            if item.reason is not None:
                metrics.count_deaths(item.reason, 1)
        if not outgoing:
            return report
        # Futures, not tasks: the sender runs the sends in its own runners (see Sender.submit).
        futures = [self._submit(item, not_after) for item in outgoing]
        try:
            sent = await asyncio.gather(*futures)
        except asyncio.CancelledError:
            await self._record_finished(outgoing, futures)
            raise
        results = [self._result(item, result) for item, result in zip(outgoing, sent)]
        report.summary = await self._record(results)
        report.sent = sum(not result.released for result in results)
        await self._after_record(outgoing, sent, results, report.summary)
        return report

    async def _record(self, results: list[AttemptResult]) -> RecordSummary:
        """Record a batch's results and count its attempts (the claims given back were none)."""
        summary = await record_results(self.pool, results)
        metrics.count_results([result for result in results if not result.released], summary)
        return summary

    async def _record_finished(self, outgoing: list[Outgoing], futures: list[asyncio.Future[SendResult]]) -> None:
        """Cancelled (the shutdown's grace is over): record the sends that ended, so their 2xx is
        not lost and sent again. The rest keep their leases, which expire; a send cancelled on the
        wire may have arrived, and only its lease expiry can tell the next attempt so."""
        results = [self._result(item, future.result()) for item, future in zip(outgoing, futures)
                   if future.done() and not future.cancelled() and future.exception() is None]
        if not results:
            return
        try:
            await asyncio.wait_for(self._record(results), CANCELLED_RECORD_SECONDS)
        except Exception as error:  # noqa: BLE001 - shutting down: their leases expire and they are retried
            logger.warning("could not record %d finished sends while cancelled (%r)", len(results), error)

    def _submit(self, item: Outgoing, not_after: float) -> asyncio.Future[SendResult]:
        delivery_id = str(item.claimed.id)
        try:
            signer = self.signers.signer(item.claimed.endpoint_id, item.secret, item.previous_secret)
        except Exception as error:  # noqa: BLE001 - one endpoint's secret must not fail its whole batch
            # Sealed under a key the keyring no longer holds, tampered with, or no keyring at all.
            logger.error("endpoint %s: its signing secret cannot be decrypted (%r); not sent",
                         item.claimed.endpoint_id, error)
            return _settled_future(_UNDECRYPTABLE)
        if signer is None:
            # Every request must carry a signed delivery id (I9): without a secret nothing is
            # sent, and the attempt fails like any other until the delivery dies, refunded.
            return _settled_future(_UNSIGNED)
        # Signed as the send starts: a send queued behind its endpoint's others for a while must
        # not arrive with a webhook-timestamp that receivers' tolerance (5 minutes) refuses.
        # A replay goes out under the webhook-id of the delivery it replays, signed as such.
        webhook_id = delivery_id if item.webhook_id is None else str(item.webhook_id)
        headers = functools.partial(_signed_headers, signer, webhook_id, item.payload, item.headers)
        return self.sender.submit(
            SendRequest(delivery_id, item.claimed.attempt, item.url, item.payload, headers,
                        item.timeout_ms, str(item.claimed.endpoint_id), not_after)
        )

    def _result(self, item: Outgoing, sent: SendResult) -> AttemptResult:
        if sent is NOT_SENT_LATE:
            return AttemptResult(item.claimed.id, item.claimed.attempt, item.claimed.account_id, False, 0,
                                 released=True)
        delay = 0.0
        if not sent.success:
            delay = self._next_delay(item.claimed.attempt, sent.retry_after_seconds)
        return AttemptResult(
            item.claimed.id, item.claimed.attempt, item.claimed.account_id, sent.success, sent.latency_ms,
            sent.status_code, sent.error, sent.response_excerpt or None, delay,
        )

    async def _after_record(self, outgoing, sent, results, summary: RecordSummary) -> None:
        gone = {item.claimed.endpoint_id for item, result in zip(outgoing, sent) if result.gone}
        for endpoint_id in gone:
            await self.health.disable(endpoint_id, "the endpoint answered 410 Gone")
        failing = {item.claimed.endpoint_id for item, result in zip(outgoing, sent) if not result.success} - gone
        for endpoint_id in failing:
            await self.health.check_failing(endpoint_id)
        await self._wake(results, set(summary.retrying), summary.released)

    async def _wake(self, results: list[AttemptResult], retrying: set[uuid.UUID], released: list[uuid.UUID]) -> None:
        """Wake a worker at each retry's time, and shortly for the claims given back."""
        if self.queue is None or not (retrying or released) or not self.queue_reachable:
            return  # without Redis, the sweep finds each of them when it is due
        # Group by whole seconds so one job wakes many deliveries due together.
        by_delay: dict[int, list[uuid.UUID]] = defaultdict(list)
        for result in results:
            if result.delivery_id in retrying:
                by_delay[int(result.retry_delay_seconds + 0.999)].append(result.delivery_id)
        by_delay[RELEASED_WAKE_SECONDS].extend(released)
        try:
            for delay, ids in by_delay.items():
                if ids:
                    await self.queue.defer_by(ids, timedelta(seconds=delay))
        except Exception as error:  # noqa: BLE001 - Redis is a hint; the sweeper finds what is lost.
            logger.warning("could not enqueue retries (%r); the sweeper will find them", error)

    def _next_delay(self, failed_attempt: int, retry_after_seconds: float | None = None) -> float:
        """The backoff before the next attempt. Past the schedule's end (an attempt limit set
        higher than the schedule) the last delay repeats; the database decides when to stop."""
        delay = retry.next_delay(failed_attempt, self.settings.retry, self.rng, retry_after_seconds)
        if delay is None:
            last = self.settings.retry.schedule.delays_seconds[-1]
            delay = min(max(last, retry_after_seconds or 0.0), self.settings.retry.delay_cap_seconds)
        return delay

    def _lease_expiry_delay(self, attempt: int) -> float:
        return self._next_delay(attempt)
