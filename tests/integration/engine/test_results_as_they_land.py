"""Each send's result is recorded as it lands (delivery.engine.recorder), timed from the wire, and
kept through a database outage: a receiver's 2xx is never lost to a write PostgreSQL could not take.

The engine runs in this process on a pool that reaches PostgreSQL through a switch (database_switch):
switched off, every open connection is aborted mid-statement and new ones are refused, as while
PostgreSQL restarts; the test's own pool goes straight to the server.
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from billing.audit import audit
from billing.database import create_pool
from billing.messages import MessageRequest, create_messages
from delivery.engine.pipeline import Engine, EngineSettings
from delivery.engine.results import AttemptResult, record_results
from delivery.engine.retry import RetrySchedule, RetrySettings
from delivery.engine.sender import Sender, SenderSettings
from delivery.store.signer_cache import SignerCache
from database_switch import DatabaseSwitch
from engine_helpers import PRICE, add_account, add_endpoint, ledger_of, states, wait_for, keys_of

ROUNDS = 12
MESSAGES = 30
ENDPOINTS = 4
SENDER = SenderSettings(allow_loopback=True, timeout_ms_default=3000, timeout_ms_max=3000)


def _engine(pool, sender: Sender, keyring, *, lease_ms: int = 10_000, delays=(0,)) -> Engine:
    settings = EngineSettings(lease_ms=lease_ms, retry=RetrySettings(schedule=RetrySchedule(delays, jitter_fraction=0)))
    return Engine(pool, sender, None, SignerCache(keyring), settings, random.Random(1))


async def _deliveries(pool, account_id, messages: int, *, attempts_max: int) -> list:
    created = await create_messages(pool, [MessageRequest(account_id, "e", b"{}") for _ in range(messages)],
                                    attempts_max=attempts_max)
    return [delivery.id for message in created for delivery in message.deliveries]


@pytest.mark.parametrize("round_number", range(ROUNDS))
async def test_no_2xx_is_lost_when_the_database_goes_away_while_results_are_recorded(
        pool, database_url, receiver_factory, keyring, round_number):
    """Every delivery is on its last attempt and every receiver answers 2xx, spread over 0.6 s; in the
    middle PostgreSQL goes away for 0.2 to 1 s (connections cut mid-write, new ones refused). Each
    result that landed meanwhile is written once PostgreSQL answers: every delivery ends delivered,
    none dead or refunded, and the audit is clean. (A batch's results written in one go at its end
    would lose every 2xx of a batch whose write met the outage: leases run out, deaths refunded.)"""
    rng = random.Random(round_number)
    switch = await DatabaseSwitch(database_url).start()
    worker_pool = await create_pool(switch.url(), size_min=1, size_max=8)
    try:
        arrived = []

        async def answer(number):
            arrived.append(number)
            await asyncio.sleep(rng.uniform(0.0, 0.6))
            return rng.choice((200, 201, 204))

        account_id = await add_account(pool, balance=10_000)
        for _ in range(ENDPOINTS):
            await add_endpoint(pool, account_id, await receiver_factory(answer), keyring, timeout_ms=3000)
        delivery_ids = await _deliveries(pool, account_id, MESSAGES, attempts_max=1)
        async with Sender(SENDER) as sender:
            engine = _engine(worker_pool, sender, keyring)
            job = asyncio.create_task(engine.deliver_ids(await keys_of(pool, delivery_ids)))
            # Off once some results are in and others are still coming: after the claim committed (the
            # first request has arrived), not while it runs; a loaded machine can take longer than
            # any fixed sleep to claim, and a claim cut by the outage fails the job as it should.
            await wait_for(lambda: asyncio.sleep(0, arrived))
            await asyncio.sleep(rng.uniform(0.05, 0.35))
            await switch.off()
            await asyncio.sleep(rng.uniform(0.2, 1.0))
            await switch.on()
            report = await asyncio.wait_for(job, 60)
            await engine.close()
        assert report.claimed == len(delivery_ids) and report.sent == len(delivery_ids)
        found = await states(pool, delivery_ids)
        assert {row["state"] for row in found.values()} == {"delivered"}
        assert await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE account_id = $1 AND kind = 'refund'",
                                   account_id) == 0
        assert await pool.fetchval("SELECT count(*) FROM delivery_attempts WHERE delivery_id = ANY($1::uuid[])"
                                   " AND status_code BETWEEN 200 AND 299", delivery_ids) == len(delivery_ids)
        assert (await audit(pool)).clean
        assert switch.cuts == 1
    finally:
        await worker_pool.close()
        await switch.close()


async def test_a_fast_failure_beside_a_slow_send_is_timed_from_the_wire(pool, receiver_factory, keyring):
    """One claim holds a delivery whose receiver answers 500 at once and one whose receiver takes a
    second. The fast attempt's started_at and finished_at are within 50 ms of when its receiver saw
    it (not stamped when the slow one ended), and its retry is due its delay after the answer."""
    seen: list[float] = []

    def fast(number):
        seen.append(time.time())
        return 500

    async def slow(number):
        await asyncio.sleep(1.0)
        return 200

    account_id = await add_account(pool)
    fast_endpoint = await add_endpoint(pool, account_id, await receiver_factory(fast), keyring, timeout_ms=3000)
    await add_endpoint(pool, account_id, await receiver_factory(slow), keyring, timeout_ms=3000)
    (created,) = await create_messages(pool, [MessageRequest(account_id, "e", b"{}")], attempts_max=3)
    fast_delivery = next(d.id for d in created.deliveries if d.endpoint_id == fast_endpoint)
    async with Sender(SENDER) as sender:
        engine = _engine(pool, sender, keyring, delays=(0, 60, 60))
        report = await engine.deliver_ids(await keys_of(pool, [d.id for d in created.deliveries]))
    assert report.summary.retrying == [fast_delivery] and len(report.summary.delivered) == 1
    row = await pool.fetchrow(
        "SELECT extract(epoch FROM a.started_at)::float8 AS started, extract(epoch FROM a.finished_at)::float8 AS finished,"
        "  extract(epoch FROM d.next_attempt_at - a.finished_at)::float8 AS delay"
        " FROM delivery_attempts a JOIN deliveries d ON d.id = a.delivery_id WHERE a.delivery_id = $1", fast_delivery)
    (arrived,) = seen
    assert abs(row["started"] - arrived) < 0.05, (row["started"], arrived)
    assert abs(row["finished"] - arrived) < 0.05, (row["finished"], arrived)
    assert row["started"] <= row["finished"]
    assert abs(row["delay"] - 60) < 0.001


async def test_a_stopping_engine_writes_the_results_it_holds(pool, database_url, receiver_factory, keyring):
    """Results that landed while PostgreSQL was away are held; the job waiting for them is cancelled (the
    shutdown's grace is over) and the engine told to stop: it writes them once PostgreSQL answers,
    within its lease, before close() returns."""
    switch = await DatabaseSwitch(database_url).start()
    worker_pool = await create_pool(switch.url(), size_min=1, size_max=4)
    try:
        async def answer(number):
            await asyncio.sleep(0.3)
            return 200

        receiver = await receiver_factory(answer)
        account_id = await add_account(pool)
        await add_endpoint(pool, account_id, receiver, keyring)
        delivery_ids = await _deliveries(pool, account_id, 10, attempts_max=1)
        async with Sender(SENDER) as sender:
            engine = _engine(worker_pool, sender, keyring, lease_ms=60_000)  # no lease ends in this test
            job = asyncio.create_task(engine.deliver_ids(await keys_of(pool, delivery_ids)))
            await wait_for(lambda: asyncio.sleep(0, len(receiver.received) == len(delivery_ids)))
            await switch.off()  # every request is in, no answer yet
            await wait_for(lambda: asyncio.sleep(0, engine.recorder.held == len(delivery_ids)))
            job.cancel()
            closing = asyncio.create_task(engine.close())
            await asyncio.sleep(0.5)
            assert not closing.done()
            await switch.on()
            await asyncio.wait_for(closing, 10)
        assert engine.recorder.held == 0 and engine.recorder.dropped == 0
        found = await states(pool, delivery_ids)
        assert {row["state"] for row in found.values()} == {"delivered"}
        assert (await audit(pool)).clean
    finally:
        await worker_pool.close()
        await switch.close()


@pytest.mark.parametrize("last_attempt", [False, True])
async def test_a_2xx_after_a_failure_of_the_same_attempt_wins(pool, receiver_factory, keyring, last_attempt):
    """A failure is on record for attempt 1, then a 2xx for attempt 1 reports in. The delivery ends
    delivered (reclaimed, when the failure had settled it out_of_retries) and the attempt row holds
    the 2xx, so the audit's I6 ("delivered with a 2xx on record") holds."""
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, await receiver_factory(), keyring)
    (delivery_id,) = await _deliveries(pool, account_id, 1, attempts_max=1 if last_attempt else 3)
    await pool.execute("UPDATE deliveries SET state = 'sending', attempt = 1, leased_until = now() + interval '1 minute'"
                       " WHERE id = $1", delivery_id)
    failed = await record_results(pool, [AttemptResult(delivery_id, 1, account_id, False, 9, 500, "http 500")])
    assert (failed.settled if last_attempt else failed.retrying) == [delivery_id]
    succeeded = await record_results(pool, [AttemptResult(delivery_id, 1, account_id, True, 12, 200)])
    assert (succeeded.reclaimed if last_attempt else succeeded.delivered) == [delivery_id]
    assert (await states(pool, [delivery_id]))[delivery_id]["state"] == "delivered"
    row = await pool.fetchrow("SELECT status_code, error, latency_ms FROM delivery_attempts WHERE delivery_id = $1",
                              delivery_id)
    assert (row["status_code"], row["error"], row["latency_ms"]) == (200, None, 12)
    expected = {"charge": -PRICE, "refund": PRICE, "reclaim": -PRICE} if last_attempt else {"charge": -PRICE}
    assert await ledger_of(pool, delivery_id) == expected
    # A failure reported after the 2xx changes nothing.
    await record_results(pool, [AttemptResult(delivery_id, 1, account_id, False, 3, 503, "http 503")])
    assert await pool.fetchval("SELECT status_code FROM delivery_attempts WHERE delivery_id = $1", delivery_id) == 200
    assert (await audit(pool)).clean
