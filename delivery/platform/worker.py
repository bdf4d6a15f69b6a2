"""The worker process (`hookledger worker`): arq jobs that drive delivery.engine.pipeline.

Two kinds of work:
- `deliver` jobs carry delivery ids: enqueued right after a create commits, and deferred to a
  retry's time. They only ever claim what PostgreSQL says is due.
- the `sweep` cron: expired leases, exhausted deliveries, and every due delivery whose job
  Redis lost. Redis is never the source of truth; this is what guarantees liveness.
- `delete_account` jobs (delivery.operations.deletion) and the `audit_cron` (metrics from billing.audit).
- operational events sent as soon as they commit: a LISTEN on PostgreSQL's notice of them
  (delivery.operations.operational_wake), and the `operational` cron, as often as the sweep, as the
  fallback; both dispatch, send and record (delivery.operations.operational_sender) from PostgreSQL alone.
- the `retention` cron, once a minute: payloads and response excerpts past each account's
  retention are erased in small batches, for as long as work is due, by one worker at a time
  (delivery.operations.retention).

On SIGTERM the worker stops claiming, lets in-flight sends finish within the grace period,
records what finished, and cancels the rest (their leases expire; they are tried again).
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import signal

from arq import Worker, cron, func
from arq.connections import create_pool, log_redis_info
from arq.constants import in_progress_key_prefix
from arq.utils import timestamp_ms
from redis.exceptions import ResponseError, WatchError

from billing.audit import audit
from delivery import event_loop, gc_tuning, metrics, tracing
from delivery.operations import deletion, retention
from delivery.operations.operational_sender import OperationalSender
from delivery.operations.operational_wake import OperationalWake
from delivery.engine import metrics_share, queue as job_queue
from delivery.platform.config import Settings
from delivery.platform.database import open_pool
from delivery.engine.pipeline import Engine
from delivery.engine.recorder import database_lost
from delivery.engine.queue import REDIS_ERRORS
from delivery.engine.redis_outage import RETRY_SECONDS, SWEEP_TASK_NAME, RedisOutage
from delivery.engine.sender import Sender
from delivery.store.signer_cache import SignerCache

logger = logging.getLogger(__name__)
SWEEP_TIMEOUT_SECONDS = 600
DELETION_TIMEOUT_SECONDS = 3600
AUDIT_TIMEOUT_SECONDS = 1800
RETENTION_TIMEOUT_SECONDS = 360  # a run stops starting batches after retention.RUN_SECONDS_MAX (290 s)
AUDIT_NOTICES_LOGGED_MAX = 20  # one warning each, then one line with the count
QUEUE_READ_MAX = 1000  # job ids read from the queue's head per poll: room for 50 workers' running jobs
# Slots for operator jobs (account deletion), beside HOOKLEDGER_WORKER_JOBS for deliveries and crons:
# an operator job is enqueued at the queue's head (job_queue.enqueue_operator_job) and starts at the
# next poll however deep the delivery queue is.
OPERATOR_JOBS_MAX = 2
# Job ids read per poll while every delivery slot is taken: only the head, where operator jobs are.
QUEUE_HEAD_READ = 16
OPERATOR_PREFIX = job_queue.OPERATOR_JOB_PREFIX.encode()
RUNNING_ELSEWHERE_RECHECK_SECONDS = 1.0
CRON_PREFIX = b"cron:"  # arq's cron jobs' ids
EXISTS_CHUNK = 64  # in-progress keys asked about per round trip while looking for startable jobs
# A worker process still running this long after the shutdown grace has ended is stuck: it dumps
# every thread's stack to its log and exits (its leases expire and the deliveries are tried again).
SHUTDOWN_OVERRUN_SECONDS = 15


def _is_deliver_job(job_id: bytes) -> bool:
    """A deliver job: every job in the queue that is neither an operator's nor a cron's."""
    return not job_id.startswith(OPERATOR_PREFIX) and not job_id.startswith(CRON_PREFIX)


async def deliver(ctx: dict, delivery_ids: list) -> int:
    """Claim and send these deliveries ([account_id, delivery_id] pairs, or bare ids from a job of
    the previous version) if they are due. Returns how many were claimed."""
    keys, bare_ids = job_queue.parse_deliver_job(delivery_ids)
    try:
        report = await ctx["engine"].deliver_ids(keys, bare_ids, ctx.get("job_id"))
    except Exception as error:
        if not database_lost(error):
            raise
        _database_unavailable("a deliver job", error)
        return 0
    return report.claimed


def _database_unavailable(job: str, error: BaseException) -> None:
    """One line, not arq's traceback per job (nor a job counted failed), while PostgreSQL restarts:
    nothing is lost (a claimed delivery's lease expires and it is tried again; the sweep finds the
    rest; results already in are written by the recorder once PostgreSQL answers)."""
    logger.warning("%s stopped: PostgreSQL is unavailable (%r); the sweep picks its deliveries up", job, error)


async def sweep(ctx: dict) -> int:
    """Deliveries whose jobs were lost (and leases that expired), then deletions whose jobs were lost."""
    try:
        processed = await ctx["engine"].sweep()
        resumed = await deletion.resume_stale(ctx["pool"], ctx["redis"])
    except Exception as error:
        if not database_lost(error):
            raise
        _database_unavailable("the sweep", error)
        return 0
    if resumed:
        logger.warning("re-enqueued %d account deletions whose jobs were lost", len(resumed))
    return processed


async def operational_cron(ctx: dict) -> int:
    """Send the operational events that are due, or one line when PostgreSQL is unavailable."""
    try:
        return (await ctx["operational"].run_once()).sent
    except Exception as error:
        if not database_lost(error):
            raise
        _database_unavailable("the operational events run", error)
        return 0


async def audit_cron(ctx: dict) -> int:
    """The audit, or one line when PostgreSQL is unavailable (the next run audits)."""
    try:
        return await _audit(ctx)
    except Exception as error:
        if not database_lost(error):
            raise
        logger.warning("the audit stopped: PostgreSQL is unavailable (%r); the next run audits", error)
        return 0


async def _audit(ctx: dict) -> int:
    """Audit every account and publish the result as gauges. Returns the number of violations.

    The violations are an error (the first is logged); the notices (a guard the migrations create
    that is missing or changed, dead deliveries of a closed account...) break no invariant but are
    what an operator should look at, so each is logged as a warning and counted, not dropped."""
    with tracing.job_span("audit") as span:
        report = await audit(ctx["pool"])
        if span is not None:
            span.set_attributes({"hookledger.violations": len(report.violations), "hookledger.notices": len(report.notices)})
        tracing.set_outcome(span, "clean" if not report.violations else "violations")
    metrics.AUDIT_VIOLATIONS.set(len(report.violations))
    metrics.AUDIT_NOTICES.set(len(report.notices))
    metrics.AUDIT_LAST_RUN.set_to_current_time()
    if report.violations:
        logger.error("audit: %d violations, first: %s", len(report.violations), report.violations[0])
    for notice in report.notices[:AUDIT_NOTICES_LOGGED_MAX]:
        logger.warning("audit notice: %s (account %s, delivery %s)", notice.detail, notice.account_id or "-",
                       notice.delivery_id or "-")
    if len(report.notices) > AUDIT_NOTICES_LOGGED_MAX:
        logger.warning("audit: %d notices in all; `hookledger audit` lists them", len(report.notices))
    return len(report.violations)


async def retention_cron(ctx: dict) -> int:
    """Erase the payloads and response excerpts past each account's retention (a run of small
    batches while work is due, one at a time across workers: delivery.operations.retention), then
    publish the backlog. Returns how many."""
    try:
        run = await retention.run_retention(ctx["pool"])
        backlog = await retention.backlog(ctx["pool"])
    except Exception as error:
        if not database_lost(error):
            raise
        logger.warning("retention stopped: PostgreSQL is unavailable (%r); the next run goes on", error)
        return 0
    metrics.RETENTION_BACKLOG.set(backlog)
    if run.ran_elsewhere:
        logger.debug("retention: a run is going on in another worker")
        return 0
    metrics.RETENTION_ERASED.set(run.erased)
    if run.erased:
        logger.info("retention erased %d payloads in %d batches (%.2f s); %d past retention left",
                    run.erased, run.batches, run.seconds, backlog)
    return run.erased


def _audit_cron(minutes: int) -> list:
    if not minutes:
        return []
    return [cron(audit_cron, name="audit", minute=set(range(0, 60, minutes)), second=0, unique=True,
                 timeout=AUDIT_TIMEOUT_SECONDS, max_tries=1)]


class _OneLineWhenDatabaseLost(logging.Filter):
    """asyncpg's pool logs each failed attempt to restore its floor of connections with a traceback;
    while PostgreSQL is away that is one traceback a second saying only that: one line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None and database_lost(record.exc_info[1]):
            record.msg, record.args = f"{record.getMessage()} ({record.exc_info[1]!r})", None
            record.exc_info = record.exc_text = None
        return True


def _quiet_pool_tracebacks() -> None:
    pool_logger = logging.getLogger("asyncpg.pool")
    if not any(isinstance(existing, _OneLineWhenDatabaseLost) for existing in pool_logger.filters):
        pool_logger.addFilter(_OneLineWhenDatabaseLost())


async def _startup(ctx: dict) -> None:
    _quiet_pool_tracebacks()
    settings: Settings = ctx["settings"]
    pool = ctx.get("pool") or await open_pool(settings)
    ctx.setdefault("pool", pool)
    sender = Sender(settings.worker.sender)
    ctx["sender"] = sender
    keyring = None
    if settings.secret_keyring:
        from signing import parse_keyring

        keyring = parse_keyring(settings.secret_keyring)
    if settings.worker.metrics_port:
        metrics.serve(settings.worker.metrics_port)
    if settings.worker.metrics_share_seconds:  # for the API's /metrics (delivery.engine.metrics_share)
        ctx["metrics_share"] = metrics_share.Publisher(ctx["redis"], settings.worker.metrics_share_seconds)
        ctx["metrics_share"].start()
    ctx["engine"] = Engine(pool, sender, job_queue.Queue(ctx["redis"]), SignerCache(keyring), settings.worker.engine)
    # A sender of its own: the engine's counts on every pending send being one it reserved room for.
    ctx["operational"] = OperationalSender(pool, Sender(settings.worker.sender), keyring, settings.worker.engine.retry,
                                           lease_ms=settings.worker.engine.lease_ms,
                                           timeout_ms=settings.worker.sender.timeout_ms_default,
                                           shards=settings.worker.engine.account_shards,
                                           shard_hash=settings.worker.engine.account_shard_hash)
    ctx["operational_wake"] = OperationalWake(pool, ctx["operational"])
    ctx["operational_wake"].start()
    logger.info("worker started on the %s event loop", event_loop.name(asyncio.get_running_loop()))


def _tune_collector(settings: Settings) -> None:
    """In the worker process only (run), once everything is imported: not for a worker embedded in
    another program, whose collector is that program's business."""
    gc_tuning.tune(settings.worker.gc_gen0_threshold)


async def _shutdown(ctx: dict) -> None:
    engine: Engine | None = ctx.get("engine")
    if engine is not None:
        engine.accepting = False
    publisher: metrics_share.Publisher | None = ctx.get("metrics_share")
    if publisher is not None:  # the jobs are done: their counts go to Redis once more
        await publisher.stop()
    sender = ctx.get("sender")
    if sender is not None:
        await sender.close()
    if ctx.get("operational_wake") is not None:
        await ctx["operational_wake"].stop()
    if ctx.get("operational") is not None:
        await ctx["operational"].sender.close()
    if engine is not None:  # after the sender: the sends that ended while it closed are written too
        await engine.close()
    if ctx.get("owns_pool", True) and ctx.get("pool") is not None:
        await ctx["pool"].close()


class DeliveryWorker(Worker):
    """arq's worker, told to stop claiming the moment a shutdown signal arrives, polling its queue
    without re-checking the jobs that are running, and riding out a Redis outage."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._woken = asyncio.Event()  # a job is due now (job_queue.WAKE_CHANNEL), or one of ours ended
        self._running_elsewhere: dict[bytes, float] = {}  # job id -> when to ask Redis about it again
        self._redis_outage: RedisOutage | None = None
        self._held_back = False  # deliver jobs were left in the queue for want of room in the intake
        self.exit_deadline_seconds: float | None = None  # set by run(): the process's own, not an embedder's
        self._exit_deadline_armed = False

    async def main(self) -> None:
        """arq's main, except that between two reads of the queue the worker waits for a wake-up, at
        most poll_delay_s (HOOKLEDGER_WORKER_POLL_MS), instead of sleeping poll_delay_s.

        A wake-up is a message on job_queue.WAKE_CHANNEL, which every enqueue of a job due now
        publishes (a create's wake, an account deletion), or one of this worker's jobs ending (a slot
        is free for the jobs that wait). So a woken delivery is read at once, with no poll every few
        milliseconds burning CPU while nothing happens; deferred jobs (retries) and a lost message
        wait for the next timed read.
        """
        if self._pool is None:
            self._pool = await create_pool(self.redis_settings, job_deserializer=self.job_deserializer,
                                           job_serializer=self.job_serializer, default_queue_name=self.queue_name,
                                           expires_extra_ms=self.expires_extra_ms)
        logger.info("starting the worker for %d functions: %s", len(self.functions), ", ".join(self.functions))
        await log_redis_info(self.pool, logger.info)
        self.ctx["redis"] = self.pool
        if self.on_startup:
            await self.on_startup(self.ctx)
        listener = self.loop.create_task(self._listen_for_wake_ups())
        try:
            while True:
                self._woken.clear()
                await self._poll_iteration()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_delay_s):
                        await self._woken.wait()
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)

    async def _listen_for_wake_ups(self) -> None:
        """Set _woken at each message on job_queue.WAKE_CHANNEL; while Redis is down, try again
        every RETRY_SECONDS (the timed reads go on meanwhile)."""
        while True:
            pubsub = self.pool.pubsub()
            try:
                await pubsub.subscribe(job_queue.WAKE_CHANNEL)
                while True:
                    if await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0) is not None:
                        self._woken.set()
            except REDIS_ERRORS:
                await asyncio.sleep(RETRY_SECONDS)
            finally:
                with contextlib.suppress(*REDIS_ERRORS):
                    await pubsub.aclose()

    def _release_sem_dec_counter_on_complete(self) -> None:
        super()._release_sem_dec_counter_on_complete()
        self._woken.set()  # a slot is free: read the queue for the jobs that wait

    def _stopping(self) -> None:
        """A stop signal: claim nothing more, and (in the worker process) arm the exit deadline, once:
        a second signal does not push it back."""
        engine = self.ctx.get("engine")
        if engine is not None:
            engine.accepting = False
        if self.exit_deadline_seconds is not None and not self._exit_deadline_armed:
            self._exit_deadline_armed = True
            logger.info("stopping; the process exits by force if it has not within %g s", self.exit_deadline_seconds)
            faulthandler.dump_traceback_later(self.exit_deadline_seconds, exit=True)

    def handle_sig_wait_for_completion(self, signum: signal.Signals) -> None:
        self._stopping()
        super().handle_sig_wait_for_completion(signum)

    def handle_sig(self, signum: signal.Signals) -> None:
        self._stopping()
        super().handle_sig(signum)

    async def _sleep_until_tasks_complete(self) -> None:
        """The shutdown grace ends once every task is done. arq waits until its task dict is empty,
        but done tasks leave it only in arq's poll, which a Redis outage skips (_poll_iteration):
        a worker stopped while Redis was down, as when a killed `hookledger run` takes Redis with
        it, waited out the whole grace with nothing running."""
        while any(not task.done() for task in self.tasks.values()):
            await asyncio.sleep(0.1)

    async def _poll_iteration(self) -> None:
        """arq's poll, except that Redis being unreachable does not end the worker (see
        delivery.engine.redis_outage): the poll is retried every RETRY_SECONDS, and meanwhile the worker
        sweeps from PostgreSQL. Jobs that ended on a Redis error (arq could not record their end)
        are reaped here, so that arq's own reaping does not raise them out of the loop."""
        for job_id, task in list(self.tasks.items()):
            if task.done() and not task.cancelled() and isinstance(task.exception(), REDIS_ERRORS):
                del self.tasks[job_id]
                logger.warning("job %s ended on a Redis error (%r); its deliveries are in PostgreSQL",
                               job_id, task.exception())
        outage = self._outage()
        try:
            if outage is not None and outage.down:
                # Recovery is decided by a PING: a poll can touch no Redis at all (every slot busy,
                # or shutting down), which would say nothing.
                await self.pool.ping()
                outage.answered(self.loop.time())
                self.ctx["engine"].queue_reachable = True
                # The crons' missed runs would each be enqueued now, one per poll. Instead the sweep
                # runs at once (run_at_startup) and the others wait for their next time.
                for cron_job in self.cron_jobs:
                    cron_job.next_run = None
            # Every delivery slot taken: read only the queue's head, where operator jobs wait.
            self.queue_read_limit = QUEUE_READ_MAX if self._free_slots()[False] > 0 else QUEUE_HEAD_READ
            await super()._poll_iteration()
        except REDIS_ERRORS as error:
            if outage is not None:
                self.ctx["engine"].queue_reachable = False  # a retry's wake-up would wait out a timeout
                sweep = outage.failed(error, self.loop.time())
                if sweep is not None:
                    self.tasks[SWEEP_TASK_NAME] = sweep
            await asyncio.sleep(RETRY_SECONDS)

    def _free_slots(self) -> dict[bool, int]:
        """Free slots for operator jobs (True) and for deliveries and crons (False)."""
        operator_running = other_running = 0
        for job_id, task in self.tasks.items():
            if not task.done():
                if job_queue.is_operator_job(job_id):
                    operator_running += 1
                else:
                    other_running += 1
        free = self.max_jobs - self.job_counter
        return {True: min(free, OPERATOR_JOBS_MAX - operator_running),
                False: min(free, self.max_jobs - OPERATOR_JOBS_MAX - other_running)}

    def _deliver_jobs_allowed(self) -> int:
        """How many deliver jobs to take now: as many as the engine's intake has room for (a burst
        goes to the workers whose connections are free, delivery.engine.intake). While there is none,
        the intake's next room wakes the poll."""
        engine: Engine | None = self.ctx.get("engine")
        if engine is None:  # not started yet: nothing to hold back for
            return self.max_jobs
        intake = engine.intake
        if intake.on_room is None:
            intake.on_room = self._room_freed
        intake.forget_jobs(job_id for job_id, task in self.tasks.items() if not task.done())
        allowed = intake.jobs_allowed()
        self._held_back = allowed == 0
        return allowed

    def _room_freed(self) -> None:
        """The intake's room may have grown (a send ended, a reservation was handed over): while
        deliver jobs are held back, read the queue again once there is room for one."""
        if self._held_back and self.ctx["engine"].intake.jobs_allowed() > 0:
            self._held_back = False
            self._woken.set()

    def _outage(self) -> RedisOutage | None:
        engine: Engine | None = self.ctx.get("engine")
        if self._redis_outage is None and engine is not None:
            self._redis_outage = RedisOutage(engine.sweep, self.ctx["settings"].worker.sweep_interval_seconds)
        return self._redis_outage

    async def start_jobs(self, job_ids: list[bytes]) -> None:
        """arq's start_jobs, minus the jobs already running, here or in another worker, and without
        losing a slot when Redis fails halfway.

        A job stays in the queue until it finishes, and every poll that finds a free slot reads
        the queue from its head (QUEUE_READ_MAX ids, not arq's 100: with six workers of 20 jobs
        each, 100 running jobs hid every new one). arq would spend three round trips (WATCH,
        EXISTS, ZSCORE) on each running job only to skip it. Our own running jobs are known
        without asking; the others' are found by pipelined EXISTS of their in-progress keys,
        EXISTS_CHUNK at a time and only until the free slots are covered, and then not asked
        about again for RUNNING_ELSEWHERE_RECHECK_SECONDS (a job whose worker died keeps its key
        for the job timeout anyway). Each job that is left is then checked and marked in
        progress under WATCH, as arq does, so a job taken in between is not started twice. A job
        whose task here is done is not skipped: its id may be queued again.
        """
        running, elsewhere = self.tasks, self._running_elsewhere
        now = self.loop.time()
        slots = self._free_slots()  # for operator jobs (True) and for the rest (False)
        deliver_allowed = self._deliver_jobs_allowed()
        candidates = [
            job_id for job_id in job_ids
            if slots[job_id.startswith(OPERATOR_PREFIX)] > 0
            and (deliver_allowed > 0 or not _is_deliver_job(job_id))
            and ((task := running.get(job_id.decode())) is None or task.done()) and elsewhere.get(job_id, 0.0) <= now
        ]
        # Ask about a chunk at a time, and stop once there are enough free jobs for the free slots:
        # behind a backlog of waiting jobs, one slot must not cost an EXISTS for each of them.
        free: list[bytes] = []
        for start in range(0, len(candidates), EXISTS_CHUNK):
            # Operator jobs wait at the queue's head: past the first chunk, look only for the others.
            if slots[False] <= 0 and (start > 0 or slots[True] <= 0):
                break
            chunk = candidates[start:start + EXISTS_CHUNK]
            if deliver_allowed <= 0:  # the intake is full: asking about deliver jobs is a round trip for nothing
                chunk = [job_id for job_id in chunk if not _is_deliver_job(job_id)]
                if not chunk:
                    continue
            async with self.pool.pipeline(transaction=False) as pipe:
                for job_id in chunk:
                    pipe.exists(in_progress_key_prefix + job_id.decode())
                in_progress = await pipe.execute()
            for job_id, taken in zip(chunk, in_progress):
                if taken:
                    elsewhere[job_id] = now + RUNNING_ELSEWHERE_RECHECK_SECONDS
                elif slots[operator := job_id.startswith(OPERATOR_PREFIX)] > 0:
                    if _is_deliver_job(job_id):
                        if deliver_allowed <= 0:
                            continue
                        deliver_allowed -= 1
                    slots[operator] -= 1
                    free.append(job_id)
        if len(elsewhere) > 2 * QUEUE_READ_MAX:
            self._running_elsewhere = {job_id: until for job_id, until in elsewhere.items() if until > now}
        for job_id in free:
            await self.sem.acquire()
            if self.job_counter >= self.max_jobs:
                self.sem.release()
                return
            self.job_counter += 1
            started = False
            try:
                started = await self._mark_in_progress(job_id.decode())
                if started and _is_deliver_job(job_id) and "engine" in self.ctx:  # its task has not run yet
                    self.ctx["engine"].intake.job_started(job_id.decode())
            finally:
                if not started:  # taken elsewhere, or Redis failed: the slot is free again
                    self.job_counter -= 1
                    self.sem.release()

    async def _mark_in_progress(self, job_id: str) -> bool:
        """arq's check-and-mark of one job (WATCH its in-progress key, then set it in MULTI), and its
        task. False when another worker took it or it is no longer due."""
        in_progress_key = in_progress_key_prefix + job_id
        async with self.pool.pipeline(transaction=True) as pipe:
            await pipe.watch(in_progress_key)
            ongoing = await pipe.exists(in_progress_key)
            score = await pipe.zscore(self.queue_name, job_id)
            if ongoing or not score or score > timestamp_ms():
                return False
            pipe.multi()
            pipe.psetex(in_progress_key, int(self.in_progress_timeout_s * 1000), b"1")
            try:
                await pipe.execute()
            except (ResponseError, WatchError):
                return False
        task = self.loop.create_task(self.run_job(job_id, int(score)))
        task.add_done_callback(lambda _: self._release_sem_dec_counter_on_complete())
        self.tasks[job_id] = task
        return True

    async def close(self) -> None:
        """arq's close, except that a job cancelled while arq was finishing it cannot abort the shutdown.

        arq gathers its job tasks without return_exceptions, so a job task that ended cancelled (the
        signal lands while arq awaits finish_job) raised out of close() and skipped on_shutdown: the
        sender and the pool were never closed. Wait for every task and keep their outcomes. Then
        finish as arq does, except that Redis being down does not skip on_shutdown either.
        """
        if not self._handle_signals:
            self.handle_sig(signal.SIGUSR1)
        outcomes = await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, Exception):
                logger.warning("a job ended with %r during shutdown", outcome)
        self.tasks.clear()
        if self._pool is None:
            return
        try:
            await self.pool.delete(self.health_check_key)
        except REDIS_ERRORS as error:  # Redis down must not skip closing the sender and the pool
            logger.warning("could not remove the health key from Redis: %r", error)
        if self.on_shutdown:
            await self.on_shutdown(self.ctx)
        await self.pool.close(close_connection_pool=True)
        self._pool = None


def build_worker(settings: Settings, redis_url: str, *, handle_signals: bool = True, pool=None,
                 redis_pool=None) -> DeliveryWorker:
    worker_settings = settings.worker
    lease_seconds = worker_settings.engine.lease_ms / 1000
    ctx = {"settings": settings}
    if pool is not None:
        ctx.update(pool=pool, owns_pool=False)
    return DeliveryWorker(
        functions=[func(deliver, name="deliver", max_tries=1, timeout=lease_seconds + 30),
                   func(deletion.delete_account, name=deletion.JOB_NAME, max_tries=1, timeout=DELETION_TIMEOUT_SECONDS)],
        cron_jobs=[
            cron(sweep, name="sweep", second=set(range(0, 60, worker_settings.sweep_interval_seconds)),
                 run_at_startup=True, unique=True, timeout=SWEEP_TIMEOUT_SECONDS, max_tries=1),
            cron(operational_cron, name="operational", second=set(range(0, 60, worker_settings.sweep_interval_seconds)),
                 run_at_startup=True, unique=True, timeout=SWEEP_TIMEOUT_SECONDS, max_tries=1),
            *_audit_cron(worker_settings.audit_interval_minutes),
            cron(retention_cron, name="retention", second=30, unique=True, timeout=RETENTION_TIMEOUT_SECONDS,
                 max_tries=1),
        ],
        redis_settings=job_queue.redis_settings(redis_url),
        redis_pool=redis_pool,
        queue_name=job_queue.QUEUE_NAME,
        job_serializer=job_queue.serialize,
        job_deserializer=job_queue.deserialize,
        on_startup=_startup,
        on_shutdown=_shutdown,
        ctx=ctx,
        max_jobs=worker_settings.jobs_max + OPERATOR_JOBS_MAX,
        job_timeout=lease_seconds + 30,
        keep_result=0,
        max_tries=1,
        retry_jobs=False,
        poll_delay=worker_settings.poll_ms / 1000,
        queue_read_limit=QUEUE_READ_MAX,
        handle_signals=handle_signals,
        job_completion_wait=worker_settings.shutdown_grace_seconds,
        health_check_interval=30,
    )


def run(settings: Settings, redis_url: str) -> None:
    """Run a worker until SIGTERM/SIGINT (blocking)."""
    if tracing.configure("hookledger-worker"):  # before the engine is built: its recorder traces
        for handler in logging.getLogger().handlers:
            handler.addFilter(tracing.TraceIdsFilter())
    loop = event_loop.new_event_loop(settings.event_loop)
    asyncio.set_event_loop(loop)
    # Connected here: a Redis that does not answer within HOOKLEDGER_REDIS_START_WAIT_SECONDS is one
    # clear error (ServerUnreachableError). Once running, the worker rides out Redis outages.
    worker = build_worker(settings, redis_url, redis_pool=loop.run_until_complete(
        job_queue.connect(redis_url, wait_seconds=settings.redis.start_wait_seconds)))
    worker.exit_deadline_seconds = settings.worker.shutdown_grace_seconds + SHUTDOWN_OVERRUN_SECONDS
    _tune_collector(settings)
    worker.run()
