"""The delivery pipeline a worker runs: claim, check, sign, send, record, reschedule.

    claim (one short transaction, fenced by attempt)
      -> pre-send check (settles what cannot be sent)
      -> sign and send, concurrently, with NO transaction open and no row locked
      -> record each result as soon as it lands, quoting its attempt (delivery.engine.recorder:
         the results that land together share one write; a write PostgreSQL could not take is
         tried again until the lease ends)
      -> wake a worker again at each retry's time; disable endpoints that answered 410

Everything that decides a state change reads the clock of PostgreSQL (`now()`); the local
monotonic clock stamps when each request left and its answer came in, and the record anchors
those ages to `now()` (delivery.engine.results). The wall clock only stamps the signature.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import asyncpg

from billing import shards
from delivery import metrics, tracing
from delivery.engine import claims
from delivery.store import idempotent_responses
from delivery.engine import presend, retry
from delivery.engine.endpoint_health import EndpointHealth
from delivery.engine.intake import Intake
from delivery.engine.presend import Outgoing
from delivery.engine.queue import IDS_PER_JOB_MAX, Queue
from delivery.engine.recorder import Batch, Pending, Recorder
from delivery.engine.results import AttemptResult, RecordSummary, expire_leases, reclaim_late_successes, record_results
from delivery.engine.send_budget import SendBudget
from delivery.engine.sender import NOT_SENT_LATE, Sender, SendRequest, SendResult, was_held
from delivery.engine.throttle import Throttle
from delivery.store import endpoint_headers
from delivery.store.signer_cache import SignerCache
from signing import Signer

logger = logging.getLogger(__name__)
# A batch's sends end this long before its lease does (the larger of the two), to record them in time.
LEASE_MARGIN_SECONDS_MIN = 1.0
LEASE_MARGIN_SHARE = 0.05
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
    # HOOKLEDGER_ACCOUNT_SHARDS: above 1, each claim statement names the accounts of one shard
    # (delivery.engine.claims); set it to the partition count or the Citus shard count.
    account_shards: int = 1
    account_shard_hash: str = "postgres"  # HOOKLEDGER_ACCOUNT_SHARD_HASH: postgres or citus (billing.shards.shard_of)

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= claims.CLAIM_BATCH_MAX:
            raise ValueError(f"batch_size must be 1..{claims.CLAIM_BATCH_MAX}")
        if not 1 <= self.sweep_lanes <= 64:
            raise ValueError("sweep_lanes must be 1..64")
        if not claims.LEASE_MS_MIN <= self.lease_ms <= claims.LEASE_MS_MAX:
            raise ValueError(f"lease_ms must be {claims.LEASE_MS_MIN}..{claims.LEASE_MS_MAX}")
        if not 1 <= self.account_shards <= shards.PARTITIONS_MAX:
            raise ValueError(f"account_shards must be 1..{shards.PARTITIONS_MAX}")
        if self.account_shard_hash not in shards.SHARD_HASHES:
            raise ValueError(f"account_shard_hash must be one of {', '.join(shards.SHARD_HASHES)}")


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
        self.recorder = Recorder(pool, self._after_write,
                                 record=tracing.traced_record(record_results) if tracing.ENABLED else record_results)
        self.accepting = True  # cleared on shutdown: claim nothing new
        self._sweep_claim_lock = asyncio.Lock()
        # Rate limits and pauses per endpoint, shared by the workers through Redis (delivery.engine.throttle);
        # a pause lasts at most the longest retry delay.
        sender.backpressure.pause_seconds_max = min(max(settings.retry.schedule.delays_seconds),
                                                    settings.retry.delay_cap_seconds)
        self.throttle = Throttle(None if queue is None else queue.redis, sender.backpressure,
                                 reachable=lambda: self.queue_reachable)
        # Every claim first reserves room in the sender for its whole batch (delivery.engine.send_budget).
        self.budget = SendBudget(sender.sends_pending_max)
        # How much more work the worker should take off the queue (delivery.engine.intake).
        self.intake = Intake(sender)
        sender.on_send_end = self.intake.room_changed
        largest_claim = max(IDS_PER_JOB_MAX, settings.batch_size)
        if self.budget.total < largest_claim:
            raise ValueError(f"the sender takes {self.budget.total} pending sends, less than one claim ({largest_claim})")

    async def close(self) -> None:
        """Claim nothing more, and write the results held (the worker's shutdown, after the sender closed)."""
        self.accepting = False
        await self.throttle.close()
        await self.recorder.close()

    async def deliver_ids(self, keys: list[claims.DeliveryKey], bare_ids: Sequence[uuid.UUID] = (),
                          job_id: str | None = None) -> BatchReport:
        """The fast path after a create: claim exactly these deliveries (account, id) if they are
        due; and those a job of the previous version names by id alone (`bare_ids`). `job_id`: the
        deliver job's, counted by the intake as a whole job until now."""
        if not self.accepting:
            self.intake.job_reading(job_id)
            return BatchReport()
        return await self._claim_and_process(len(keys) + len(bare_ids), functools.partial(self._claim_ids, keys, bare_ids),
                                             job_id)

    async def _claim_ids(self, keys: list[claims.DeliveryKey],
                         bare_ids: Sequence[uuid.UUID]) -> list[tuple[claims.Claimed, asyncpg.Record]]:
        loaded = await claims.claim_ids_for_send(self.pool, keys, lease_ms=self.settings.lease_ms,
                                                 shards=self.settings.account_shards,
                                                 shard_hash=self.settings.account_shard_hash) if keys else []
        if bare_ids:
            loaded += await claims.claim_bare_ids_for_send(self.pool, bare_ids, lease_ms=self.settings.lease_ms)
        return loaded

    async def _claim_and_process(self, count: int, claim, job_id: str | None = None) -> BatchReport:
        """Reserve room for `count` sends, claim (at most that many), then check, send and record them.

        The room is taken before anything is leased, and what the claim did not fill is handed back
        at once; the rest is held until the batch is recorded. The intake counts the deliveries as
        taken on from here (the job that named them no longer) until they are handed to the sender.
        """
        taken_on = self.intake.reserve(count)
        self.intake.job_reading(job_id)
        try:
            held = await self.budget.take(count)
        except BaseException:
            self.intake.release(taken_on)
            raise
        try:
            if not self.accepting:  # shutdown began while this batch waited for room
                return BatchReport()
            # Taken before the claim's statement leaves, so the lease ends no earlier than this says.
            claimed_at = time.monotonic()
            loaded = await claim()
            self.budget.give(held - len(loaded))
            held = len(loaded)
            self.intake.release(taken_on, count - len(loaded))
            if tracing.ENABLED:  # each claimed delivery's attempt, in its message's trace
                return await tracing.traced_batch(loaded, claimed_at, self.process_loaded(loaded, claimed_at, taken_on))
            return await self.process_loaded(loaded, claimed_at, taken_on)
        finally:
            self.intake.release(taken_on)
            self.budget.give(held)

    async def sweep(self) -> int:
        """Find what Redis may have lost: expired leases, exhausted deliveries, lost reclaims, due
        deliveries; and purge the API's stored answers past their retention."""
        await expire_leases(self.pool, batch_size=claims.CLAIM_BATCH_MAX, delay_seconds=self._lease_expiry_delay,
                            shards=self.settings.account_shards, shard_hash=self.settings.account_shard_hash)
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
                claimed = (await self._claim_and_process(self.settings.batch_size, self._claim_due)).claimed
                if not claimed:
                    break
                processed += claimed
            return processed

        # Several lanes, so one batch's slowest send does not hold up the next batch's claim.
        return sum(await asyncio.gather(*(lane() for _ in range(self.settings.sweep_lanes))))

    async def _claim_due(self) -> list[tuple[claims.Claimed, asyncpg.Record]]:
        if self.settings.account_shards == 1:  # one statement that locks as it reads: lanes never overlap
            return await claims.claim_due_for_send(self.pool, batch_size=self.settings.batch_size,
                                                   lease_ms=self.settings.lease_ms)
        # Per shard, the due deliveries are read without a lock, then claimed: two lanes reading at
        # once would read the same ones and one of them would claim none (and stop), so this
        # worker's lanes take turns to read and claim (the sends still overlap).
        async with self._sweep_claim_lock:
            return await claims.claim_due_for_send(self.pool, batch_size=self.settings.batch_size,
                                                   lease_ms=self.settings.lease_ms, shards=self.settings.account_shards,
                                                   shard_hash=self.settings.account_shard_hash)

    async def process_loaded(self, loaded: list[tuple[claims.Claimed, asyncpg.Record]], claimed_at: float,
                             taken_on: list[int] | None = None) -> BatchReport:
        """Check, send and record deliveries claimed (at time.monotonic() `claimed_at`, or just
        after) with their pre-send rows (one round trip). `taken_on`: their intake reservation,
        released once they are handed to the sender."""
        report = BatchReport(claimed=len(loaded))
        if not loaded:
            return report
        outgoing, settled = await presend.check_loaded(self.pool, loaded)
        return await self._send_and_record(report, outgoing, settled, claimed_at, taken_on)

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
                               claimed_at: float, taken_on: list[int] | None = None) -> BatchReport:
        report.settled_before_send = len(settled)
        for item in settled:
            if item.reason is not None:
                metrics.count_deaths(item.reason, 1)
        if not outgoing:
            return report
        not_after = self._sends_end_by(claimed_at)
        lease_ends_at = claimed_at + self.settings.lease_ms / 1000
        batch = Batch(len(outgoing))
        await self.throttle.read_pauses(item.claimed.endpoint_id for item in outgoing)
        landed = self._landed
        # Futures, not tasks: the sender runs the sends in its own runners (see Sender.submit). Each
        # result goes to the recorder as it lands; a cancelled job leaves them to it (Recorder.close).
        for item in outgoing:
            self._submit(item, not_after).add_done_callback(functools.partial(landed, item, batch, lease_ends_at))
        if taken_on is not None:
            self.intake.release(taken_on)
        await batch.done
        report.summary = batch.summary
        report.sent = batch.sent
        return report

    def _landed(self, item: Outgoing, batch: Batch, lease_ends_at: float, future: asyncio.Future[SendResult]) -> None:
        """A send's future is done: its result goes to the recorder (a cancelled send has none)."""
        if future.cancelled():
            batch.landed()  # the sender is closing: the send's lease expires and it is tried again
            return
        error = future.exception()
        if error is not None:  # a bug in the sender: its lease expires
            logger.error("delivery %s: the send failed (%r)", item.claimed.id, error)
            batch.landed()
            return
        sent = future.result()
        if sent.sent_at:  # the claim was taken a lease before its end
            metrics.CLAIM_TO_SEND.observe(max(0.0, sent.sent_at - lease_ends_at + self.settings.lease_ms / 1000))
        self.throttle.observed(item.claimed.endpoint_id, sent)
        self.recorder.add(Pending(self._result(item, sent), batch, item.claimed.endpoint_id, sent.gone, lease_ends_at))

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
        return self.throttle.submit(item.rate_limit_per_second, SendRequest(
            delivery_id, item.claimed.attempt, item.url, item.payload, headers, item.timeout_ms,
            str(item.claimed.endpoint_id), not_after), self.sender.submit)

    def _result(self, item: Outgoing, sent: SendResult) -> AttemptResult:
        if sent is NOT_SENT_LATE or was_held(sent):  # never on the wire: the attempt is handed back
            return AttemptResult(item.claimed.id, item.claimed.attempt, item.claimed.account_id, False, 0,
                                 retry_delay_seconds=sent.retry_after_seconds or 0.0, released=True)
        delay = 0.0
        if not sent.success:
            delay = self._next_delay(item.claimed.attempt, sent.retry_after_seconds)
        return AttemptResult(
            item.claimed.id, item.claimed.attempt, item.claimed.account_id, sent.success, sent.latency_ms,
            sent.status_code, sent.error, sent.response_excerpt or None, delay, False,
            sent.sent_at or None, sent.answered_at or None, endpoint_headers.as_sent(item.headers),
        )

    async def _after_write(self, group: list[Pending], summary: RecordSummary, connection: asyncpg.Connection) -> None:
        """After each write of results (delivery.engine.recorder, on its connection): count them,
        disable the endpoints that answered 410, check the failing ones, wake a worker at each
        retry's time."""
        results = [pending.result for pending in group]
        metrics.count_results([result for result in results if not result.released], summary)
        gone = {(pending.result.account_id, pending.endpoint_id) for pending in group if pending.gone}
        for account_id, endpoint_id in gone:
            await self.health.disable(account_id, endpoint_id, "the endpoint answered 410 Gone", connection)
        failing = {(pending.result.account_id, pending.endpoint_id) for pending in group
                   if not pending.result.success and not pending.result.released} - gone
        for account_id, endpoint_id in failing:
            await self.health.check_failing(account_id, endpoint_id, connection)
        await self._wake(results, set(summary.retrying), summary.released)

    async def _wake(self, results: list[AttemptResult], retrying: set[uuid.UUID], released: list[uuid.UUID]) -> None:
        """Wake a worker at each retry's time, and shortly for the claims given back."""
        if self.queue is None or not (retrying or released) or not self.queue_reachable:
            return  # without Redis, the sweep finds each of them when it is due
        # Group by whole seconds so one job wakes many deliveries due together.
        by_delay: dict[int, list[tuple[uuid.UUID, uuid.UUID]]] = defaultdict(list)
        released_now = set(released)
        for result in results:
            if result.delivery_id in retrying:
                by_delay[int(result.retry_delay_seconds + 0.999)].append((result.account_id, result.delivery_id))
            elif result.delivery_id in released_now:  # held back ones when they are due again
                by_delay[max(RELEASED_WAKE_SECONDS, int(result.retry_delay_seconds + 0.999))].append(
                    (result.account_id, result.delivery_id))
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
