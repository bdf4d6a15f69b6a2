"""The delivery engine end to end: a real arq worker, real Redis, real PostgreSQL, real receivers."""

from __future__ import annotations

import asyncio
import contextlib
import types

from aiohttp import web

from billing.audit import audit
from billing.messages import MessageRequest, create_message
from engine_helpers import (PRICE, add_account, add_endpoint, all_finished, keys_of, ledger_of, running_worker, states,
                             wait_for)


async def _send(pool, settings, account_id, arq_queue, event_type="order.paid", payload=b'{"n": 1}'):
    created = await create_message(pool, MessageRequest(account_id, event_type, payload),
                                   attempts_max=settings.ledger.attempts_max)
    await arq_queue.wake(await keys_of(pool, [d.id for d in created.deliveries]))
    return [d.id for d in created.deliveries]


async def test_created_delivery_arrives_signed_and_is_paid_once(pool, settings, keyring, receiver_factory, arq_queue):
    """create -> worker -> the receiver verifies the Standard Webhooks signature -> delivered, net -price."""
    receiver = await receiver_factory()
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring)
    async with running_worker(settings, pool):
        (delivery_id,) = await _send(pool, settings, account_id, arq_queue, payload=b'{"invoice": 42}')
        await wait_for(lambda: all_finished(pool, [delivery_id]))
    assert (await states(pool, [delivery_id]))[delivery_id]["state"] == "delivered"
    assert receiver.verified == 1 and len(receiver.received) == 1
    request = receiver.received[0]
    assert request["id"] == str(delivery_id)
    assert request["body"] == b'{"invoice": 42}'
    assert request["headers"]["Content-Type"] == "application/json"
    assert request["headers"]["User-Agent"].startswith("hookledger/")
    assert await ledger_of(pool, delivery_id) == {"charge": -PRICE}
    assert (await audit(pool)).clean


async def test_flaky_receiver_is_retried_until_it_succeeds(pool, settings, keyring, receiver_factory, arq_queue):
    """A receiver that fails twice then answers 200: three attempts recorded, delivered, charged once."""
    receiver = await receiver_factory(lambda number: 500 if number <= 2 else 200)
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring)
    async with running_worker(settings, pool):
        (delivery_id,) = await _send(pool, settings, account_id, arq_queue)
        await wait_for(lambda: all_finished(pool, [delivery_id]))
    assert (await states(pool, [delivery_id]))[delivery_id]["state"] == "delivered"
    attempts = await pool.fetch("SELECT attempt, status_code FROM delivery_attempts WHERE delivery_id = $1"
                                " ORDER BY attempt", delivery_id)
    assert [(a["attempt"], a["status_code"]) for a in attempts] == [(1, 500), (2, 500), (3, 200)]
    assert await ledger_of(pool, delivery_id) == {"charge": -PRICE}


async def test_always_failing_receiver_dies_after_the_schedule_and_is_refunded_once(
        pool, settings, keyring, receiver_factory, arq_queue):
    """Death path 1 through the worker: every attempt fails -> dead (out_of_retries), one refund."""
    receiver = await receiver_factory(lambda number: 503)
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring)
    async with running_worker(settings, pool) as worker:
        await wait_for(lambda: asyncio.sleep(0, "engine" in worker.ctx))
        sweeps = _count_sweeps(worker.ctx["engine"])
        (delivery_id,) = await _send(pool, settings, account_id, arq_queue)
        await wait_for(lambda: all_finished(pool, [delivery_id]))
        # A whole sweep runs after the delivery died (counted, not hoped for in a sleep): it must add nothing.
        started_before = sweeps.started
        await wait_for(lambda: asyncio.sleep(0, any(number > started_before for number in sweeps.finished)))
    row = (await states(pool, [delivery_id]))[delivery_id]
    assert (row["state"], row["dead_reason"], row["attempt"]) == ("dead", "out_of_retries", 3)
    assert len(receiver.received) == 3
    assert await ledger_of(pool, delivery_id) == {"charge": -PRICE, "refund": PRICE}
    assert (await audit(pool)).clean


def _count_sweeps(engine) -> types.SimpleNamespace:
    """Number the engine's sweeps as they start (the sweep cron calls engine.sweep) and list those that ended."""
    sweeps = types.SimpleNamespace(started=0, finished=[])
    sweep = engine.sweep

    async def counted() -> int:
        sweeps.started += 1
        number = sweeps.started
        processed = await sweep()
        sweeps.finished.append(number)
        return processed

    engine.sweep = counted
    return sweeps


async def test_gone_disables_the_endpoint_and_its_pending_deliveries_die_refunded(
        pool, settings, keyring, receiver_factory, arq_queue):
    """410 Gone disables the endpoint; a later delivery to it dies at the pre-send check (endpoint_disabled)."""
    receiver = await receiver_factory(lambda number: 410)
    account_id = await add_account(pool)
    endpoint_id = await add_endpoint(pool, account_id, receiver, keyring)
    async with running_worker(settings, pool):
        (first,) = await _send(pool, settings, account_id, arq_queue)
        await wait_for(lambda: pool.fetchval("SELECT NOT enabled FROM endpoints WHERE id = $1", endpoint_id))
        await wait_for(lambda: all_finished(pool, [first]))
    endpoint = await pool.fetchrow("SELECT enabled, disabled_reason FROM endpoints WHERE id = $1", endpoint_id)
    assert endpoint["enabled"] is False and "410" in endpoint["disabled_reason"]
    row = (await states(pool, [first]))[first]
    assert (row["state"], row["dead_reason"]) == ("dead", "endpoint_disabled")
    assert len(receiver.received) == 1
    assert await ledger_of(pool, first) == {"charge": -PRICE, "refund": PRICE}


async def test_slow_receiver_past_the_timeout_is_a_failed_attempt(pool, settings, keyring, receiver_factory, arq_queue):
    """A receiver slower than the endpoint's timeout: each attempt fails with a timeout error."""

    async def stall(number):
        await asyncio.sleep(3)
        return 200

    receiver = await receiver_factory(stall)
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring, timeout_ms=1000)
    async with running_worker(settings, pool):
        (delivery_id,) = await _send(pool, settings, account_id, arq_queue)
        await wait_for(lambda: all_finished(pool, [delivery_id]), timeout_seconds=30)
    errors = await pool.fetch("SELECT error, status_code FROM delivery_attempts WHERE delivery_id = $1", delivery_id)
    assert len(errors) == 3
    assert all(row["status_code"] is None and "timeout" in row["error"] for row in errors)
    assert (await states(pool, [delivery_id]))[delivery_id]["dead_reason"] == "out_of_retries"


async def test_connection_closed_by_the_receiver_is_a_failed_attempt(pool, settings, keyring, receiver_factory, arq_queue):
    """A receiver that drops the connection without answering: failed attempts, then dead and refunded."""
    receiver = await receiver_factory(lambda number: "drop")
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring)
    async with running_worker(settings, pool):
        (delivery_id,) = await _send(pool, settings, account_id, arq_queue)
        await wait_for(lambda: all_finished(pool, [delivery_id]))
    attempts = await pool.fetch("SELECT status_code, error FROM delivery_attempts WHERE delivery_id = $1", delivery_id)
    assert attempts and all(row["status_code"] is None and row["error"] for row in attempts)
    assert (await states(pool, [delivery_id]))[delivery_id]["state"] == "dead"


async def test_retry_after_is_honoured(pool, settings, keyring, receiver_factory, arq_queue):
    """429 with Retry-After: 2 -> the next attempt is not before 2 s, although the backoff says 0.2 s."""
    receiver = await receiver_factory(
        lambda number: web.Response(status=429, headers={"Retry-After": "2"}) if number == 1 else 200)
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring)
    async with running_worker(settings, pool):
        (delivery_id,) = await _send(pool, settings, account_id, arq_queue)
        await wait_for(lambda: all_finished(pool, [delivery_id]), timeout_seconds=20)
    rows = await pool.fetch("SELECT attempt, status_code, error, finished_at, started_at FROM delivery_attempts"
                            " WHERE delivery_id = $1"
                            " ORDER BY attempt", delivery_id)
    assert len(rows) == 2, [dict(row) for row in rows]
    gap = (rows[1]["started_at"] - rows[0]["finished_at"]).total_seconds()
    assert gap >= 1.9, [dict(row) for row in rows]


async def test_worker_metrics_count_attempts_outcomes_refunds_and_latency(
        pool, settings, keyring, receiver_factory, arq_queue):
    """The worker's Prometheus counters move with what it did: attempts by status class, deliveries by
    outcome, refunds by reason, and the creation-to-delivery latency histogram."""
    from delivery import metrics

    def value(name: str, **labels) -> float:
        return metrics.REGISTRY.get_sample_value(name, labels) or 0.0

    before = {
        "2xx": value("hookledger_delivery_attempts_total", status_class="2xx"),
        "5xx": value("hookledger_delivery_attempts_total", status_class="5xx"),
        "delivered": value("hookledger_deliveries_total", outcome="delivered"),
        "dead": value("hookledger_deliveries_total", outcome="dead"),
        "refunds": value("hookledger_refunds_total", reason="out_of_retries"),
        "latency": value("hookledger_delivery_latency_seconds_count"),
    }
    healthy = await receiver_factory()
    failing = await receiver_factory(lambda number: 503)
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, healthy, keyring)
    await add_endpoint(pool, account_id, failing, keyring)
    expected = {"2xx": 1, "5xx": 3, "delivered": 1, "dead": 1, "refunds": 1, "latency": 1}

    def moved() -> dict[str, float]:
        return {
            "2xx": value("hookledger_delivery_attempts_total", status_class="2xx") - before["2xx"],
            "5xx": value("hookledger_delivery_attempts_total", status_class="5xx") - before["5xx"],
            "delivered": value("hookledger_deliveries_total", outcome="delivered") - before["delivered"],
            "dead": value("hookledger_deliveries_total", outcome="dead") - before["dead"],
            "refunds": value("hookledger_refunds_total", reason="out_of_retries") - before["refunds"],
            "latency": value("hookledger_delivery_latency_seconds_count") - before["latency"],
        }

    async def counted() -> bool:
        return all(moved()[name] >= count for name, count in expected.items())

    async with running_worker(settings, pool):
        delivery_ids = await _send(pool, settings, account_id, arq_queue)
        await wait_for(lambda: all_finished(pool, delivery_ids))
        # The worker counts a batch just after its record commits, so the rows can be final a
        # moment before the counters are; stopping the worker in that moment cancels the count.
        with contextlib.suppress(AssertionError):
            await wait_for(counted, timeout_seconds=30)
    assert moved() == expected


async def test_an_endpoint_without_a_secret_is_never_sent_to(pool, settings, keyring, receiver_factory, arq_queue):
    """No secret, no signature, no request (I9): the attempts fail without a connection, the delivery
    dies after its schedule and is refunded once."""
    receiver = await receiver_factory()
    account_id = await add_account(pool)
    endpoint_id = await add_endpoint(pool, account_id, receiver, keyring)
    await pool.execute("UPDATE endpoints SET secret = NULL WHERE id = $1", endpoint_id)
    async with running_worker(settings, pool):
        (delivery_id,) = await _send(pool, settings, account_id, arq_queue)
        await wait_for(lambda: all_finished(pool, [delivery_id]))
    assert receiver.received == []
    errors = await pool.fetch("SELECT error FROM delivery_attempts WHERE delivery_id = $1", delivery_id)
    assert len(errors) == 3 and all("no signing secret" in row["error"] for row in errors)
    assert (await states(pool, [delivery_id]))[delivery_id]["dead_reason"] == "out_of_retries"
    assert await ledger_of(pool, delivery_id) == {"charge": -PRICE, "refund": PRICE}
