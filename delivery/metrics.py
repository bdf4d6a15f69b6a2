"""Prometheus metrics shared by the API and the worker: define here, increment where it happens.

One registry of our own (not the client library's global one), so a process that imports this
module twice under test, or embeds us, never collides on metric names. Every process counts in
it what happens there. The API serves /metrics: its own series from here, and the worker-side ones
(WORKER_SUMMED, WORKER_GAUGES) from the workers' snapshots in Redis (delivery.engine.metrics_share), never
its own never-moved copies. A worker serves its whole registry on HOOKLEDGER_WORKER_METRICS_PORT.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from billing import messages, settle

REGISTRY = CollectorRegistry(auto_describe=True)

DELIVERIES = Counter(
    "hookledger_deliveries_total",
    "Deliveries that reached a final state, by outcome (delivered, dead).",
    ["outcome"],
    registry=REGISTRY,
)
ATTEMPTS = Counter(
    "hookledger_delivery_attempts_total",
    "Send attempts by the receiver's status class (2xx, 3xx, 4xx, 5xx) or 'error' when no response came.",
    ["status_class"],
    registry=REGISTRY,
)
DELIVERY_LATENCY = Histogram(
    "hookledger_delivery_latency_seconds",
    "Seconds from a delivery's creation to its successful send (retries included).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 21600, 86400),
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(
    "hookledger_queue_depth",
    "Pending deliveries whose next attempt is due now, read from PostgreSQL at scrape time.",
    registry=REGISTRY,
)
OLDEST_DUE_AGE = Gauge(
    "hookledger_oldest_due_delivery_age_seconds",
    "How long the oldest pending delivery that is due now has been due (0: none is), read from"
    " PostgreSQL at scrape time: how late the workers run.",
    registry=REGISTRY,
)
DELIVERIES_WAITING = Gauge(
    "hookledger_deliveries_waiting",
    "Live deliveries by state (pending: waiting for an attempt, due or not; sending: leased to a worker),"
    " read from PostgreSQL at scrape time.",
    ["state"],
    registry=REGISTRY,
)
REFUNDS = Counter(
    "hookledger_refunds_total",
    "Refunds written by billing.settle, by dead reason.",
    ["reason"],
    registry=REGISTRY,
)
MESSAGES_CREATED = Counter(
    "hookledger_messages_created_total",
    "Messages accepted by the API (replays of an idempotency key not counted).",
    registry=REGISTRY,
)
GROUP_COMMIT_BATCH = Histogram(
    "hookledger_group_commit_batch_requests",
    "Create requests carried by one group-commit transaction.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 500, 1000),
    registry=REGISTRY,
)
GROUP_COMMIT_SECONDS = Histogram(
    "hookledger_group_commit_seconds",
    "Wall time of one group-commit transaction, from taking its connection to its requests' results"
    " (round trips waiting behind the API's HTTP work included).",
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
COMMIT_OUTCOMES = Counter(
    "hookledger_group_commit_outcomes_resolved_total",
    "Group commits whose COMMIT answer was lost, by what the database said afterwards"
    " (written, not_written, unknown: it could not be asked in time).",
    ["outcome"],
    registry=REGISTRY,
)


class _CreateWrites(Collector):
    """billing.messages' counts of how create batches were written, read at each scrape (billing
    keeps plain counters: it never imports delivery)."""

    def collect(self):
        written = CounterMetricFamily(
            "hookledger_create_batches_written",
            "Create batches that wrote something, by way: direct (one statement that fans out and checks in the"
            " database); unlocked; fell_back (decided again with the accounts"
            " locked, after the unlocked write wrote nothing: an account spent, closed or repriced meanwhile, a"
            " key written meanwhile); in_transaction (locked, inside a caller's transaction).",
            labels=["way"])
        for way in ("direct", "unlocked", "fell_back", "in_transaction"):
            written.add_metric([way], messages.WRITES[way])
        yield written
        declined = CounterMetricFamily(
            "hookledger_create_direct_declined",
            "Direct create writes that wrote nothing (the batch then went the planned way), by reason: not_ok (a"
            " request did not pass: an account inactive or short of credits, a key used before), or the error"
            " the server refused it with.",
            labels=["reason"])
        for reason, count in sorted(messages.DECLINED.items()):
            declined.add_metric([reason], count)
        yield declined
        refused = CounterMetricFamily(
            "hookledger_create_unlocked_refused",
            "Unlocked create writes the server refused (nothing written; the batch was then decided locked), by error.",
            labels=["error"])
        for error, count in sorted(messages.REFUSED.items()):
            refused.add_metric([error], count)
        yield refused


REGISTRY.register(_CreateWrites())

CREDITS_CHARGED = Counter(
    "hookledger_credits_charged",
    "Credits charged for the deliveries of the messages the API accepted (rate(): credits per second).",
    registry=REGISTRY,
)


class _CreditsMoved(Collector):
    """Credits refunded or reclaimed by this process (billing.settle.CREDITS_MOVED), read at each
    scrape: billing keeps plain counters. Worker-side: the workers share it (WORKER_SUMMED)."""

    def __init__(self, kind: str, documentation: str) -> None:
        self._kind = kind
        self._name = f"hookledger_credits_{kind}"
        self._documentation = documentation

    def describe(self):
        return [CounterMetricFamily(self._name, self._documentation)]

    def collect(self):
        yield CounterMetricFamily(self._name, self._documentation, value=settle.CREDITS_MOVED[self._kind])


CREDITS_REFUNDED = _CreditsMoved(
    "refunded", "Credits refunded to accounts by deliveries that died (settle, and account deletions' bulk settle).")
CREDITS_RECLAIMED = _CreditsMoved(
    "reclaimed", "Credits taken back from refunds by deliveries whose late 2xx arrived after they died.")
REGISTRY.register(CREDITS_REFUNDED)
REGISTRY.register(CREDITS_RECLAIMED)

_WORKER_STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
CLAIM_TO_SEND = Histogram(
    "hookledger_worker_claim_to_send_seconds",
    "Seconds from a delivery's claim to its request leaving (the pre-send check, signing, and waiting for"
    " its endpoint's turn).",
    buckets=_WORKER_STEP_BUCKETS,
    registry=REGISTRY,
)
ANSWER_TO_RECORD = Histogram(
    "hookledger_worker_answer_to_record_seconds",
    "Seconds from a receiver's answer (or the send's error) to its result's write committing.",
    buckets=_WORKER_STEP_BUCKETS,
    registry=REGISTRY,
)

# The N endpoints that are furthest behind, read from PostgreSQL at scrape time: per-endpoint
# series for these only, so the number of series stays bounded however many endpoints there are.
WORST_ENDPOINTS_MAX = 10
ENDPOINT_OLDEST_DUE_AGE = Gauge(
    "hookledger_endpoint_oldest_due_delivery_age_seconds",
    f"How long the oldest due delivery of each of the {WORST_ENDPOINTS_MAX} endpoints furthest behind has"
    " been due, read from PostgreSQL at scrape time (the others have no series).",
    ["endpoint"],
    registry=REGISTRY,
)
ENDPOINT_RETRYING = Gauge(
    "hookledger_endpoint_retrying_deliveries",
    f"Pending deliveries that failed at least once, for each of the {WORST_ENDPOINTS_MAX} endpoints with the"
    " most, read from PostgreSQL at scrape time (the others have no series).",
    ["endpoint"],
    registry=REGISTRY,
)


def set_worst_endpoints(gauge: Gauge, rows) -> None:
    """Replace a per-endpoint gauge's series with these (endpoint id, value) rows."""
    gauge.clear()
    for endpoint_id, value in rows:
        gauge.labels(str(endpoint_id)).set(value)


API_REQUESTS = Counter(
    "hookledger_api_requests_total",
    "API requests by route template and status code.",
    ["route", "status"],
    registry=REGISTRY,
)


_STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")


def status_class(status_code: int | None) -> str:
    """The label for ATTEMPTS: '2xx'... or 'error' when the send got no HTTP response."""
    if status_code is None or not 100 <= status_code <= 599:
        return "error"
    return _STATUS_CLASSES[status_code // 100 - 1]


# The audit cron (delivery.platform.worker.audit_cron) sets these after each run.
AUDIT_VIOLATIONS = Gauge(
    "hookledger_audit_violations",
    "Invariant violations (I1-I8) found by the last periodic audit.",
    registry=REGISTRY,
)
AUDIT_NOTICES = Gauge(
    "hookledger_audit_notices",
    "Notices (facts worth a look that break no invariant, e.g. a guard the migrations create that is"
    " missing) found by the last periodic audit.",
    registry=REGISTRY,
)
AUDIT_LAST_RUN = Gauge(
    "hookledger_audit_last_run_timestamp_seconds",
    "Unix time at which the last periodic audit finished.",
    registry=REGISTRY,
)
# The retention cron (delivery.platform.worker.retention_cron) sets these after each run.
RETENTION_BACKLOG = Gauge(
    "hookledger_retention_backlog",
    "Messages whose payload is kept past their account's retention (live ones included), counted after the"
    " last retention run, up to 1,000,000.",
    registry=REGISTRY,
)
RETENTION_ERASED = Gauge(
    "hookledger_retention_last_run_erased",
    "Payloads the last retention run erased (with their attempts' response excerpts).",
    registry=REGISTRY,
)
# The worker's throttle and backpressure (delivery.engine.throttle, delivery.engine.sender) count these.
THROTTLE_SENDS_HELD = Counter(
    "hookledger_throttle_sends_held_total",
    "Sends that waited in a worker for their endpoint's rate limit (rate_limit_per_second) to have room;"
    " they then left, or were given back (hookledger_held_deliveries_given_back_total).",
    registry=REGISTRY,
)
HELD_GIVEN_BACK = Counter(
    "hookledger_held_deliveries_given_back_total",
    "Claims given back unsent (pending again, no attempt spent), by reason: rate_limit (the endpoint's"
    " limit had no room before the claim's hold ended), paused (the endpoint is paused by a Retry-After),"
    " shutdown (the worker stopped while holding it), error (the throttle failed; logged).",
    ["reason"],
    registry=REGISTRY,
)
ENDPOINT_PAUSES = Counter(
    "hookledger_endpoint_pauses_total",
    "Answers (429, 502, 503, 504) whose Retry-After paused their endpoint for every worker.",
    registry=REGISTRY,
)
# The worker (delivery.engine.redis_outage) sets this as its polls reach Redis or fail to.
REDIS_REACHABLE = Gauge(
    "hookledger_worker_redis_reachable",
    "1 while the worker's last poll reached Redis; 0 while it delivers from PostgreSQL alone.",
    registry=REGISTRY,
)


# Counted in the worker processes only. The API publishes them as the workers share them through
# Redis (delivery.engine.metrics_share): the counters and the histogram summed over the live workers, the
# gauges summarized; never its own copies, which would be zeros.
WORKER_SUMMED = (DELIVERIES, ATTEMPTS, DELIVERY_LATENCY, REFUNDS, CREDITS_REFUNDED, CREDITS_RECLAIMED, CLAIM_TO_SEND,
                 ANSWER_TO_RECORD, THROTTLE_SENDS_HELD, HELD_GIVEN_BACK, ENDPOINT_PAUSES)
WORKER_GAUGES = (REDIS_REACHABLE, AUDIT_VIOLATIONS, AUDIT_NOTICES, AUDIT_LAST_RUN, RETENTION_BACKLOG, RETENTION_ERASED)


def count_deaths(reason: str, count: int) -> None:
    """Deliveries that died (and were refunded) for this reason."""
    if count:
        DELIVERIES.labels("dead").inc(count)
        REFUNDS.labels(str(reason)).inc(count)


def count_results(results, summary) -> None:
    """One recorded batch: attempts by status class, deliveries finished, latency of the delivered.

    The latency runs from the delivery's creation, read off its id (a UUIDv7 carries its creation
    time in milliseconds), to now: no extra column or query on the hot path.
    """
    # Counted first and added once per label: labels() takes a lock and builds a key each call,
    # which at a few thousand results a second showed in the worker's profile.
    by_class: dict[str, int] = {}
    recorded_at = time.monotonic()
    observe_record = ANSWER_TO_RECORD.observe
    for result in results:
        label = status_class(result.status_code)
        by_class[label] = by_class.get(label, 0) + 1
        if result.answered_at is not None:
            observe_record(max(0.0, recorded_at - result.answered_at))
    for label, count in by_class.items():
        ATTEMPTS.labels(label).inc(count)
    delivered = [*summary.delivered, *summary.reclaimed]
    if delivered:
        DELIVERIES.labels("delivered").inc(len(delivered))
        now_ms = time.time() * 1000
        observe = DELIVERY_LATENCY.observe
        for delivery_id in delivered:
            observe(max(0.0, now_ms - (delivery_id.int >> 80)) / 1000)
    count_deaths("out_of_retries", len(summary.settled))


def serve(port: int) -> None:
    """Serve this process's metrics on 127.0.0.1:port (the worker; the API serves /metrics itself)."""
    start_http_server(port, addr="127.0.0.1", registry=REGISTRY)
