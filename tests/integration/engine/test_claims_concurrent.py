"""Claims racing on real PostgreSQL never take one delivery twice.

A claim is one autocommit statement (no BEGIN and COMMIT around it): SKIP LOCKED keeps two
claimers off the same row and the attempt fence moves each claimed delivery on exactly once.
Inside a caller's transaction a claim is part of it, and goes with its rollback.
"""

from __future__ import annotations

import asyncio
import random
import uuid

import pytest

from billing import accounts
from billing.messages import MessageRequest, create_messages
from delivery.engine import claims

LEASE_MS = 60_000


async def _deliveries(pool, messages_count: int) -> list[claims.DeliveryKey]:
    account = await accounts.create_account(pool, "claims", price_per_delivery=1)
    await accounts.top_up(pool, account.id, f"o-{account.id}", 10_000)
    for _ in range(2):
        await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, 'https://example.com')",
                           uuid.uuid4(), account.id)
    created = await create_messages(pool, [MessageRequest(account.id, "t", b"{}") for _ in range(messages_count)],
                                    attempts_max=3)
    return [claims.DeliveryKey(account.id, delivery.id) for message in created for delivery in message.deliveries]


@pytest.mark.parametrize("round_number", range(10))
async def test_racing_claims_take_each_delivery_once(pool, round_number):
    keys = await _deliveries(pool, 60)  # 120 deliveries
    delivery_ids = [key.id for key in keys]
    rng = random.Random(round_number)
    start = asyncio.Event()

    async def by_ids() -> list[claims.Claimed]:
        await start.wait()
        taken = []
        for _ in range(4):
            loaded = await claims.claim_ids_for_send(pool, rng.sample(keys, 30), lease_ms=LEASE_MS)
            taken += [claimed for claimed, _ in loaded]
            await asyncio.sleep(0)
        return taken

    async def due() -> list[claims.Claimed]:
        await start.wait()
        taken = []
        for _ in range(4):
            loaded = await claims.claim_due_for_send(pool, batch_size=25, lease_ms=LEASE_MS)
            taken += [claimed for claimed, _ in loaded]
            await asyncio.sleep(0)
        return taken

    tasks = [asyncio.create_task(by_ids()) for _ in range(5)] + [asyncio.create_task(due()) for _ in range(3)]
    start.set()
    taken = [claimed for claimer in await asyncio.gather(*tasks) for claimed in claimer]

    assert taken, "nothing was claimed: the race proved nothing"
    assert len(taken) == len({claimed.id for claimed in taken}), "a delivery was claimed twice"
    assert all(claimed.attempt == 1 for claimed in taken)
    rows = await pool.fetch("SELECT id, state, attempt FROM deliveries WHERE id = ANY($1)", delivery_ids)
    sending = {row["id"] for row in rows if row["state"] == "sending" and row["attempt"] == 1}
    pending = {row["id"] for row in rows if row["state"] == "pending" and row["attempt"] == 0}
    assert sending == {claimed.id for claimed in taken}
    assert len(sending) + len(pending) == len(delivery_ids)


async def test_a_claim_in_a_callers_transaction_goes_with_its_rollback(pool):
    keys = await _deliveries(pool, 3)
    delivery_ids = [key.id for key in keys]
    async with pool.acquire() as connection:
        transaction = connection.transaction()
        await transaction.start()
        taken = await claims.claim_ids(connection, keys, lease_ms=LEASE_MS)
        assert {claimed.id for claimed in taken} == set(delivery_ids)
        assert connection.is_in_transaction()
        await transaction.rollback()
    states = await pool.fetch("SELECT state, attempt FROM deliveries WHERE id = ANY($1)", delivery_ids)
    assert [(row["state"], row["attempt"]) for row in states] == [("pending", 0)] * len(delivery_ids)
    again = await claims.claim_ids(pool, keys, lease_ms=LEASE_MS)  # on a pool: commits on its own
    assert {claimed.id for claimed in again} == set(delivery_ids)
    assert await pool.fetchval("SELECT count(*) FROM deliveries WHERE id = ANY($1) AND state = 'sending'",
                               delivery_ids) == len(delivery_ids)
