"""delivery.tracing: off unless the OTEL_* environment asks, and then free; on, the worker's spans.

Off is checked in a fresh interpreter that imports the API, the worker and the engine and builds
what they build at start: nothing of OpenTelemetry is imported, every helper hands back the shared
do-nothing context, and no message carries a trace context. On, with an in-memory exporter: the
spans of one claimed batch, from the claim to the record, each in its message's trace.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from delivery import tracing
from delivery.engine.claims import Claimed
from delivery.engine.results import AttemptResult, RecordSummary

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("environment, on", [
    ({}, False),
    ({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, False),  # no exporter named: off
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "TRUE "}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, False),
])
def test_only_the_standard_environment_naming_an_exporter_turns_traces_on(environment, on):
    """Tracing is requested exactly when an OTLP endpoint (or the otlp exporter) is named and the SDK not disabled."""
    assert tracing.requested(environment) is on


_OFF = textwrap.dedent("""
    import asyncio, sys, uuid
    from delivery import tracing
    from delivery.api import logs, middleware, routes_messages, group_commit
    from delivery.engine import pipeline, results, claims, presend
    from delivery.operations import deletion
    from delivery.platform import api_server, web_app, worker
    from billing.messages import MessageRequest

    assert tracing.configure("hookledger-test") is False
    logs.configure("info")
    assert tracing.ENABLED is False
    assert tracing.log_processors() == []
    assert tracing.traceparent() is None and tracing.current_ids() is None
    assert tracing.batch_span(["00-" + "1" * 32 + "-" + "2" * 16 + "-01"]) is tracing.NO_SPAN
    assert tracing.attempt_span("delivery.settle", uuid.uuid4(), 1) is tracing.NO_SPAN
    assert tracing.message_span("delivery.settle", "00-" + "1" * 32 + "-" + "2" * 16 + "-01") is tracing.NO_SPAN
    assert tracing.job_span("audit") is tracing.NO_SPAN
    with tracing.job_span("audit") as span:
        tracing.set_outcome(span, "clean")
        tracing.set_attributes(account_id=uuid.uuid4())
        tracing.link_batch("anything")
    assert span is None
    assert MessageRequest(uuid.uuid4(), "e", b"{}").trace_context is None
    loaded = [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]
    assert loaded == [], loaded
    print("off")
""")


def test_off_by_default_imports_nothing_of_opentelemetry_and_every_helper_is_the_null_context():
    """Without OTEL_* variables, the API, the worker and the engine load and run without OpenTelemetry."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith("OTEL_")}
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), environment.get("PYTHONPATH", "")])
    completed = subprocess.run([sys.executable, "-c", _OFF], cwd=ROOT, env=environment, capture_output=True,
                               text=True, timeout=120)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert completed.stdout.strip().endswith("off")


@pytest.fixture
def exported():
    """Tracing on in this process, into memory; the spans ended so far, by a call."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    assert not tracing.ENABLED
    exporter = InMemorySpanExporter()
    assert tracing.configure("hookledger-test", environment={}, exporter=exporter)

    def spans():
        tracing.flush()
        return exporter.get_finished_spans()

    yield spans
    tracing.shutdown()
    assert not tracing.ENABLED


def _request_span():
    """A sampled request span, ended, and the traceparent a message of it would keep."""
    with tracing.request_span("POST", "/v1/messages", {}) as span:
        traceparent = tracing.traceparent()
        tracing.request_answered(span, 202)
    return span, traceparent


def _claimed(attempt: int = 1) -> Claimed:
    return Claimed(uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), uuid.uuid4(), attempt, 3)


async def test_a_claimed_batch_leaves_one_attempt_span_per_traced_delivery_with_claim_send_and_record(exported):
    """Each traced delivery: delivery.attempt under its request, with claim, send and record, and its outcome;
    a delivery whose message has no trace context leaves no span; an attempt never recorded ends not_recorded."""
    request, traceparent = _request_span()
    other_request, other_traceparent = _request_span()
    sent, failed, untraced, unrecorded = _claimed(), _claimed(2), _claimed(), _claimed()
    loaded = [(sent, {"trace_context": traceparent}), (failed, {"trace_context": other_traceparent}),
              (untraced, {"trace_context": None}), (unrecorded, {"trace_context": traceparent})]

    async def record(pool, results, *, connection=None):
        return RecordSummary(delivered=[sent.id], retrying=[failed.id])

    async def process():
        await asyncio.sleep(0.03)  # the sends left after the claim had ended
        now = time.monotonic()
        results = [AttemptResult(sent.id, 1, sent.account_id, True, 12, 200, sent_at=now - 0.02, answered_at=now - 0.01),
                   AttemptResult(failed.id, 2, failed.account_id, False, 5, None, "connection refused",
                                 sent_at=now - 0.01, answered_at=now),
                   AttemptResult(untraced.id, 1, untraced.account_id, True, 3, 200)]
        return await tracing.traced_record(record)(None, results)

    summary = await tracing.traced_batch(loaded, time.monotonic() - 0.05, process())
    assert summary.delivered == [sent.id]
    assert tracing._attempts == {}  # none left open
    spans = exported()
    attempts = {span.attributes["hookledger.delivery_id"]: span for span in spans if span.name == "delivery.attempt"}
    assert set(attempts) == {str(sent.id), str(failed.id), str(unrecorded.id)}
    assert attempts[str(sent.id)].parent.span_id == request.get_span_context().span_id
    assert attempts[str(sent.id)].context.trace_id == request.get_span_context().trace_id
    assert attempts[str(failed.id)].context.trace_id == other_request.get_span_context().trace_id
    assert {id_: span.attributes["hookledger.outcome"] for id_, span in attempts.items()} == {
        str(sent.id): "delivered", str(failed.id): "retrying", str(unrecorded.id): "not_recorded"}
    assert attempts[str(failed.id)].attributes["hookledger.attempt"] == 2
    assert attempts[str(sent.id)].attributes["hookledger.endpoint_id"] == str(sent.endpoint_id)
    assert attempts[str(sent.id)].attributes["hookledger.account_id"] == str(sent.account_id)
    children = {}
    for span in spans:
        if span.parent is not None and span.name in ("delivery.claim", "delivery.send", "delivery.record"):
            children.setdefault(span.parent.span_id, {})[span.name] = span
    for delivery_id in (sent.id, failed.id):
        own = children[attempts[str(delivery_id)].context.span_id]
        assert sorted(own) == ["delivery.claim", "delivery.record", "delivery.send"]
        assert own["delivery.claim"].end_time <= own["delivery.send"].start_time <= own["delivery.send"].end_time
    sent_children = children[attempts[str(sent.id)].context.span_id]
    assert sent_children["delivery.send"].attributes["http.response.status_code"] == 200
    assert sent_children["delivery.send"].attributes["hookledger.latency_ms"] == 12
    failed_send = children[attempts[str(failed.id)].context.span_id]["delivery.send"]
    assert failed_send.attributes["error.type"] == "no_response" and "http.response.status_code" not in failed_send.attributes
    # What the send said in words is not exported (an error may quote a URL, and a URL may carry a token).
    assert all("connection refused" not in str(span.attributes) for span in spans)
    assert sorted(children[attempts[str(unrecorded.id)].context.span_id]) == ["delivery.claim"]


def test_a_batch_span_is_its_own_trace_linked_both_ways_to_the_sampled_requests_it_carries(exported):
    """group_commit.batch: a root, linked to each sampled request, each of which links back once."""
    carried = []
    for _ in range(2):
        with tracing.request_span("POST", "/v1/messages", {}):
            carried.append(tracing.traceparent())
    with tracing.request_span("POST", "/v1/messages", {}) as request:
        traceparent = tracing.traceparent()
        with tracing.batch_span([traceparent, None, *carried]):
            pass
        tracing.link_batch(traceparent)
        tracing.link_batch(traceparent)  # once only: the batch's context was handed out
    (batch,) = [span for span in exported() if span.name == "group_commit.batch"]
    assert batch.parent is None and batch.context.trace_id != request.get_span_context().trace_id
    assert batch.attributes["hookledger.batch_requests"] == 4
    assert request.get_span_context().span_id in {link.context.span_id for link in batch.links}
    assert len(batch.links) == 3
    (back,) = request.links
    assert back.context.span_id == batch.context.span_id


def test_no_batch_span_when_no_request_it_carries_is_sampled(exported):
    """A batch of unsampled (or untraced) requests records nothing."""
    unsampled = "00-" + "a" * 32 + "-" + "b" * 16 + "-00"
    assert tracing.batch_span([None, unsampled]) is tracing.NO_SPAN
    assert exported() == ()


def test_log_lines_under_a_span_carry_its_ids(exported):
    """The structlog processor adds trace_id and span_id under a span, nothing outside one."""
    assert tracing.add_trace_ids(None, "info", {}) == {}
    with tracing.job_span("audit") as span:
        event = tracing.add_trace_ids(None, "info", {"event": "x"})
    assert event["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert event["span_id"] == format(span.get_span_context().span_id, "016x")
    assert tracing.log_processors() == [tracing.add_trace_ids]


def test_job_steps_sit_under_their_job_which_is_a_trace_of_its_own(exported):
    """An operator job is a root even when started under another span; its steps are its children."""
    with tracing.request_span("POST", "/x", {}):
        with tracing.job_span("account_deletion", account_id=uuid.UUID(int=1)) as job:
            with tracing.job_span("account_deletion.bulk_settle", step=True) as step:
                pass
    assert job.parent is None
    assert step.parent.span_id == job.get_span_context().span_id
    assert job.attributes["hookledger.account_id"] == str(uuid.UUID(int=1))


def test_a_stored_trace_context_that_names_no_trace_gives_no_span(exported):
    """A malformed or empty stored context is ignored: no span, no error."""
    for stored in (None, "", "garbage", "00-" + "0" * 32 + "-" + "0" * 16 + "-01"):
        assert tracing.message_span("delivery.settle", stored) is tracing.NO_SPAN


def test_a_request_continues_the_trace_its_caller_sent(exported):
    """An incoming W3C traceparent header makes the request's span a child of the caller's, in its trace;
    what the message keeps then names the caller's trace."""
    from multidict import CIMultiDict

    caller = "00-" + "c" * 32 + "-" + "d" * 16 + "-01"
    with tracing.request_span("POST", "/v1/messages", CIMultiDict({"TraceParent": caller})) as span:
        kept = tracing.traceparent()
    assert format(span.get_span_context().trace_id, "032x") == "c" * 32
    assert format(span.parent.span_id, "016x") == "d" * 16
    assert kept.split("-")[1] == "c" * 32 and kept.split("-")[2] == format(span.get_span_context().span_id, "016x")


def test_the_workers_text_log_lines_under_a_span_end_with_its_ids(exported):
    """TraceIdsFilter (the worker's plain-text logging): the ids after a line written under a span, none outside."""
    import io
    import logging

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(tracing.TraceIdsFilter())
    logger = logging.getLogger("hookledger.test_tracing")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("outside %s", "any span")
        with tracing.job_span("audit") as span:
            logger.warning("inside %s", "the audit")
    finally:
        logger.removeHandler(handler)
    ids = span.get_span_context()
    assert stream.getvalue().splitlines() == [
        "outside any span",
        f"inside the audit trace_id={ids.trace_id:032x} span_id={ids.span_id:016x}"]


def test_probes_and_scrapes_get_no_span(exported):
    """/metrics, /healthz and /readyz: no request span (they would bury the requests worth a trace)."""
    for route in ("/metrics", "/healthz", "/readyz"):
        with tracing.request_span("GET", route, {}) as span:
            tracing.request_answered(span, 200)
        assert span is None
    with tracing.request_span("GET", "/v1/deliveries", {}) as span:
        tracing.request_answered(span, 503)
    (only,) = exported()
    assert only.name == "GET /v1/deliveries" and only.attributes["http.response.status_code"] == 503
    assert not only.status.is_ok
