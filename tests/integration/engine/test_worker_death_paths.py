"""Death paths 2-4 and the refund-then-recover path, reached through the running worker."""

from __future__ import annotations

import asyncio
import random

from billing.audit import audit
from billing.messages import MessageRequest, create_message
from delivery.platform import config
from delivery.engine import pipeline as engine_module
from delivery.engine.results import AttemptResult, record_results
from delivery.engine.sender import Sender, SenderSettings
from delivery.store.signer_cache import SignerCache
from engine_helpers import (keys_of, PRICE, add_account, add_endpoint, all_finished, fast_environment, ledger_of,
                            running_worker, states, wait_for)


async def _create(pool, account_id, attempts_max):
    created = await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=attempts_max)
    return created.deliveries[0].id


def _slow_retry_settings(database_url, redis_url, keyring):
    # A first retry far enough away for the test to change the world in between.
    return config.load(fast_environment(database_url, redis_url, keyring, HOOKLEDGER_RETRY_SCHEDULE="0,3,0.2"))


async def _fail_once_then_change(pool, database_url, redis_url, keyring, receiver_factory, arq_queue, change):
    settings = _slow_retry_settings(database_url, redis_url, keyring)
    receiver = await receiver_factory(lambda number: 500)
    account_id = await add_account(pool)
    endpoint_id = await add_endpoint(pool, account_id, receiver, keyring)
    async with running_worker(settings, pool):
        delivery_id = await _create(pool, account_id, settings.ledger.attempts_max)
        await arq_queue.wake(await keys_of(pool, [delivery_id]))
        await wait_for(lambda: pool.fetchval(
            "SELECT state = 'pending' AND attempt = 1 FROM deliveries WHERE id = $1", delivery_id))
        await change(account_id, endpoint_id)
        await wait_for(lambda: all_finished(pool, [delivery_id]))
    assert len(receiver.received) == 1  # the second attempt was never sent
    return delivery_id


async def test_endpoint_deleted_before_the_retry(pool, database_url, redis_url, keyring, receiver_factory, arq_queue):
    """Death path 2: the endpoint is gone when the retry comes -> dead (endpoint_deleted), refunded once."""

    async def delete(account_id, endpoint_id):
        await pool.execute("UPDATE endpoints SET deleted_at = now() WHERE id = $1", endpoint_id)

    delivery_id = await _fail_once_then_change(pool, database_url, redis_url, keyring, receiver_factory, arq_queue,
                                               delete)
    assert (await states(pool, [delivery_id]))[delivery_id]["dead_reason"] == "endpoint_deleted"
    assert await ledger_of(pool, delivery_id) == {"charge": -PRICE, "refund": PRICE}
    assert (await audit(pool)).clean


async def test_account_closed_before_the_retry(pool, database_url, redis_url, keyring, receiver_factory, arq_queue):
    """Death path 3: the pre-send check finds the account closing -> dead (account_closed), refunded once."""

    async def close(account_id, endpoint_id):
        await pool.execute("UPDATE accounts SET status = 'closing' WHERE id = $1", account_id)

    delivery_id = await _fail_once_then_change(pool, database_url, redis_url, keyring, receiver_factory, arq_queue,
                                               close)
    assert (await states(pool, [delivery_id]))[delivery_id]["dead_reason"] == "account_closed"
    assert await ledger_of(pool, delivery_id) == {"charge": -PRICE, "refund": PRICE}


async def test_endpoint_disabled_before_the_retry(pool, database_url, redis_url, keyring, receiver_factory, arq_queue):
    """Death path 3: the pre-send check finds the endpoint disabled -> dead (endpoint_disabled), refunded once."""

    async def disable(account_id, endpoint_id):
        await pool.execute("UPDATE endpoints SET enabled = false WHERE id = $1", endpoint_id)

    delivery_id = await _fail_once_then_change(pool, database_url, redis_url, keyring, receiver_factory, arq_queue,
                                               disable)
    assert (await states(pool, [delivery_id]))[delivery_id]["dead_reason"] == "endpoint_disabled"
    assert await ledger_of(pool, delivery_id) == {"charge": -PRICE, "refund": PRICE}


async def test_stale_success_after_lease_expiry_is_reclaimed_once(
        pool, database_url, redis_url, keyring, receiver_factory, arq_queue):
    """A worker paused past its lease: the sweeper expires the lease, the claim finds the attempt limit
    reached and settles it (death path 4, attempts_exhausted, refunded); then the paused send succeeds
    and the refund is taken back once (reclaim), the delivery ends delivered, net -price."""
    settings = config.load(fast_environment(database_url, redis_url, keyring, HOOKLEDGER_RETRY_SCHEDULE="0"))
    release = asyncio.Event()

    async def stall(number):
        await release.wait()
        return 200

    receiver = await receiver_factory(stall)
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring, timeout_ms=10_000)
    delivery_id = await _create(pool, account_id, attempts_max=1)
    # The paused worker: its send is on the wire when, to everyone else, its lease runs out, exactly
    # what a worker stopped by the scheduler or a long GC pause looks like (its own clock says the
    # send fits the lease, so it was sent; the database's says the lease is over).
    paused = engine_module.Engine(
        pool, Sender(SenderSettings(allow_loopback=True, timeout_ms_default=10_000, timeout_ms_max=10_000)), None, SignerCache(keyring),
        engine_module.EngineSettings(lease_ms=60_000), random.Random(1))
    send = asyncio.create_task(paused.deliver_ids(await keys_of(pool, [delivery_id])))
    await wait_for(lambda: asyncio.sleep(0, result=len(receiver.received) == 1))
    await pool.execute("UPDATE deliveries SET leased_until = now() - interval '1 second' WHERE id = $1", delivery_id)
    async with running_worker(settings, pool):
        await wait_for(lambda: pool.fetchval("SELECT state = 'dead' FROM deliveries WHERE id = $1", delivery_id))
    row = (await states(pool, [delivery_id]))[delivery_id]
    assert row["dead_reason"] == "attempts_exhausted"
    assert await ledger_of(pool, delivery_id) == {"charge": -PRICE, "refund": PRICE}
    release.set()
    report = await send
    await paused.sender.close()
    assert report.summary.reclaimed == [delivery_id]
    assert (await states(pool, [delivery_id]))[delivery_id]["state"] == "delivered"
    assert await ledger_of(pool, delivery_id) == {"charge": -PRICE, "refund": PRICE, "reclaim": -PRICE}
    # A second report of the same stale success reclaims nothing more.
    again = await record_results(pool, [AttemptResult(delivery_id, 1, account_id, True, 5, 200)])
    assert again.reclaimed == [] and delivery_id in again.stale
    assert await ledger_of(pool, delivery_id) == {"charge": -PRICE, "refund": PRICE, "reclaim": -PRICE}
    assert (await audit(pool)).clean
