"""Traces and money metrics where deliveries die, recover and are deleted: real PostgreSQL, a real worker.

Tracing is on in this process, into memory. A delivery that runs out of retries in a real worker
leaves its settle (refunded) under its last attempt, in its message's trace; one the sweep finds
exhausted leaves its settle there too; an account deletion is a trace of its steps; the audit a
span of its own. The credits refunded are counted; the worker's claim-to-send and answer-to-record
histograms observe every send; the per-endpoint series name only the endpoints furthest behind.
"""

from __future__ import annotations

import uuid

import pytest
from prometheus_client import generate_latest

from billing import settle as billing_settle
from billing.messages import MessageRequest, create_message
from delivery import metrics, tracing
from delivery.api import reads
from delivery.engine import claims
from delivery.operations import deletion
from delivery.platform import worker as worker_module
from delivery.store import endpoints
from engine_helpers import PRICE, add_account, add_endpoint, all_finished, running_worker, states, wait_for, keys_of


@pytest.fixture
def exported():
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    assert not tracing.ENABLED
    exporter = InMemorySpanExporter()
    assert tracing.configure("hookledger-test", environment={}, exporter=exporter)

    def spans():
        tracing.flush()
        return exporter.get_finished_spans()

    yield spans
    tracing.shutdown()


def _traced_request():
    """A sampled request span (ended) and the traceparent its message keeps."""
    with tracing.request_span("POST", "/v1/messages", {}) as span:
        traceparent = tracing.traceparent()
    return span, traceparent


def _histogram_count(histogram) -> float:
    return next(sample.value for family in histogram.collect() for sample in family.samples
                if sample.name.endswith("_count"))


async def test_a_delivery_out_of_retries_is_settled_under_its_last_attempt_in_its_message_trace(
        exported, pool, settings, keyring, receiver_factory, arq_queue):
    """Every attempt answered 503: three attempts in the request's trace, the last one dead with a refunded settle;
    the refund counted in credits; each send observed claim-to-send and answer-to-record."""
    receiver = await receiver_factory(lambda number: 503)
    account_id = await add_account(pool)
    endpoint_id = await add_endpoint(pool, account_id, receiver, keyring)
    request, traceparent = _traced_request()
    refunded_before = billing_settle.CREDITS_MOVED["refunded"]
    sends_before = _histogram_count(metrics.CLAIM_TO_SEND), _histogram_count(metrics.ANSWER_TO_RECORD)
    async with running_worker(settings, pool):
        created = await create_message(pool, MessageRequest(account_id, "e", b'{"secret": "s3cr3t"}',
                                                            trace_context=traceparent),
                                       attempts_max=settings.ledger.attempts_max)
        (delivery_id,) = [d.id for d in created.deliveries]
        await arq_queue.wake(await keys_of(pool, [delivery_id]))
        await wait_for(lambda: all_finished(pool, [delivery_id]))
    assert (await states(pool, [delivery_id]))[delivery_id]["dead_reason"] == "out_of_retries"
    assert await pool.fetchval("SELECT trace_context FROM messages WHERE id = $1", created.message_id) == traceparent
    spans = exported()
    trace_id = request.get_span_context().trace_id
    attempts = sorted((span for span in spans if span.name == "delivery.attempt"),
                      key=lambda span: span.attributes["hookledger.attempt"])
    assert [span.attributes["hookledger.attempt"] for span in attempts] == [1, 2, 3]
    assert all(span.context.trace_id == trace_id for span in attempts)
    assert [span.attributes["hookledger.outcome"] for span in attempts] == ["retrying", "retrying", "dead"]
    assert {span.attributes["hookledger.endpoint_id"] for span in attempts} == {str(endpoint_id)}
    (settled,) = [span for span in spans if span.name == "delivery.settle"]
    assert settled.parent.span_id == attempts[-1].context.span_id
    assert settled.attributes["hookledger.dead_reason"] == "out_of_retries"
    assert settled.attributes["hookledger.outcome"] == "refunded"
    sends = [span for span in spans if span.name == "delivery.send"]
    assert [span.attributes["http.response.status_code"] for span in sends] == [503, 503, 503]
    assert all("s3cr3t" not in str(span.attributes) for span in spans)
    assert billing_settle.CREDITS_MOVED["refunded"] - refunded_before == PRICE
    assert _histogram_count(metrics.CLAIM_TO_SEND) - sends_before[0] == 3
    assert _histogram_count(metrics.ANSWER_TO_RECORD) - sends_before[1] == 3


async def test_the_sweep_settles_an_exhausted_delivery_in_its_message_trace(exported, pool, keyring, receiver_factory):
    """Death path 4 (attempts exhausted, found by the sweep): a delivery.settle span under the request."""
    receiver = await receiver_factory()
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring)
    request, traceparent = _traced_request()
    created = await create_message(pool, MessageRequest(account_id, "e", b"{}", trace_context=traceparent), attempts_max=2)
    (delivery_id,) = [d.id for d in created.deliveries]
    await pool.execute("UPDATE deliveries SET attempt = attempts_max WHERE id = $1", delivery_id)
    assert await claims.settle_exhausted(pool, batch_size=10) == 1
    (settled,) = [span for span in exported() if span.name == "delivery.settle"]
    assert settled.context.trace_id == request.get_span_context().trace_id
    assert settled.parent.span_id == request.get_span_context().span_id
    assert settled.attributes["hookledger.delivery_id"] == str(delivery_id)
    assert settled.attributes["hookledger.dead_reason"] == "attempts_exhausted"
    assert settled.attributes["hookledger.outcome"] == "refunded"


async def test_deleting_an_endpoint_settles_its_pending_delivery_in_the_message_trace(exported, pool, keyring,
                                                                                    receiver_factory):
    """Death path 2 at the endpoint's deletion: a delivery.settle span (endpoint_deleted, refunded) under the request."""
    receiver = await receiver_factory()
    account_id = await add_account(pool)
    endpoint_id = await add_endpoint(pool, account_id, receiver, keyring)
    request, traceparent = _traced_request()
    created = await create_message(pool, MessageRequest(account_id, "e", b"{}", trace_context=traceparent), attempts_max=3)
    assert await endpoints.delete_endpoint(pool, account_id, endpoint_id) == 1
    (settled,) = [span for span in exported() if span.name == "delivery.settle"]
    assert settled.parent.span_id == request.get_span_context().span_id
    assert settled.attributes["hookledger.delivery_id"] == str(created.deliveries[0].id)
    assert settled.attributes["hookledger.dead_reason"] == "endpoint_deleted"
    assert settled.attributes["hookledger.outcome"] == "refunded"


async def test_an_account_deletion_is_a_trace_of_its_steps_and_its_refunds_are_counted(
        exported, pool, keyring, receiver_factory):
    """run_deletion: one account_deletion span, its steps under it; the bulk settle's refunds in the credits."""
    receiver = await receiver_factory()
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring)
    await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=3)
    await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=3)
    refunded_before = billing_settle.CREDITS_MOVED["refunded"]
    state = await deletion.run_deletion(pool, account_id)
    assert state.status == "done"
    spans = exported()
    (job,) = [span for span in spans if span.name == "account_deletion"]
    assert job.parent is None and job.attributes["hookledger.account_id"] == str(account_id)
    assert job.attributes["hookledger.outcome"] == "done"
    steps = [span.name for span in sorted(spans, key=lambda span: span.start_time)
             if span.parent is not None and span.parent.span_id == job.context.span_id]
    assert steps == ["account_deletion.begin_closing", "account_deletion.bulk_settle", "account_deletion.close_out",
                     "account_deletion.report"]
    assert billing_settle.CREDITS_MOVED["refunded"] - refunded_before == 2 * PRICE


async def test_the_audit_is_a_span_of_its_own_with_its_counts(exported, pool):
    """The audit cron's run: an audit span, clean, with its violation and notice counts."""
    assert await worker_module.audit_cron({"pool": pool}) == 0
    (audit,) = [span for span in exported() if span.name == "audit"]
    assert audit.parent is None
    assert audit.attributes["hookledger.outcome"] == "clean"
    assert audit.attributes["hookledger.violations"] == 0


async def test_per_endpoint_series_name_only_the_endpoints_furthest_behind(pool, keyring, receiver_factory):
    """Twelve endpoints behind: the ranking returns the worst WORST_ENDPOINTS_MAX by lag and by retrying
    deliveries, worst first, and the gauges carry exactly those endpoints."""
    receiver = await receiver_factory()
    account_id = await add_account(pool, balance=10_000)
    endpoints = [await add_endpoint(pool, account_id, receiver, keyring) for _ in range(12)]
    await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=5)
    # Endpoint k: due for k minutes; the even ones failed once (k retrying deliveries: one each, times k messages).
    for minutes, endpoint_id in enumerate(endpoints, start=1):
        await pool.execute(
            "UPDATE deliveries SET next_attempt_at = now() - $2 * interval '1 minute', attempt = $3"
            " WHERE endpoint_id = $1", endpoint_id, minutes, 1 if minutes % 2 == 0 else 0)
    worst = await reads.worst_endpoints(pool, metrics.WORST_ENDPOINTS_MAX)
    assert [endpoint_id for endpoint_id, _ in worst["lag"]] == list(reversed(endpoints))[:metrics.WORST_ENDPOINTS_MAX]
    ages = [age for _, age in worst["lag"]]
    assert ages == sorted(ages, reverse=True) and 11.9 * 60 < ages[0] < 13 * 60
    assert {endpoint_id for endpoint_id, _ in worst["retrying"]} == set(endpoints[1::2])
    assert all(count == 1 for _, count in worst["retrying"])
    metrics.set_worst_endpoints(metrics.ENDPOINT_OLDEST_DUE_AGE, worst["lag"])
    metrics.set_worst_endpoints(metrics.ENDPOINT_RETRYING, worst["retrying"])
    exposition = generate_latest(metrics.REGISTRY).decode()
    named = {line.split('endpoint="')[1].split('"')[0] for line in exposition.splitlines()
             if line.startswith("hookledger_endpoint_oldest_due_delivery_age_seconds{")}
    assert named == {str(endpoint_id) for endpoint_id, _ in worst["lag"]}
    assert str(endpoints[0]) not in named and str(endpoints[1]) not in named
    # Refreshed, not accumulated: a ranking without them takes their series away.
    metrics.set_worst_endpoints(metrics.ENDPOINT_OLDEST_DUE_AGE, [(uuid.UUID(int=7), 1.0)])
    exposition = generate_latest(metrics.REGISTRY).decode()
    assert [line for line in exposition.splitlines()
            if line.startswith("hookledger_endpoint_oldest_due_delivery_age_seconds{")] == [
        f'hookledger_endpoint_oldest_due_delivery_age_seconds{{endpoint="{uuid.UUID(int=7)}"}} 1.0']
    metrics.set_worst_endpoints(metrics.ENDPOINT_OLDEST_DUE_AGE, [])
    metrics.set_worst_endpoints(metrics.ENDPOINT_RETRYING, [])
