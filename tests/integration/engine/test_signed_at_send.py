"""webhook-timestamp is when the request left, not when it was queued behind its endpoint's other sends.

Receivers refuse a timestamp outside their tolerance (5 minutes in Standard Webhooks' libraries).
A deliver job of hundreds for one endpoint queues its sends behind the endpoint's concurrency, so
a timestamp taken when the batch was queued aged with every send before it (found in review: 1 s
a send here, so a long lease could have carried sends past every receiver's tolerance).
"""

from __future__ import annotations

import asyncio
import time

from billing.messages import MessageRequest, create_message
from delivery.platform import config
from engine_helpers import add_account, add_endpoint, all_finished, fast_environment, running_worker, wait_for, keys_of

SENDS = 6
RECEIVER_SECONDS = 0.5


async def test_each_send_is_stamped_as_it_leaves(pool, database_url, redis_url, keyring, receiver_factory, arq_queue):
    settings = config.load(fast_environment(database_url, redis_url, keyring, HOOKLEDGER_SENDS_PER_ENDPOINT_MAX="1"))
    arrivals: list[float] = []

    async def slow(number: int):
        arrivals.append(time.time())
        await asyncio.sleep(RECEIVER_SECONDS)
        return 200

    receiver = await receiver_factory(slow)
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, receiver, keyring)
    ids = []
    for n in range(SENDS):
        created = await create_message(pool, MessageRequest(account_id, "t", b'{"n": %d}' % n),
                                       attempts_max=settings.ledger.attempts_max)
        ids += [d.id for d in created.deliveries]
    async with running_worker(settings, pool):
        await arq_queue.wake(await keys_of(pool, ids))  # one job: the sends queue one at a time behind the first
        await wait_for(lambda: all_finished(pool, ids), timeout_seconds=30)
    assert len(receiver.received) == SENDS and receiver.verified == SENDS
    # One send at a time: each leaves only after the receiver answered the one before, at least
    # RECEIVER_SECONDS after that one arrived. Stamped as it leaves, its whole-second stamp is then
    # at least that moment's whole second; a load that delays the send only makes the stamp later.
    # Stamped when the job queued them, every stamp would be at most the first arrival's second,
    # and the last send (which left 2.5 s after the first arrived) would fail this.
    stamps = [int(entry["headers"]["webhook-timestamp"]) for entry in receiver.received]
    for number in range(1, SENDS):
        assert stamps[number] >= int(arrivals[number - 1] + RECEIVER_SECONDS), (number, stamps, arrivals)
    assert all(stamp <= arrived for stamp, arrived in zip(stamps, arrivals)), (stamps, arrivals)
