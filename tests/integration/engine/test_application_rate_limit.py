"""An application's rate_limit_per_second is the default of its endpoints: one without a limit of
its own is throttled at its application's; one with its own keeps it; with neither, no limit.

Judged from the claim's rows (what the pipeline hands the throttle) and from a loopback receiver's
own clock, never from how long something took."""

from __future__ import annotations

import bisect
import contextlib
import time

from billing.messages import MessageRequest, create_messages
from delivery.engine import claims
from delivery.platform import config
from engine_helpers import keys_of, add_account, add_endpoint, fast_environment, running_worker, wait_for

APPLICATION_PER_SECOND = 4
LEASE_MS = 30_000


async def _deliveries(pool, settings, account_id, count: int) -> list:
    created = await create_messages(pool, [MessageRequest(account_id, "order.paid", b'{"n": %d}' % n)
                                           for n in range(count)], attempts_max=settings.ledger.attempts_max)
    return [delivery.id for message in created for delivery in message.deliveries]


async def test_the_claim_gives_each_endpoint_its_own_limit_else_its_applications(pool, keyring, receiver_factory):
    receiver = await receiver_factory(lambda number: 200)
    limited, unlimited = await add_account(pool), await add_account(pool)
    await pool.execute("UPDATE applications SET rate_limit_per_second = 7 WHERE id = $1", limited)
    own = await add_endpoint(pool, limited, receiver, keyring)
    await pool.execute("UPDATE endpoints SET rate_limit_per_second = 30 WHERE id = $1", own)
    inherits = await add_endpoint(pool, limited, receiver, keyring)
    free = await add_endpoint(pool, unlimited, receiver, keyring)
    delivery_ids = []
    for account_id in (limited, unlimited):
        created = await create_messages(pool, [MessageRequest(account_id, "order.paid", b"{}")], attempts_max=3)
        delivery_ids += [delivery.id for message in created for delivery in message.deliveries]
    loaded = await claims.claim_ids_for_send(pool, await keys_of(pool, delivery_ids), lease_ms=LEASE_MS)
    limits = {claimed.endpoint_id: row["rate_limit_per_second"] for claimed, row in loaded}
    assert limits == {own: 30, inherits: 7, free: None}
    # The claim by due time reads the same columns.
    await pool.execute("UPDATE deliveries SET state = 'pending', attempt = 0, leased_until = NULL WHERE id = ANY($1)",
                       delivery_ids)
    loaded = await claims.claim_due_for_send(pool, batch_size=10, lease_ms=LEASE_MS)
    assert {claimed.endpoint_id: row["rate_limit_per_second"] for claimed, row in loaded} == limits


async def test_an_endpoint_without_a_limit_is_sent_at_most_its_applications_limit_a_second(
        pool, database_url, redis_url, keyring, receiver_factory, arq_queue):
    """4/s on the application, none on the endpoint, two workers, 16 deliveries: every one arrives,
    at most 4 in any second of the receiver's clock."""
    settings = config.load(fast_environment(database_url, redis_url, keyring, HOOKLEDGER_LEASE_MS="10000"))
    times: list[float] = []
    receiver = await receiver_factory(lambda number: times.append(time.monotonic()) or 200)
    account_id = await add_account(pool, balance=1000)
    await pool.execute("UPDATE applications SET rate_limit_per_second = $2 WHERE id = $1", account_id,
                       APPLICATION_PER_SECOND)
    await add_endpoint(pool, account_id, receiver, keyring)
    count = APPLICATION_PER_SECOND * 4
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(2):
            await stack.enter_async_context(running_worker(settings, pool))
        delivery_ids = await _deliveries(pool, settings, account_id, count)
        await arq_queue.wake(await keys_of(pool, delivery_ids))
        await wait_for(lambda: _delivered(pool, delivery_ids), timeout_seconds=120)
    assert len(times) == count
    times.sort()
    most = max(bisect.bisect_left(times, start + 1.0) - index for index, start in enumerate(times))
    assert most <= APPLICATION_PER_SECOND, most


async def _delivered(pool, delivery_ids) -> bool:
    return await pool.fetchval("SELECT count(*) FROM deliveries WHERE id = ANY($1::uuid[]) AND state = 'delivered'",
                               delivery_ids) == len(delivery_ids)
