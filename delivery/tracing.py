"""OpenTelemetry traces: off unless the standard OTEL_* environment turns them on.

Off (the default), `ENABLED` is False, nothing of OpenTelemetry is imported, and every hot-path
caller tests that one flag before calling in here (the helpers that run once per batch or per
operator job check it themselves and hand back a shared do-nothing context). On
(`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` set, or
`OTEL_TRACES_EXPORTER=otlp`; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` keep it off),
spans go to the OTLP/HTTP exporter in batches; the SDK itself reads the sampler
(`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`), the service name (`OTEL_SERVICE_NAME`, else
hookledger-api or hookledger-worker), the resource attributes and the exporter's settings.

One message, one trace. The API request's span (SERVER) is the root; its W3C `traceparent` is
written with the message (messages.trace_context) when it is sampled, so every attempt of every
delivery of the message, however much later and on whichever worker, joins that trace:

    POST /v1/messages                      the request; a link to the batch that wrote it
    delivery.attempt  (one per attempt)    account, endpoint, delivery, attempt, outcome
      delivery.claim                       the claim statement that leased it
      delivery.send                        the HTTP request: status code, latency
      delivery.record                      the fenced write of its result
      delivery.settle / delivery.reclaim   when it dies (refunded) or a late 2xx recovers it

The group commit's transaction is a span of its own trace (`group_commit.batch`), since one batch
writes many requests: it links to each request it carries, and each request links back to it. It is
recorded whenever a request it carries is sampled. A death or recovery found by the sweep
(attempts exhausted, a late success reclaimed) is a span in the message's trace too; operator jobs
(each account-deletion step, the audit) are traces of their own.

Attributes name ids, numbers and outcomes; never a payload, a header, a response body, a URL or a
secret. Log lines written while a span is current carry its trace_id and span_id.

A floor module: it imports none of delivery's parts; the engine, the API and the operations call it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

logger = logging.getLogger(__name__)

ENABLED = False  # True once configure() turned tracing on: the one flag hot paths test
ATTEMPTS_OPEN_MAX = 100_000  # attempt spans held between claim and record; past it, attempts go untraced
BATCH_LINKS_MAX = 100_000  # batch contexts waiting for their requests to link back; past it, cleared
PREFIX = "hookledger."

NO_SPAN = contextlib.nullcontext()  # what the span helpers hand back while tracing is off

_tracer: Any = None  # spans, sampled by the configured sampler
_linked_tracer: Any = None  # spans recorded because something they link to is (group-commit batches)
_provider: Any = None
_linked_provider: Any = None
_propagator: Any = None
_root: Any = None  # an empty context: what a span of its own trace starts from, whatever task it starts in
_api: Any = None  # opentelemetry.trace, once imported
_attempts: dict[tuple[uuid.UUID, int], Any] = {}  # (delivery, attempt) -> its open delivery.attempt span
_batch_links: dict[str, Any] = {}  # a request's traceparent -> the span context of the batch that carries it


def requested(environment: dict[str, str] | os._Environ = os.environ) -> bool:
    """Whether the standard OpenTelemetry environment asks for traces to be exported."""
    if environment.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environment.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(environment.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environment.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or exporter == "otlp")


def configure(service_name: str, *, environment: dict[str, str] | os._Environ = os.environ,
              exporter: Any = None) -> bool:
    """Turn tracing on if the environment asks for it (or an exporter is given); whether it is on.

    Called once per process, before serving (the API, the worker, a benchmark). `exporter`: a
    SpanExporter to use instead of OTLP/HTTP (a benchmark's or a test's)."""
    global ENABLED, _tracer, _linked_tracer, _provider, _linked_provider, _propagator, _api, _root
    if ENABLED:
        return True
    if exporter is None and not requested(environment):
        return False
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporter = OTLPSpanExporter()
    attributes = {} if environment.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    resource = Resource.create(attributes)
    processor = BatchSpanProcessor(exporter)
    _provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER (default parent-based, on)
    _provider.add_span_processor(processor)
    _linked_provider = TracerProvider(resource=resource, sampler=ALWAYS_ON, shutdown_on_exit=False)
    _linked_provider.add_span_processor(processor)
    _tracer = _provider.get_tracer("hookledger")
    _linked_tracer = _linked_provider.get_tracer("hookledger")
    _propagator = TraceContextTextMapPropagator()
    _api = trace
    _root = Context()
    ENABLED = True
    return True


def flush(timeout_seconds: float = 10.0) -> bool:
    """Export every span ended so far (a test, a benchmark, a process about to exit)."""
    if not ENABLED:
        return True
    return _provider.force_flush(int(timeout_seconds * 1000))


def shutdown() -> None:
    """Export what is left and turn tracing off (tests and benchmarks that configure it more than once)."""
    global ENABLED, _tracer, _linked_tracer, _provider, _linked_provider
    if not ENABLED:
        return
    ENABLED = False
    _provider.shutdown()
    _tracer = _linked_tracer = _provider = _linked_provider = None
    _attempts.clear()
    _batch_links.clear()


# ---- ids and times --------------------------------------------------------------------------------------------

def _attributes(**values: object) -> dict[str, object]:
    """Span attributes under our prefix, ids as text, None left out."""
    return {PREFIX + name: (str(value) if isinstance(value, uuid.UUID) else value)
            for name, value in values.items() if value is not None}


def _wall_ns(monotonic: float | None) -> int | None:
    """A time.monotonic() reading as the Unix nanoseconds spans carry (None: now)."""
    if monotonic is None:
        return None
    return time.time_ns() - int((time.monotonic() - monotonic) * 1e9)


def _context_of(traceparent: str | None) -> Any:
    """The OpenTelemetry context a stored traceparent names, or None when it names none."""
    if not traceparent:
        return None
    context = _propagator.extract({"traceparent": traceparent})
    if not _api.get_current_span(context).get_span_context().is_valid:
        return None
    return context


def traceparent() -> str | None:
    """The current span's W3C traceparent when it is sampled (what a message keeps), else None."""
    if not ENABLED:
        return None
    span_context = _api.get_current_span().get_span_context()
    if not span_context.is_valid or not span_context.trace_flags.sampled:
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


def current_ids() -> tuple[str, str] | None:
    """The current span's trace id and span id in hex, or None when no span is current."""
    if not ENABLED:
        return None
    span_context = _api.get_current_span().get_span_context()
    if not span_context.is_valid:
        return None
    return format(span_context.trace_id, "032x"), format(span_context.span_id, "016x")


def set_attributes(**values: object) -> None:
    """Add attributes to the current span (say the account, once the request is authenticated)."""
    if ENABLED:
        span = _api.get_current_span()
        if span.is_recording():
            span.set_attributes(_attributes(**values))


# ---- the API request and the group commit -----------------------------------------------------------------------

# Probes and scrapes (every few seconds, from Prometheus and the orchestrator) would bury the
# requests worth a trace: they get no span.
UNTRACED_ROUTES = frozenset({"/metrics", "/healthz", "/readyz"})


def request_span(method: str, route: str, headers) -> contextlib.AbstractContextManager:
    """The API request's span (SERVER), current while the handler runs; continues an incoming
    `traceparent` header. The caller sets its status code on the span it gets (None: no span)."""
    if route in UNTRACED_ROUTES:
        return NO_SPAN
    return _request_span(method, route, headers)


@contextlib.contextmanager
def _request_span(method: str, route: str, headers) -> Iterator[Any]:
    context = _propagator.extract(headers) if "traceparent" in headers else None
    with _tracer.start_as_current_span(f"{method} {route}", context=context, kind=_api.SpanKind.SERVER,
                                       attributes={"http.request.method": method, "http.route": route},
                                       record_exception=False, set_status_on_exception=False) as span:
        yield span


def request_answered(span: Any, status: int) -> None:
    if span is None:
        return
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(_api.Status(_api.StatusCode.ERROR))


def batch_span(traceparents: list[str | None]) -> contextlib.AbstractContextManager:
    """The span of one group-commit transaction, linked to every sampled request it carries (and
    each of them, through link_batch, to it); none when no request it carries is sampled."""
    if not ENABLED:
        return NO_SPAN
    sampled = {}  # traceparent -> the request span's context
    for traceparent_value in traceparents:
        context = _span_context_of(traceparent_value)
        if context is not None and context.trace_flags.sampled:
            sampled[traceparent_value] = context
    if not sampled:
        return NO_SPAN
    links = [_api.Link(context) for context in sampled.values()]
    # From an empty context: the batch's task was started by one request's handler, whose span
    # would otherwise be its parent.
    span = _linked_tracer.start_span("group_commit.batch", context=_root, links=links,
                                     attributes=_attributes(batch_requests=len(traceparents)))
    if len(_batch_links) >= BATCH_LINKS_MAX:  # requests that never came back for theirs (cancelled)
        _batch_links.clear()
    batch_context = span.get_span_context()
    for traceparent_value in sampled:
        _batch_links[traceparent_value] = batch_context
    return _api.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=True)


def _span_context_of(traceparent_value: str | None) -> Any:
    context = _context_of(traceparent_value)
    return None if context is None else _api.get_current_span(context).get_span_context()


def link_batch(traceparent_value: str | None) -> None:
    """Link the current request's span to the group-commit batch that carried it."""
    if not ENABLED or not traceparent_value:
        return
    batch_context = _batch_links.pop(traceparent_value, None)
    if batch_context is not None:
        _api.get_current_span().add_link(batch_context, {PREFIX + "link": "group_commit.batch"})


# ---- the worker: claim, send, record, settle -----------------------------------------------------------------

async def traced_batch(loaded: list, claimed_at: float, process: Awaitable):
    """Open a delivery.attempt span (and its delivery.claim) for each claimed delivery whose message
    has a sampled trace context, await `process` (check, send, record), then end the attempts that
    were never recorded (settled before the send, given up at shutdown): outcome not_recorded.

    `loaded`: the claim's (Claimed, row) pairs, the row carrying the message's trace_context."""
    claim_started = _wall_ns(claimed_at)
    claim_ended = time.time_ns()
    keys = []
    for claimed, row in loaded:
        context = _context_of(row["trace_context"])
        if context is None or len(_attempts) >= ATTEMPTS_OPEN_MAX:
            continue
        attempt = _tracer.start_span(
            "delivery.attempt", context=context, start_time=claim_started,
            attributes=_attributes(account_id=claimed.account_id, endpoint_id=claimed.endpoint_id,
                                   delivery_id=claimed.id, message_id=claimed.message_id, attempt=claimed.attempt))
        if not attempt.is_recording():
            continue
        _child(attempt, "delivery.claim", claim_started, claim_ended, {})
        key = (claimed.id, claimed.attempt)
        _attempts[key] = attempt
        keys.append(key)
    try:
        return await process
    finally:
        for key in keys:
            attempt = _attempts.pop(key, None)
            if attempt is not None:
                if PREFIX + "outcome" not in attempt.attributes:
                    attempt.set_attribute(PREFIX + "outcome", "not_recorded")
                attempt.end()


def _child(parent: Any, name: str, start_ns: int | None, end_ns: int | None, attributes: dict, kind: Any = None) -> Any:
    span = _tracer.start_span(name, context=_api.set_span_in_context(parent), start_time=start_ns,
                              attributes=attributes, kind=kind or _api.SpanKind.INTERNAL)
    span.end(end_time=end_ns)
    return span


def traced_record(record: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """`record` (delivery.engine.results.record_results) that also ends the traced attempts it
    records: each gets its delivery.send and delivery.record spans and its outcome."""

    async def traced(pool, results, *, connection=None):
        started = time.monotonic()
        summary = await record(pool, results, connection=connection)
        _recorded(results, summary, _wall_ns(started), time.time_ns())
        return summary

    return traced


_OUTCOMES = ("delivered", "retrying", "settled", "stale", "reclaimed", "released")
_OUTCOME_NAMES = {"settled": "dead", "reclaimed": "delivered_after_refund"}


def _recorded(results: list, summary: Any, started_ns: int, ended_ns: int) -> None:
    if not _attempts:
        return
    outcomes: dict[uuid.UUID, str] = {}
    for outcome in _OUTCOMES:
        for delivery_id in getattr(summary, outcome):
            outcomes[delivery_id] = _OUTCOME_NAMES.get(outcome, outcome)
    for result in results:
        attempt = _attempts.pop((result.delivery_id, result.attempt), None)
        if attempt is None:
            continue
        outcome = outcomes.get(result.delivery_id, "not_applied")
        if not result.released:
            send = _attributes(latency_ms=result.latency_ms, outcome="success" if result.success else "failure")
            if result.status_code is not None:
                send["http.response.status_code"] = result.status_code
            else:
                send["error.type"] = "no_response"
            _child(attempt, "delivery.send", _wall_ns(result.sent_at) or started_ns,
                   _wall_ns(result.answered_at) or started_ns, send, _api.SpanKind.CLIENT)
        _child(attempt, "delivery.record", started_ns, ended_ns, _attributes(outcome=outcome))
        attempt.set_attribute(PREFIX + "outcome", outcome)
        if not result.success and not result.released:
            attempt.set_status(_api.Status(_api.StatusCode.ERROR))
        attempt.end(end_time=ended_ns)


def attempt_span(name: str, delivery_id: uuid.UUID, attempt: int, **values: object) -> contextlib.AbstractContextManager:
    """A span under the open delivery.attempt of (delivery_id, attempt), say its settle; none when
    that attempt is not traced."""
    if not ENABLED:
        return NO_SPAN
    parent = _attempts.get((delivery_id, attempt))
    if parent is None:
        return NO_SPAN
    return _tracer.start_as_current_span(name, context=_api.set_span_in_context(parent),
                                         attributes=_attributes(delivery_id=delivery_id, attempt=attempt, **values))


def message_span(name: str, trace_context: str | None, **values: object) -> contextlib.AbstractContextManager:
    """A span in a message's trace, from its stored trace context (the sweep's settle or reclaim);
    none when the message has none."""
    if not ENABLED:
        return NO_SPAN
    context = _context_of(trace_context)
    if context is None:
        return NO_SPAN
    return _tracer.start_as_current_span(name, context=context, attributes=_attributes(**values))


def set_outcome(span: Any, outcome: object) -> None:
    """Set the outcome of a span a helper here handed out (None while tracing is off: nothing)."""
    if span is not None:
        span.set_attribute(PREFIX + "outcome", str(outcome))


# ---- operator jobs -------------------------------------------------------------------------------------------

def job_span(name: str, *, step: bool = False, **values: object) -> contextlib.AbstractContextManager:
    """The span of an operator job (account deletion, the audit), the root of a trace of its own, or
    with `step`, of one of its steps (under the job's span, current while the step runs)."""
    if not ENABLED:
        return NO_SPAN
    return _tracer.start_as_current_span(name, context=None if step else _root, attributes=_attributes(**values))


# ---- logs ----------------------------------------------------------------------------------------------------

def add_trace_ids(_logger: object, _method: str, event: dict) -> dict:
    """structlog processor: the current span's trace_id and span_id on every line written under it."""
    ids = current_ids()
    if ids is not None:
        event.setdefault("trace_id", ids[0])
        event.setdefault("span_id", ids[1])
    return event


class TraceIdsFilter(logging.Filter):
    """For plain-text logging (the worker's): ` trace_id=... span_id=...` after a line written under a span."""

    def filter(self, record: logging.LogRecord) -> bool:
        ids = current_ids()
        if ids is not None and not getattr(record, "trace_id", None):
            record.msg = f"{record.getMessage()} trace_id={ids[0]} span_id={ids[1]}"
            record.args = ()
            record.trace_id = ids[0]
        return True


def log_processors() -> list[Callable]:
    """The structlog processors tracing adds (none while it is off)."""
    return [add_trace_ids] if ENABLED else []
