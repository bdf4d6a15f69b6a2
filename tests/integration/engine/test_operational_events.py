"""Each operational event through its real cause, received once by an operational endpoint, signed
and verified with the public standardwebhooks library; the ledger's audit stays clean throughout."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from billing import accounts, ids
from billing.audit import audit
from billing.messages import MessageRequest, create_message, create_messages
from billing.errors import InsufficientBalance
from delivery.engine import pipeline as engine_module
from delivery.engine.endpoint_health import EndpointHealth
from delivery.engine.retry import AutoDisablePolicy
from delivery.engine.sender import Sender, SenderSettings
from delivery.platform import config
from delivery.store import endpoints as endpoint_store
from delivery.store.signer_cache import SignerCache
from engine_helpers import keys_of, PRICE, add_account, add_endpoint, all_finished, fast_environment, running_worker, wait_for
from operational_helpers import (add_operational_endpoint, all_received, check_each_received_once, events_of,
                                 send_due, start_operational_receiver)


@pytest.fixture
async def runners():
    started: list = []
    yield started
    for runner in started:
        await runner.cleanup()


async def _create(pool, account_id, count: int, attempts_max: int = 3) -> list:
    created = await create_messages(pool, [MessageRequest(account_id, "e", b"{}") for _ in range(count)],
                                    attempts_max=attempts_max)
    return [delivery.id for message in created for delivery in message.deliveries]


async def test_a_receiver_answering_410_disables_its_endpoint_and_the_dead_come_in_one_batch(
        pool, settings, keyring, receiver_factory, arq_queue, runners):
    """The endpoint answers 410 Gone: endpoint.disabled (reason gone, with the refunds it causes) and
    one delivery.dead carrying every delivery that died of it, each received once and verified."""
    receiver = await receiver_factory(lambda number: 410)
    operations = await start_operational_receiver(runners)
    account_id = await add_account(pool, balance=1000)
    endpoint_id = await add_endpoint(pool, account_id, receiver, keyring)
    await add_operational_endpoint(pool, account_id, operations, keyring)
    async with running_worker(settings, pool):
        delivery_ids = await _create(pool, account_id, 5)
        await arq_queue.wake(await keys_of(pool, delivery_ids[:1]))
        await wait_for(lambda: pool.fetchval("SELECT NOT enabled FROM endpoints WHERE id = $1", endpoint_id))
        await arq_queue.wake(await keys_of(pool, delivery_ids[1:]))
        await wait_for(lambda: all_finished(pool, delivery_ids))
        await wait_for(lambda: all_received(pool, account_id, operations), timeout_seconds=30)
    await check_each_received_once(pool, account_id, operations)
    (disabled,) = operations.of_type("endpoint.disabled")
    data = disabled["payload"]["data"]
    assert data["endpoint_id"] == str(endpoint_id) and data["reason"] == "gone"
    assert 1 <= data["refunds"]["deliveries"] <= 5 and data["refunds"]["amount"] == PRICE * data["refunds"]["deliveries"]
    dead = [item for entry in operations.of_type("delivery.dead") for item in entry["payload"]["data"]["deliveries"]]
    assert sorted(item["delivery_id"] for item in dead) == sorted(str(d) for d in delivery_ids)
    assert all(item["refund_amount"] == PRICE for item in dead)
    assert len(operations.of_type("delivery.dead")) < 5  # batched, not one event per delivery
    assert (await audit(pool)).clean


async def test_retries_running_out_and_a_failing_streak(pool, settings, keyring, receiver_factory, arq_queue, runners):
    """A receiver answering 500: each delivery dies out_of_retries (delivery.dead with its attempts and
    last status); the streak then passes half of a policy (endpoint.failing, once however often it is
    checked) and then all of one (endpoint.disabled, reason failing); the account switches it on again
    (endpoint.enabled)."""
    receiver = await receiver_factory(lambda number: 500)
    operations = await start_operational_receiver(runners)
    account_id = await add_account(pool, balance=1000)
    endpoint_id = await add_endpoint(pool, account_id, receiver, keyring)
    await add_operational_endpoint(pool, account_id, operations, keyring)
    async with running_worker(settings, pool):
        delivery_ids = await _create(pool, account_id, 2)
        await arq_queue.wake(await keys_of(pool, delivery_ids))
        await wait_for(lambda: all_finished(pool, delivery_ids))
        # Six failures: half of a policy of twelve (a warning), then all of a policy of six.
        policy = AutoDisablePolicy(failing_seconds_min=0, failures_min=12, failure_spread_seconds_min=0)
        for _ in range(3):  # a fresh health check each time (no per-process interval): still one event
            assert await EndpointHealth(pool, policy).check_failing(account_id, endpoint_id) is False
        disabling = AutoDisablePolicy(failing_seconds_min=0, failures_min=6, failure_spread_seconds_min=0)
        assert await EndpointHealth(pool, disabling).check_failing(account_id, endpoint_id) is True
        await endpoint_store.update_endpoint(pool, account_id, endpoint_id, {"enabled": True})  # the account's PATCH
        await wait_for(lambda: asyncio.sleep(0, result=len(operations.of_type("endpoint.enabled")) == 1),
                       timeout_seconds=30)
        await wait_for(lambda: all_received(pool, account_id, operations), timeout_seconds=30)
    await check_each_received_once(pool, account_id, operations)
    dead = [item for entry in operations.of_type("delivery.dead") for item in entry["payload"]["data"]["deliveries"]]
    assert sorted(item["delivery_id"] for item in dead) == sorted(str(d) for d in delivery_ids)
    assert {(item["reason"], item["attempts"], item["last_status_code"]) for item in dead} == {("out_of_retries", 3, 500)}
    (failing,) = operations.of_type("endpoint.failing")
    assert failing["payload"]["data"]["endpoint_id"] == str(endpoint_id) and failing["payload"]["data"]["failures"] == 6
    (disabled,) = operations.of_type("endpoint.disabled")
    assert disabled["payload"]["data"]["reason"] == "failing"
    (enabled,) = operations.of_type("endpoint.enabled")
    assert enabled["payload"]["data"]["endpoint_id"] == str(endpoint_id)
    assert (await audit(pool)).clean


async def test_a_late_2xx_after_the_refund_is_delivery_recovered(
        pool, database_url, redis_url, keyring, receiver_factory, runners):
    """A paused worker's send comes back 2xx after its delivery was settled and refunded: the reclaim
    writes delivery.recovered (the amount taken back), received once; delivery.dead came before it."""
    settings = config.load(fast_environment(database_url, redis_url, keyring, HOOKLEDGER_RETRY_SCHEDULE="0"))
    release = asyncio.Event()

    async def stall(number):
        await release.wait()
        return 200

    receiver = await receiver_factory(stall)
    operations = await start_operational_receiver(runners)
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring, timeout_ms=10_000)
    await add_operational_endpoint(pool, account_id, operations, keyring)
    delivery_id = (await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=1)).deliveries[0].id
    paused = engine_module.Engine(
        pool, Sender(SenderSettings(allow_loopback=True, timeout_ms_default=10_000, timeout_ms_max=10_000)), None,
        SignerCache(keyring), engine_module.EngineSettings(lease_ms=60_000), random.Random(1))
    send = asyncio.create_task(paused.deliver_ids(await keys_of(pool, [delivery_id])))
    await wait_for(lambda: asyncio.sleep(0, result=len(receiver.received) == 1))
    await pool.execute("UPDATE deliveries SET leased_until = now() - interval '1 second' WHERE id = $1", delivery_id)
    async with running_worker(settings, pool):
        await wait_for(lambda: pool.fetchval("SELECT state = 'dead' FROM deliveries WHERE id = $1", delivery_id))
        release.set()
        assert (await send).summary.reclaimed == [delivery_id]
        await wait_for(lambda: all_received(pool, account_id, operations), timeout_seconds=30)
        await wait_for(lambda: asyncio.sleep(0, result=len(operations.of_type("delivery.recovered")) == 1))
    await paused.sender.close()
    await check_each_received_once(pool, account_id, operations)
    (recovered,) = operations.of_type("delivery.recovered")
    assert recovered["payload"]["data"]["delivery_id"] == str(delivery_id)
    assert recovered["payload"]["data"]["reclaimed_amount"] == PRICE
    (dead,) = operations.of_type("delivery.dead")
    assert dead["payload"]["data"]["deliveries"][0]["reason"] == "attempts_exhausted"
    assert (await audit(pool)).clean


@pytest.mark.parametrize("round_number", range(3))
async def test_16_concurrent_creates_crossing_the_threshold_write_one_balance_low(pool, keyring, runners,
                                                                                 round_number):
    """16 creates at once on separate connections take the balance from above the threshold to below
    it: exactly one balance.low. More charges below it write none; a top-up above arms it again and
    the next crossing writes the second. Each is received once, signed. Repeated: a race that loses
    sometimes fails some round."""
    operations = await start_operational_receiver(runners)
    account_id = await add_account(pool, balance=16 * PRICE * 2, price=PRICE)
    await add_operational_endpoint(pool, account_id, operations, keyring, event_types=["balance.low"])
    await accounts.update_settings(pool, account_id, set_threshold=True, low_balance_threshold=16 * PRICE + 3)

    async def one() -> None:
        await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=3)

    await add_endpoint_free(pool, account_id)
    await asyncio.gather(*(one() for _ in range(16)))  # 32 -> 16 prices: below 16 prices + 3
    await asyncio.gather(*(one() for _ in range(4)))
    # The charge that crossed took the balance from 17 prices to 16: that is the balance it reports.
    (low,) = await events_of(pool, account_id, "balance.low")
    assert json.loads(low["data"]) == {"balance": 16 * PRICE, "threshold": 16 * PRICE + 3}
    await accounts.top_up(pool, account_id, f"more-{round_number}", 100 * PRICE)  # 112 prices: armed again
    await asyncio.gather(*(one() for _ in range(16)))  # 96 prices: still above
    assert len(await events_of(pool, account_id, "balance.low")) == 1
    await asyncio.gather(*(one() for _ in range(80)))  # 16 prices: below again
    assert len(await events_of(pool, account_id, "balance.low")) == 2
    await send_due(pool, keyring)
    assert [entry["payload"]["type"] for entry in operations.received] == ["balance.low"] * 2
    await _check_received_of_type(pool, account_id, operations, "balance.low")
    assert (await audit(pool)).clean


async def _check_received_of_type(pool, account_id, operations, event_type: str) -> None:
    """Each event of the type received once under its id, verified (the others were not subscribed)."""
    events = await events_of(pool, account_id, event_type)
    received = [entry["webhook_id"] for entry in operations.received]
    assert sorted(received) == sorted(str(event["id"]) for event in events)
    assert all(entry["verified"] for entry in operations.received)


async def add_endpoint_free(pool, account_id):
    """An endpoint to fan out to (never sent to here: no worker runs)."""
    await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, 'https://example.com/hook')",
                       ids.new_id(), account_id)


async def test_refusals_write_one_balance_exhausted_until_a_message_is_accepted(pool, keyring, runners):
    """The first 402 after an accepted message writes balance.exhausted; more 402s (16 at once) write
    none; after a top-up and an accepted message, the next 402 writes the second. Each received once."""
    operations = await start_operational_receiver(runners)
    account_id = await add_account(pool, balance=PRICE, price=PRICE)
    await add_operational_endpoint(pool, account_id, operations, keyring, event_types=["balance.exhausted"])
    await add_endpoint_free(pool, account_id)
    await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=3)
    refused = await asyncio.gather(*(create_messages(pool, [MessageRequest(account_id, "e", b"{}")], attempts_max=3)
                                     for _ in range(16)))
    assert all(isinstance(result, InsufficientBalance) for (result,) in refused)
    assert len(await events_of(pool, account_id, "balance.exhausted")) == 1
    await accounts.top_up(pool, account_id, "again", PRICE)
    assert len(await events_of(pool, account_id, "balance.exhausted")) == 1
    await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=3)
    (result,) = await create_messages(pool, [MessageRequest(account_id, "e", b"{}")], attempts_max=3)
    assert isinstance(result, InsufficientBalance)
    assert len(await events_of(pool, account_id, "balance.exhausted")) == 2
    await send_due(pool, keyring)
    assert [entry["payload"]["data"]["balance"] for entry in operations.received] == [0, 0]
    await _check_received_of_type(pool, account_id, operations, "balance.exhausted")


async def test_top_up_and_reversal_are_sent(pool, settings, keyring, runners):
    """topup.applied and topup.reversed (order id, amount, balance after), each received once; the same
    order applied twice writes one event."""
    operations = await start_operational_receiver(runners)
    account_id = await add_account(pool, balance=0)
    await add_operational_endpoint(pool, account_id, operations, keyring, event_types=["topup.applied", "topup.reversed"])
    await accounts.top_up(pool, account_id, "order-1", 500)
    await accounts.top_up(pool, account_id, "order-1", 500)
    await accounts.reverse_top_up(pool, account_id, "order-1")
    async with running_worker(settings, pool):
        await wait_for(lambda: all_received(pool, account_id, operations), timeout_seconds=30)
        await wait_for(lambda: asyncio.sleep(0, result=len(operations.received) == 2))
    await check_each_received_once(pool, account_id, operations)
    applied, reversed_ = operations.received
    assert applied["payload"]["type"] == "topup.applied"
    assert applied["payload"]["data"] == {"order_id": "order-1", "amount": 500, "balance": 500}
    assert reversed_["payload"]["data"] == {"order_id": "order-1", "amount": -500, "balance": 0}
    assert (await audit(pool)).clean


async def test_the_audit_counts_operational_deliveries_apart_and_refuses_a_charge_on_one(pool, keyring, runners):
    """Sent by one run of the operational sender (no worker): the audit stays clean and counts them
    apart; a ledger entry naming an operational delivery (forced past the triggers) is an I1 violation."""
    from delivery.engine.retry import RetrySettings
    from delivery.operations.operational_sender import OperationalSender

    operations = await start_operational_receiver(runners)
    account_id = await add_account(pool, balance=0)
    await add_operational_endpoint(pool, account_id, operations, keyring)
    for number in range(3):
        await accounts.top_up(pool, account_id, f"order-{number}", 10)
    sender = Sender(SenderSettings(allow_loopback=True, timeout_ms_default=2000, timeout_ms_max=2000))
    try:
        report = await OperationalSender(pool, sender, keyring, RetrySettings()).run_once()
    finally:
        await sender.close()
    assert (report.dispatched, report.sent, report.delivered) == (3, 3, 3)
    await check_each_received_once(pool, account_id, operations)
    audited = await audit(pool)
    assert audited.clean and audited.operational_deliveries == 3
    assert audited.to_json()["operational_deliveries"] == 3
    operational_id = await pool.fetchval("SELECT id FROM operational_deliveries LIMIT 1")
    async with pool.acquire() as connection, connection.transaction():  # this test's own database
        await connection.execute("ALTER TABLE ledger_entries DISABLE TRIGGER ALL")
        await connection.execute("INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount)"
                                 " VALUES ('charge:' || $1::uuid::text, $2, $1::uuid, 'charge', 0)",
                                 operational_id, account_id)
    found = [v for v in (await audit(pool)).violations if v.delivery_id == operational_id]
    # Beside the charge-without-a-delivery finding of the ledger's own I1 check, the operational one.
    assert [v.invariant for v in found if "never charged" in v.detail] == ["I1"]


async def test_a_deleted_account_is_told_nothing_more_and_its_operational_secret_is_erased(pool, keyring, runners):
    """An event whose delivery failed once waits for its retry when the account is deleted: the deletion
    switches the account's endpoints off without an endpoint.disabled (nobody is left to tell), erases its
    operational endpoints' secrets, and the retry dies unsent (account_closed)."""
    from delivery.engine.retry import RetrySettings
    from delivery.operations import deletion
    from delivery.operations.operational_sender import OperationalSender

    operations = await start_operational_receiver(runners, behaviour=lambda number: 500)
    account_id = await add_account(pool, balance=0)
    await add_endpoint_free(pool, account_id)
    operational_id = await add_operational_endpoint(pool, account_id, operations, keyring)
    await accounts.top_up(pool, account_id, "before-deletion", 10)
    sender = Sender(SenderSettings(allow_loopback=True, timeout_ms_default=2000, timeout_ms_max=2000))
    operational = OperationalSender(pool, sender, keyring, RetrySettings())
    try:
        assert (await operational.run_once()).retrying == 1
        await deletion.start_account_deletion(pool, None, account_id)
        assert (await deletion.run_deletion(pool, account_id)).status == "done"
        assert await pool.fetchval("SELECT secret IS NULL AND NOT enabled FROM operational_endpoints WHERE id = $1",
                                   operational_id)
        assert [event["type"] for event in await events_of(pool, account_id)] == ["topup.applied"]
        await pool.execute("UPDATE operational_deliveries SET next_attempt_at = now()")
        report = await operational.run_once()
    finally:
        await sender.close()
    assert (report.sent, report.dead) == (0, 1) and len(operations.received) == 1
    assert await pool.fetchval("SELECT dead_reason FROM operational_deliveries") == "account_closed"
    assert (await audit(pool)).clean
