"""Group commit split by shard: with HOOKLEDGER_ACCOUNT_SHARDS at 8, each transaction carries the
accounts of one shard only (billing.shards.shard_of: PostgreSQL's partitions, or Citus's shards),
every request still gets its own answer,
the wake-ups name each delivery's account, and the ledger balances. At 1, transactions mix shards
as before: the same check then fails, which shows that it can."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict

import pytest

from billing import accounts, messages, shards
from billing.audit import audit
from delivery.api.group_commit import Coalescer

ACCOUNTS = 24
REQUESTS_PER_ACCOUNT = 10


async def _account_with_endpoint(pool) -> uuid.UUID:
    account = await accounts.create_account(pool, "gc shards", price_per_delivery=1)
    await accounts.top_up(pool, account.id, f"o-{account.id}", 1_000)
    await pool.execute(
        "INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, 'https://example.com')", uuid.uuid4(), account.id
    )
    return account.id


@pytest.mark.parametrize("shard_count, shard_hash", [(1, "postgres"), (8, "postgres"), (8, "citus")])
async def test_each_transaction_holds_one_shards_accounts(pool, shard_count, shard_hash):
    account_ids = [await _account_with_endpoint(pool) for _ in range(ACCOUNTS)]
    woken: list[tuple[uuid.UUID, uuid.UUID]] = []

    async def wake(keys: list[tuple[uuid.UUID, uuid.UUID]]) -> None:
        woken.extend(keys)

    coalescer = Coalescer(pool, attempts_max=3, batch_max=100, concurrency=2, account_shards=shard_count,
                          account_shard_hash=shard_hash, wake=wake)
    plan = [account_id for _ in range(REQUESTS_PER_ACCOUNT) for account_id in account_ids]
    try:
        results = await asyncio.gather(*(coalescer.submit(messages.MessageRequest(account_id, "t", b"{}"))
                                         for account_id in plan))
    finally:
        await coalescer.close()

    assert all(isinstance(result, messages.MessageCreated) and not result.replayed for result in results), results
    assert len({result.message_id for result in results}) == len(plan)  # each request its own message
    # A transaction's rows carry its id (xmin): the accounts each transaction wrote.
    rows = await pool.fetch("SELECT xmin::text AS transaction, account_id FROM messages")
    assert len(rows) == len(plan)
    by_transaction: dict[str, set[uuid.UUID]] = defaultdict(set)
    for row in rows:
        by_transaction[row["transaction"]].add(row["account_id"])
    shards_per_transaction = [{shards.shard_of(account_id, 8, shard_hash) for account_id in accounts_written}
                              for accounts_written in by_transaction.values()]
    assert len(by_transaction) < len(plan)  # still coalesced
    if shard_count == 8:
        assert all(len(touched) == 1 for touched in shards_per_transaction), shards_per_transaction
        assert any(len(accounts_written) > 1 for accounts_written in by_transaction.values())  # several accounts a shard
    else:
        assert any(len(touched) > 1 for touched in shards_per_transaction)
    # Every delivery is woken once, with its own account.
    deliveries = await pool.fetch("SELECT account_id, id FROM deliveries")
    assert sorted(woken) == sorted((row["account_id"], row["id"]) for row in deliveries)
    assert len(deliveries) == len(plan)
    assert (await audit(pool)).clean
    balances = await pool.fetch("SELECT balance FROM accounts WHERE id = ANY($1)", account_ids)
    assert [row["balance"] for row in balances] == [1_000 - REQUESTS_PER_ACCOUNT] * ACCOUNTS
