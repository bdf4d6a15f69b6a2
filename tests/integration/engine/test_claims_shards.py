"""Claims name their accounts, one shard's per statement, and still never take a delivery twice.

With HOOKLEDGER_ACCOUNT_SHARDS at 1 a claim is one statement as before; at 8, the deliveries to
claim are grouped by the shard of their account (billing.shards.partition_of) and each group is
one statement, which a distributed engine can route to that shard alone. Every claim statement is
captured as PostgreSQL receives it (asyncpg's query logger) and its accounts checked. A job of the
previous version (bare delivery ids) is still claimed, by id alone.
"""

from __future__ import annotations

import asyncio
import random
import uuid

import pytest
from engine_helpers import add_account, add_endpoint, create_logged_pool, wait_for

from billing import accounts, shards
from billing.messages import MessageRequest, create_messages
from delivery.engine import claims
from delivery.engine.pipeline import Engine, EngineSettings
from delivery.engine.retry import RetrySchedule, RetrySettings
from delivery.engine.sender import Sender, SenderSettings
from delivery.platform import worker as worker_module
from delivery.store.signer_cache import SignerCache

LEASE_MS = 60_000
ACCOUNTS = 20
MESSAGES_PER_ACCOUNT = 15  # one endpoint each: 300 deliveries
ROUNDS = 50
ATTEMPTS_MAX = ROUNDS  # each round claims every delivery once more
CLAIMING = "SET state = 'sending'"  # every claim statement, and only those, says this


async def _world(pool) -> list[claims.DeliveryKey]:
    """ACCOUNTS accounts with one endpoint each and MESSAGES_PER_ACCOUNT messages: their deliveries' keys."""
    keys = []
    for number in range(ACCOUNTS):
        account = await accounts.create_account(pool, f"shard test {number}", price_per_delivery=1)
        await accounts.top_up(pool, account.id, f"o-{account.id}", 1_000)
        await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, 'https://example.com')",
                           uuid.uuid4(), account.id)
        created = await create_messages(
            pool, [MessageRequest(account.id, "t", b"{}") for _ in range(MESSAGES_PER_ACCOUNT)], attempts_max=ATTEMPTS_MAX)
        keys += [claims.DeliveryKey(account.id, delivery.id) for message in created for delivery in message.deliveries]
    return keys


async def _check_partitions(pool, keys: list[claims.DeliveryKey]) -> None:
    """Where the schema is hash-partitioned (HOOKLEDGER_ACCOUNT_PARTITIONS), every delivery lies in
    the partition whose remainder partition_of names for its account."""
    bounds = await pool.fetch(
        "SELECT c.oid::regclass::text AS partition, pg_get_expr(c.relpartbound, c.oid) AS bound FROM pg_inherits i"
        " JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'deliveries'::regclass")
    if not bounds:
        return  # plain tables: nothing to place
    remainder_of = {}
    for row in bounds:  # FOR VALUES WITH (modulus 8, remainder 3)
        modulus, remainder = (int(part.split()[-1]) for part in row["bound"].split("(")[1].rstrip(")").split(","))
        remainder_of[row["partition"]] = (modulus, remainder)
    placed = await pool.fetch("SELECT tableoid::regclass::text AS partition, account_id FROM deliveries")
    assert len(placed) == len(keys)
    for row in placed:
        modulus, remainder = remainder_of[row["partition"]]
        assert shards.partition_of(row["account_id"], modulus) == remainder


@pytest.mark.parametrize("shard_count, shard_hash, rounds", [(1, "postgres", ROUNDS), (8, "postgres", ROUNDS),
                                                           (8, "citus", 10)])
async def test_concurrent_claimers_take_each_delivery_once_per_attempt(pool, database_url, shard_count, shard_hash,
                                                                       rounds):
    """8 claimers (5 by keys, 3 sweeping) race over 300 deliveries of 20 accounts, 50 rounds: each
    round claims every delivery exactly once, on its next attempt; with 8 shards, every claim
    statement names the accounts of one shard only (PostgreSQL's partition, or Citus's shard with
    shard_hash "citus"), and the claims reach several shards."""
    keys = await _world(pool)
    await _check_partitions(pool, keys)
    every = {key.id for key in keys}
    account_of = {key.id: key.account_id for key in keys}
    statements: list[tuple[str, tuple]] = []
    logged = await create_logged_pool(database_url, lambda query: statements.append((query.query, query.args)))
    rng = random.Random(shard_count)
    try:
        for round_number in range(rounds):
            start = asyncio.Event()

            async def by_keys(start: asyncio.Event, sample: list[list[claims.DeliveryKey]]) -> list[claims.Claimed]:
                await start.wait()
                taken = []
                for chosen in sample:
                    loaded = await claims.claim_ids_for_send(logged, chosen, lease_ms=LEASE_MS, shards=shard_count,
                                                              shard_hash=shard_hash)
                    taken += [claimed for claimed, _ in loaded]
                    await asyncio.sleep(0)
                return taken

            async def due(start: asyncio.Event) -> list[claims.Claimed]:
                await start.wait()
                taken = []
                for _ in range(4):
                    taken += await claims.claim_due(logged, batch_size=25, lease_ms=LEASE_MS, shards=shard_count,
                                                    shard_hash=shard_hash)
                    await asyncio.sleep(0)
                return taken

            tasks = ([asyncio.create_task(by_keys(start, [rng.sample(keys, 30) for _ in range(4)])) for _ in range(5)]
                     + [asyncio.create_task(due(start)) for _ in range(3)])
            start.set()
            taken = [claimed for claimer in await asyncio.gather(*tasks) for claimed in claimer]
            while rest := await claims.claim_due(logged, batch_size=200, lease_ms=LEASE_MS, shards=shard_count,
                                                 shard_hash=shard_hash):
                taken += rest  # what the racing claimers left: claimed now, alone

            assert len(taken) == len({claimed.id for claimed in taken}), f"round {round_number}: claimed twice"
            assert {claimed.id for claimed in taken} == every, f"round {round_number}: not every delivery claimed"
            assert {claimed.attempt for claimed in taken} == {round_number + 1}
            assert all(claimed.account_id == account_of[claimed.id] for claimed in taken)
            attempts = await pool.fetch("SELECT state, attempt, count(*) FROM deliveries GROUP BY 1, 2")
            assert [tuple(row) for row in attempts] == [("sending", round_number + 1, len(every))]
            # Hand every lease back unused, so the next round claims each delivery on its next attempt.
            await pool.execute("UPDATE deliveries SET state = 'pending', leased_until = NULL WHERE state = 'sending'")
    finally:
        await logged.close()

    claiming = [(query, args) for query, args in statements if CLAIMING in query]
    assert claiming, "no claim statement was captured: the check below proved nothing"
    if shard_count == 1:
        return
    shards_seen = set()
    for query, args in claiming:
        # Every claim statement is the one by keys: $1 the accounts, $3 the deliveries, pairwise.
        assert "k.account_id" in query and "LIMIT" not in query, query
        account_ids, delivery_ids = args[0], args[2]
        assert len(account_ids) == len(delivery_ids) and account_ids
        assert all(account_of[delivery_id] == account_id for account_id, delivery_id in zip(account_ids, delivery_ids))
        claim_shards = {shards.shard_of(account_id, shard_count, shard_hash) for account_id in account_ids}
        assert len(claim_shards) == 1, f"one statement named accounts of shards {claim_shards}"
        shards_seen |= claim_shards
    assert len(shards_seen) > 1, "every account fell in one shard: the check proved nothing"
    # The sweep's first read takes no lock: only the per-shard claims lock rows.
    reads = [query for query, _ in statements if "ORDER BY next_attempt_at" in query]
    assert reads and not any("FOR UPDATE" in query for query in reads)


async def test_a_job_of_the_previous_version_is_claimed_by_id(pool, keyring, receiver_factory):
    """A `deliver` job with bare delivery ids (queued by the previous version) is claimed and sent,
    and so is one in the new format; with 8 shards as with 1."""
    receiver = await receiver_factory()
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring)
    created = await create_messages(pool, [MessageRequest(account_id, "e", b"{}") for _ in range(4)], attempts_max=3)
    old, new = [message.deliveries[0].id for message in created[:2]], [message.deliveries[0].id for message in created[2:]]
    sender = Sender(SenderSettings(allow_loopback=True))
    settings = EngineSettings(lease_ms=5000, retry=RetrySettings(schedule=RetrySchedule((60,))), account_shards=8)
    engine = Engine(pool, sender, None, SignerCache(keyring), settings, random.Random(1))
    try:
        ctx = {"engine": engine}
        assert await worker_module.deliver(ctx, [str(delivery_id) for delivery_id in old]) == 2
        assert await worker_module.deliver(ctx, [[str(account_id), str(delivery_id)] for delivery_id in new]) == 2
        await wait_for(lambda: pool.fetchval("SELECT count(*) = 4 FROM deliveries WHERE state = 'delivered'"))
    finally:
        await engine.close()
        await sender.close()
    assert sorted(request["id"] for request in receiver.received) == sorted(str(i) for i in old + new)


async def test_a_key_naming_another_account_claims_nothing(pool):
    """The claim probes (account, id): a delivery named with the wrong account is not claimed."""
    keys = (await _world_of_one(pool))
    wrong = [claims.DeliveryKey(uuid.uuid4(), key.id) for key in keys]
    assert await claims.claim_ids(pool, wrong, lease_ms=LEASE_MS, shards=8) == []
    assert {claimed.id for claimed in await claims.claim_ids(pool, keys, lease_ms=LEASE_MS, shards=8)} == {
        key.id for key in keys}


async def _world_of_one(pool) -> list[claims.DeliveryKey]:
    account = await accounts.create_account(pool, "one", price_per_delivery=1)
    await accounts.top_up(pool, account.id, f"o-{account.id}", 100)
    await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, 'https://example.com')",
                       uuid.uuid4(), account.id)
    created = await create_messages(pool, [MessageRequest(account.id, "t", b"{}") for _ in range(3)], attempts_max=3)
    return [claims.DeliveryKey(account.id, message.deliveries[0].id) for message in created]
