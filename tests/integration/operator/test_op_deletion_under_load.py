"""Deleting an account while a real worker sends its deliveries and an app keeps creating messages."""

from __future__ import annotations

import asyncio

import pytest

from billing.audit import audit
from billing.errors import AccountNotActive
from billing.messages import MessageRequest, create_message, create_messages
from delivery.platform import config
from delivery.operations import deletion
from engine_helpers import add_account, add_endpoint, fast_environment, running_worker, wait_for
from operator_helpers import balance_and_ledger, refunds_per_delivery

SLOW_REPLY_SECONDS = 1.2  # under the endpoint's 2 s timeout: the send succeeds, but after the deletion


async def _creator(pool, account_id, endpoint_ids, stop: asyncio.Event, creating: asyncio.Event) -> int:
    """Create messages in a loop until the account refuses them (AccountNotActive); `creating` is set
    once the first of them is in."""
    created = 0
    while not stop.is_set():
        requests = [MessageRequest(account_id, "load", b"{}", endpoint_ids=(endpoint_id,)) for endpoint_id in endpoint_ids]
        results = await create_messages(pool, requests, attempts_max=3)
        if any(isinstance(result, AccountNotActive) for result in results):
            return created
        created += sum(1 for result in results if not isinstance(result, Exception))
        if created:
            creating.set()
        await asyncio.sleep(0.005)
    return created


async def _create(pool, account_id, endpoint_id, count: int) -> None:
    requests = [MessageRequest(account_id, "load", b"{}", endpoint_ids=(endpoint_id,)) for _ in range(count)]
    await create_messages(pool, requests, attempts_max=3)


async def test_deletion_while_the_worker_runs(pool, database_url, redis_url, keyring, receiver_factory):
    """Hundreds of deliveries pending, sending with a lease (slow receiver), delivered and dead, while creates
    race the deletion: every live delivery is refunded exactly once, delivered ones never, the closeout makes
    the balance zero, creates afterwards fail with AccountNotActive, the audit is clean, and the slow sends
    that succeed after the deletion are recorded as stale, not reclaimed, and listed as audit notices."""
    settings = config.load(fast_environment(database_url, redis_url, keyring, HOOKLEDGER_RETRY_SCHEDULE="0,30,30",
                                            HOOKLEDGER_SEND_TIMEOUT_MS_MAX="2000"))

    async def slow(number):
        await asyncio.sleep(SLOW_REPLY_SECONDS)
        return 200

    fine, failing, held = (await receiver_factory(lambda n: 200), await receiver_factory(lambda n: 500),
                           await receiver_factory(slow))
    account_id = await add_account(pool, balance=100_000)
    fine_id = await add_endpoint(pool, account_id, fine, keyring)
    failing_id = await add_endpoint(pool, account_id, failing, keyring)
    held_id = await add_endpoint(pool, account_id, held, keyring, timeout_ms=2000)
    # Dead before the deletion: one attempt allowed, the endpoint answers 500.
    for _ in range(20):
        await create_message(pool, MessageRequest(account_id, "dead", b"{}", endpoint_ids=(failing_id,)), attempts_max=1)
    async with running_worker(settings, pool):
        await _create(pool, account_id, fine_id, 100)
        await _create(pool, account_id, failing_id, 150)
        # Delivered and dead ones first (a worker batch waits for its slowest send), retries pending.
        await wait_for(lambda: pool.fetchval(
            "SELECT count(*) FILTER (WHERE state = 'delivered') = 100 AND count(*) FILTER (WHERE state = 'dead') = 20"
            " AND count(*) FILTER (WHERE state = 'pending' AND attempt = 1) > 100 FROM deliveries"
            " WHERE account_id = $1", account_id))
        await _create(pool, account_id, held_id, 60)
        await wait_for(lambda: pool.fetchval(
            "SELECT count(*) >= 30 FROM deliveries WHERE endpoint_id = $1 AND state = 'sending'", held_id))
        before = dict(await pool.fetch("SELECT state, count(*) FROM deliveries WHERE account_id = $1 GROUP BY state",
                                       account_id))
        assert before.get("pending") and before.get("sending") and before.get("delivered") and before.get("dead"), before
        stop, creating = asyncio.Event(), asyncio.Event()
        creator = asyncio.create_task(_creator(pool, account_id, [fine_id, failing_id], stop, creating))
        await asyncio.wait_for(creating.wait(), 30)  # creates are going in (however slow the machine) when the deletion starts
        state = await deletion.run_deletion(pool, account_id)
        stop.set()
        created_during = await creator
        assert state.status == "done", state.report
        # The held sends answer 200 after the deletion: recorded stale, never reclaimed.
        await wait_for(lambda: pool.fetchval(
            "SELECT count(*) > 0 FROM delivery_attempts a JOIN deliveries d ON d.id = a.delivery_id"
            " WHERE d.endpoint_id = $1 AND a.stale AND a.status_code = 200", held_id), timeout_seconds=10)
        await asyncio.sleep(SLOW_REPLY_SECONDS)
    assert created_during > 0
    refunds = await refunds_per_delivery(pool, account_id)
    assert set(refunds) <= {"dead:1", "delivered:0"}, refunds
    assert state.report["refunded"] == state.report["locked"] == state.report["marked_dead"] > 0
    assert await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE kind = 'reclaim' AND account_id = $1",
                               account_id) == 0
    assert await balance_and_ledger(pool, account_id) == (0, 0, "deleted")
    report = await audit(pool)
    assert report.clean, report.to_json()["violations"]
    stale_successes = await pool.fetch(
        "SELECT DISTINCT d.id FROM delivery_attempts a JOIN deliveries d ON d.id = a.delivery_id"
        " WHERE d.account_id = $1 AND d.state = 'dead' AND a.status_code = 200", account_id)
    assert stale_successes and {n.delivery_id for n in report.notices} >= {row["id"] for row in stale_successes}
    with pytest.raises(AccountNotActive):
        await create_message(pool, MessageRequest(account_id, "late", b"{}"), attempts_max=3)
