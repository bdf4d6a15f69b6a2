"""More claimed work than the sender takes at once waits for room before it claims, instead of failing.

Before the send budget, twenty deliver jobs of 500 (or fewer jobs beside a sweep) could submit more
sends than `sends_pending_max`: the sender refused the rest of the batch, its deliveries stayed
leased until the lease expired, and the sends already submitted went out a second time. At
HOOKLEDGER_WORKER_JOBS=40 a drain fell to 157 deliveries/s with 6,234 duplicates.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from billing.messages import MessageRequest, create_messages
from delivery.engine import pipeline as engine_module
from delivery.engine.sender import Sender, SenderSettings
from delivery.store.signer_cache import SignerCache
from engine_helpers import add_account, add_endpoint, states, keys_of

CAPACITY = 500  # the sender's sends_pending_max: the least the engine accepts (one deliver job)
ENDPOINTS = 8
MESSAGES_PER_BATCH = 40  # x 8 endpoints = 320 deliveries a batch: two batches do not fit at once


async def _deliveries(pool, account_id, messages: int) -> list:
    requests = [MessageRequest(account_id, "e", b"{}") for _ in range(messages)]
    return [d.id for created in await create_messages(pool, requests, attempts_max=3) for d in created.deliveries]


async def _failures(pool, delivery_ids) -> list:
    """What the attempts that did not end in a 2xx recorded, and how many of each."""
    return [tuple(row) for row in await pool.fetch(
        "SELECT status_code, error, count(*) FROM delivery_attempts WHERE delivery_id = ANY($1::uuid[])"
        " AND status_code IS DISTINCT FROM 200 GROUP BY 1, 2", delivery_ids)]


@pytest.mark.parametrize("round_", range(3))
async def test_batches_past_the_senders_bound_wait_their_turn_and_each_delivery_goes_once(
        pool, keyring, receiver_factory, round_):
    async def slow(number: int) -> int:
        await asyncio.sleep(0.05)  # sends stay pending while the next batch is claimed
        return 200

    receiver = await receiver_factory(slow)
    account_id = await add_account(pool, balance=100_000)
    # The sender's default timeout, not the helper's 1 s: the claim here is order and once-only, and
    # under stress --cpu 2, 320 sends and their receiver on one event loop took over 1 s (64 timeouts).
    for _ in range(ENDPOINTS):
        await add_endpoint(pool, account_id, receiver, keyring, timeout_ms=SenderSettings.timeout_ms_default)
    batches = [await _deliveries(pool, account_id, MESSAGES_PER_BATCH) for _ in range(3)]
    sender = Sender(SenderSettings(allow_loopback=True, sends_pending_max=CAPACITY))
    engine = engine_module.Engine(pool, sender, None, SignerCache(keyring), engine_module.EngineSettings(), random.Random(1))
    most_pending = 0

    async def watch() -> None:
        nonlocal most_pending
        while True:
            most_pending = max(most_pending, sender.pending)
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    try:
        keyed = [await keys_of(pool, batch) for batch in batches]
        reports = await asyncio.gather(*(engine.deliver_ids(keys) for keys in keyed))
    finally:
        watcher.cancel()
        await sender.close()
    every = [delivery_id for batch in batches for delivery_id in batch]
    assert [report.claimed for report in reports] == [len(batch) for batch in batches]
    assert {row["state"] for row in (await states(pool, every)).values()} == {"delivered"}, await _failures(pool, every)
    assert sorted(entry["id"] for entry in receiver.received) == sorted(str(d) for d in every)  # once each
    assert 0 < most_pending <= CAPACITY
    assert engine.budget.free == CAPACITY  # every batch handed its room back


async def test_an_engine_whose_sender_cannot_take_one_claim_is_refused(pool, keyring) -> None:
    sender = Sender(SenderSettings(allow_loopback=True, sends_pending_max=CAPACITY - 1))
    try:
        with pytest.raises(ValueError, match="less than one claim"):
            engine_module.Engine(pool, sender, None, SignerCache(keyring), engine_module.EngineSettings())
    finally:
        await sender.close()
