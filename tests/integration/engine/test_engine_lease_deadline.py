"""A batch's sends end within its lease: what cannot is given back unsent, and no attempt is lost;
a batch cancelled at shutdown still records the sends that ended.

A deliver job carries up to 500 ids; sends to one endpoint queue behind its concurrency bound.
Before, the engine put every send of the batch on the wire however long it had waited: sends to
a slow endpoint left after their lease had expired, another worker's sweep sent them again, and
this worker's 2xx came back stale and was thrown away, so a delivery that arrived could still die
refunded. Now a send whose timeout no longer fits before the lease's end (less a margin) is not
started; its claim is given back with its attempt, due again at once.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from billing.audit import audit
from billing.messages import MessageRequest, create_message
from delivery.engine import claims
from delivery.engine.pipeline import Engine, EngineSettings
from delivery.engine.results import AttemptResult, expire_leases, record_results
from delivery.engine.retry import RetrySchedule, RetrySettings
from delivery.engine.sender import Sender, SenderSettings
from delivery.store.signer_cache import SignerCache
from engine_helpers import add_account, add_endpoint, ledger_of, states, keys_of

DELIVERIES = 12
LEASE_MS = 3000  # sends end 1 s before it; each send may take its whole 1 s timeout
ANSWER_SECONDS = 0.4  # one at a time: the batch would need 4.8 s to send everything


async def test_sends_that_cannot_end_within_the_lease_are_given_back_and_sent_once(pool, receiver_factory, keyring):
    async def slow(number):
        await asyncio.sleep(ANSWER_SECONDS)
        return 200

    receiver = await receiver_factory(slow)
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring, timeout_ms=1000)
    delivery_ids = []
    for _ in range(DELIVERIES):
        created = await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=2)
        delivery_ids.append(created.deliveries[0].id)
    settings = EngineSettings(batch_size=DELIVERIES, lease_ms=LEASE_MS, retry=RetrySettings(schedule=RetrySchedule((0,))))
    sender_settings = SenderSettings(allow_loopback=True, sends_per_endpoint_max=1,
                                     timeout_ms_min=1000, timeout_ms_default=1000)
    async with Sender(sender_settings) as sender:
        engine = Engine(pool, sender, None, SignerCache(keyring), settings, random.Random(1))
        batches = []
        while len(batches) < 2 * DELIVERIES:
            started = time.monotonic()
            report = await engine.deliver_ids(await keys_of(pool, delivery_ids))
            batches.append((time.monotonic() - started, report))
            if not report.summary.released:
                break
    # Every batch ended within its lease, and none carried a stale result.
    assert all(seconds < LEASE_MS / 1000 for seconds, _ in batches), [round(seconds, 2) for seconds, _ in batches]
    assert all(report.summary.stale == [] for _, report in batches)
    first = batches[0][1]
    assert 1 <= len(first.summary.delivered) < DELIVERIES and first.sent == len(first.summary.delivered)
    assert sorted(first.summary.released) == sorted(set(delivery_ids) - set(first.summary.delivered))
    assert len(batches) >= 3
    # Each delivery was sent once, delivered on its first attempt, charged once.
    assert sorted(entry["id"] for entry in receiver.received) == sorted(str(d) for d in delivery_ids)
    found = await states(pool, delivery_ids)
    assert {(row["state"], row["attempt"]) for row in found.values()} == {("delivered", 1)}
    attempts = await pool.fetch("SELECT attempt, status_code, stale FROM delivery_attempts WHERE delivery_id = ANY($1)",
                                delivery_ids)
    assert sorted(tuple(row) for row in attempts) == [(1, 200, False)] * DELIVERIES
    for delivery_id in delivery_ids:
        assert await ledger_of(pool, delivery_id) == {"charge": -5}
    assert (await audit(pool)).violations == []


async def test_a_released_claim_is_fenced_once_another_worker_claimed_it(pool, receiver_factory, keyring):
    """Giving a claim back quotes its attempt and state: after the lease expired and another
    worker claimed the delivery, the release matches nothing."""
    receiver = await receiver_factory(lambda number: 200)
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring)
    created = await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=3)
    delivery_id = created.deliveries[0].id
    (first,) = await claims.claim_ids(pool, await keys_of(pool, [delivery_id]), lease_ms=60_000)
    await pool.execute("UPDATE deliveries SET leased_until = now() - interval '1 second' WHERE id = $1", delivery_id)
    await expire_leases(pool, batch_size=10, delay_seconds=lambda attempt: 0.0)
    (second,) = await claims.claim_ids(pool, await keys_of(pool, [delivery_id]), lease_ms=60_000)
    assert (first.attempt, second.attempt) == (1, 2)
    summary = await record_results(pool, [AttemptResult(delivery_id, first.attempt, account_id, False, 0, released=True)])
    assert summary.released == []
    row = (await states(pool, [delivery_id]))[delivery_id]
    assert (row["state"], row["attempt"]) == ("sending", 2)
    summary = await record_results(pool, [AttemptResult(delivery_id, second.attempt, account_id, False, 0, released=True)])
    assert summary.released == [delivery_id]
    row = (await states(pool, [delivery_id]))[delivery_id]
    assert (row["state"], row["attempt"]) == ("pending", 1)


async def test_a_batch_cancelled_at_shutdown_records_the_sends_that_ended(pool, receiver_factory, keyring):
    """The shutdown's grace ends with one send still on the wire: the batch is cancelled, and the
    send that already answered 200 is recorded delivered (before, it stayed leased, unrecorded, and
    was sent again after its lease). The one on the wire keeps its lease."""
    async def hang(number):
        await asyncio.sleep(30)
        return 200

    fast, slow = await receiver_factory(lambda number: 200), await receiver_factory(hang)
    account_id = await add_account(pool)
    fast_endpoint = await add_endpoint(pool, account_id, fast, keyring, timeout_ms=10_000)
    await add_endpoint(pool, account_id, slow, keyring, timeout_ms=10_000)
    created = await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=3)
    by_endpoint = {delivery.endpoint_id: delivery.id for delivery in created.deliveries}
    fast_delivery = by_endpoint[fast_endpoint]
    slow_delivery = next(d for e, d in by_endpoint.items() if e != fast_endpoint)
    sender_settings = SenderSettings(allow_loopback=True, timeout_ms_default=10_000, timeout_ms_max=10_000)
    async with Sender(sender_settings) as sender:
        engine = Engine(pool, sender, None, SignerCache(keyring), EngineSettings(lease_ms=20_000), random.Random(1))
        job = asyncio.create_task(engine.deliver_ids(await keys_of(pool, list(by_endpoint.values()))))
        while not (fast.received and slow.received):
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job
    found = await states(pool, list(by_endpoint.values()))
    assert (found[fast_delivery]["state"], found[fast_delivery]["attempt"]) == ("delivered", 1)
    assert (found[slow_delivery]["state"], found[slow_delivery]["attempt"]) == ("sending", 1)
    assert await pool.fetchval("SELECT status_code FROM delivery_attempts WHERE delivery_id = $1", fast_delivery) == 200
