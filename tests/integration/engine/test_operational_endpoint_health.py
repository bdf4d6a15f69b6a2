"""Operational endpoints that answer 410 Gone or keep failing are switched off, their pending
deliveries end; events are sent when they commit, without waiting for a cron; balance.exhausted is
armed again by an accepted message only."""

from __future__ import annotations

import asyncio

import pytest

from billing import accounts
from billing.errors import InsufficientBalance
from billing.messages import MessageRequest, create_message, create_messages
from billing.settle import settle
from delivery.engine.retry import GONE_REASON, AutoDisablePolicy, RetrySchedule, RetrySettings
from delivery.engine.sender import Sender, SenderSettings
from delivery.operations.operational_sender import OperationalSender
from delivery.operations.operational_wake import OperationalWake
from delivery.store import operational as store
from engine_helpers import PRICE, add_account, running_worker, wait_for
from operational_helpers import (add_operational_endpoint, all_received, check_each_received_once, events_of,
                                 start_operational_receiver)


async def _all_recorded(pool, account_id, operations, count: int) -> bool:
    """`count` requests received and each one's delivery recorded as delivered."""
    return len(operations.received) == count and await all_received(pool, account_id, operations)


@pytest.fixture
async def runners():
    started: list = []
    yield started
    for runner in started:
        await runner.cleanup()


@pytest.fixture
async def sender():
    made = Sender(SenderSettings(allow_loopback=True, timeout_ms_default=2000, timeout_ms_max=2000))
    yield made
    await made.close()


def _settings(attempts: int = 5, failures_min: int = 1000) -> RetrySettings:
    return RetrySettings(schedule=RetrySchedule((0.0,) * attempts, 0.0),
                         auto_disable=AutoDisablePolicy(failing_seconds_min=0, failures_min=failures_min,
                                                        failure_spread_seconds_min=0))


async def _deliveries(pool, account_id) -> list:
    return await pool.fetch("SELECT state, dead_reason, attempt FROM operational_deliveries WHERE account_id = $1"
                            " ORDER BY created_at", account_id)


async def test_a_receiver_answering_410_switches_the_operational_endpoint_off(pool, keyring, runners, sender):
    """One 410 Gone: the operational endpoint is disabled with the reason (as the API answers it), its
    pending deliveries end endpoint_disabled, and an event written after it makes no delivery."""
    operations = await start_operational_receiver(runners, behaviour=lambda number: 410)
    account_id = await add_account(pool, balance=0)
    endpoint_id = await add_operational_endpoint(pool, account_id, operations, keyring)
    await accounts.top_up(pool, account_id, "order-1", 10)
    operational = OperationalSender(pool, sender, keyring, _settings())
    await operational.run_once()  # dispatches and sends the one event: 410
    assert len(operations.received) == 1
    endpoint = await store.get_endpoint(pool, account_id, endpoint_id)
    assert (endpoint.enabled, endpoint.disabled_reason) == (False, GONE_REASON)
    assert [(row["state"], row["dead_reason"]) for row in await _deliveries(pool, account_id)] == [
        ("dead", "endpoint_disabled")]
    await accounts.top_up(pool, account_id, "order-2", 10)
    report = await operational.run_once()
    assert (report.dispatched, report.sent) == (1, 0) and len(operations.received) == 1
    assert len(await _deliveries(pool, account_id)) == 1
    enabled = await store.update_endpoint(pool, account_id, endpoint_id, {"enabled": True})
    assert (enabled.enabled, enabled.disabled_reason) == (True, None)
    assert await pool.fetchval("SELECT failure_count FROM operational_endpoints WHERE id = $1", endpoint_id) == 0


async def test_pending_deliveries_of_a_gone_endpoint_end_with_it(pool, keyring, runners, sender):
    """Deliveries waiting for their next attempt when the 410 comes end unsent, and are not claimed again."""
    answers = iter([500, 500, 410])
    operations = await start_operational_receiver(runners, behaviour=lambda number: next(answers, 410))
    account_id = await add_account(pool, balance=0)
    endpoint_id = await add_operational_endpoint(pool, account_id, operations, keyring)
    operational = OperationalSender(pool, sender, keyring, _settings())
    await accounts.top_up(pool, account_id, "order-1", 10)
    await accounts.top_up(pool, account_id, "order-2", 10)
    await operational.run_once()  # two 500s: both wait for their second attempt
    assert [row["state"] for row in await _deliveries(pool, account_id)] == ["pending", "pending"]
    await pool.execute("UPDATE operational_deliveries SET next_attempt_at = 'infinity' WHERE account_id = $1"
                       " AND id = (SELECT id FROM operational_deliveries WHERE account_id = $1 ORDER BY created_at"
                       " DESC LIMIT 1)", account_id)
    await operational.run_once()  # the first one's second attempt: 410
    assert len(operations.received) == 3
    assert not await pool.fetchval("SELECT enabled FROM operational_endpoints WHERE id = $1", endpoint_id)
    assert [(row["state"], row["dead_reason"]) for row in await _deliveries(pool, account_id)] == [
        ("dead", "endpoint_disabled"), ("dead", "endpoint_disabled")]


async def test_a_failing_streak_that_meets_the_policy_switches_it_off_and_a_success_clears_it(
        pool, keyring, runners, sender):
    """Failures count on the endpoint's row (PostgreSQL's clock); a 2xx clears the streak; three
    failures in a row under a policy of three switch it off, with the policy's reason."""
    statuses = iter([500, 204, 500, 500, 500])
    operations = await start_operational_receiver(runners, behaviour=lambda number: next(statuses, 500))
    account_id = await add_account(pool, balance=0)
    endpoint_id = await add_operational_endpoint(pool, account_id, operations, keyring)
    operational = OperationalSender(pool, sender, keyring, _settings(attempts=5, failures_min=3))

    async def streak() -> int:
        return await pool.fetchval("SELECT failure_count FROM operational_endpoints WHERE id = $1", endpoint_id)

    await accounts.top_up(pool, account_id, "order-1", 10)
    await operational.run_once()
    assert await streak() == 1
    await operational.run_once()  # its retry: 204
    assert await streak() == 0
    await accounts.top_up(pool, account_id, "order-2", 10)
    for expected in (1, 2):
        await operational.run_once()
        assert await streak() == expected
    await operational.run_once()
    endpoint = await store.get_endpoint(pool, account_id, endpoint_id)
    assert not endpoint.enabled and endpoint.disabled_reason.startswith("every attempt failed")
    assert [(row["state"], row["dead_reason"]) for row in await _deliveries(pool, account_id)] == [
        ("delivered", None), ("dead", "endpoint_disabled")]


async def test_events_are_sent_when_they_commit_without_the_cron(pool, keyring, runners, sender):
    """No cron runs here: the wake-up alone (PostgreSQL's notice of each commit that writes events) sends
    a top-up's event, then each of three more; a delivery.dead batch goes once its window ends. The
    receiver answers 0.2 s after it has read each request, so the test waits for the records, not the reads."""
    operations = await start_operational_receiver(runners, behaviour=lambda number: asyncio.sleep(0.2, result=204))
    account_id = await add_account(pool, balance=0)
    await add_operational_endpoint(pool, account_id, operations, keyring)
    wake = OperationalWake(pool, OperationalSender(pool, sender, keyring, _settings()))
    wake.start()
    try:
        await wait_for(lambda: asyncio.sleep(0, result=wake.runs >= 1))  # the run at listening's start
        await accounts.top_up(pool, account_id, "order-1", 100)
        await wait_for(lambda: asyncio.sleep(0, result=len(operations.received) == 1))
        for number in range(2, 5):
            await accounts.top_up(pool, account_id, f"order-{number}", 100)
        await wait_for(lambda: asyncio.sleep(0, result=len(operations.received) == 4))
        await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES (gen_random_uuid(), $1,"
                           " 'https://example.com/hook')", account_id)
        created = await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=3)
        await settle(pool, created.deliveries[0].id, "out_of_retries", account_id=account_id)
        # received is not recorded: the sender writes 'delivered' once the receiver has answered
        await wait_for(lambda: _all_recorded(pool, account_id, operations, 5))
    finally:
        await wake.stop()
    assert [entry["payload"]["type"] for entry in operations.received] == ["topup.applied"] * 4 + ["delivery.dead"]
    assert sorted(entry["payload"]["data"]["order_id"] for entry in operations.received[:4]) == [
        f"order-{number}" for number in range(1, 5)]
    await check_each_received_once(pool, account_id, operations)


async def test_a_worker_without_its_operational_cron_still_sends_each_event(pool, settings, keyring, runners):
    """A real worker whose `operational` cron is taken out before it starts: events written while it
    runs arrive all the same (its wake-up listens to PostgreSQL, not Redis)."""
    operations = await start_operational_receiver(runners)
    account_id = await add_account(pool, balance=0)
    await add_operational_endpoint(pool, account_id, operations, keyring)
    async with running_worker(settings, pool) as worker:
        worker.cron_jobs = [job for job in worker.cron_jobs if job.name != "operational"]  # before it first runs
        await wait_for(lambda: asyncio.sleep(0, result=worker.ctx.get("operational_wake") is not None
                                             and worker.ctx["operational_wake"].runs >= 1))
        for number in range(3):
            await accounts.top_up(pool, account_id, f"order-{number}", 10)
        await wait_for(lambda: _all_recorded(pool, account_id, operations, 3))
    assert sorted(entry["payload"]["data"]["order_id"] for entry in operations.received) == [
        "order-0", "order-1", "order-2"]
    await check_each_received_once(pool, account_id, operations)


async def test_only_an_accepted_message_arms_balance_exhausted_again(pool, keyring, runners, sender):
    """16 concurrent 402s write one balance.exhausted; top-ups, their reversals (debits of the balance)
    and a refund do not arm it again, so the next 16 concurrent 402s write nothing; an accepted
    message does, so the 16 after it write exactly one more."""
    account_id = await add_account(pool, balance=PRICE, price=PRICE)
    await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES (gen_random_uuid(), $1,"
                       " 'https://example.com/hook')", account_id)

    async def refuse_16() -> None:
        results = await asyncio.gather(*(create_messages(pool, [MessageRequest(account_id, "e", b"{}")],
                                                         attempts_max=3) for _ in range(16)))
        assert all(isinstance(result, InsufficientBalance) for (result,) in results)

    async def exhausted() -> int:
        return len(await events_of(pool, account_id, "balance.exhausted"))

    accepted = await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=3)
    await refuse_16()
    assert await exhausted() == 1
    await accounts.top_up(pool, account_id, "small", PRICE - 1)
    await accounts.reverse_top_up(pool, account_id, "small")  # a debit of the balance, not a message
    await settle(pool, accepted.deliveries[0].id, "out_of_retries", account_id=account_id)  # a refund: PRICE back
    await accounts.top_up(pool, account_id, "other", PRICE - 1)
    await accounts.reverse_top_up(pool, account_id, "other")
    assert await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id) == PRICE
    await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES (gen_random_uuid(), $1,"
                       " 'https://example.com/other')", account_id)  # now a message costs 2 * PRICE
    await refuse_16()
    assert await exhausted() == 1
    await accounts.top_up(pool, account_id, "more", PRICE)
    await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=3)  # accepted: arms it
    await refuse_16()
    assert await exhausted() == 2
