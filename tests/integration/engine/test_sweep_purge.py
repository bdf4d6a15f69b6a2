"""The sweep's purge of the API's stored answers runs after the deliveries' own work, and its
failure does not stop that work (found in review: first in the sweep, a worker on a database
before migration 0008, which only the API applies, failed every sweep before expiring a lease)."""

from __future__ import annotations

from billing.messages import MessageRequest, create_message
from delivery.engine.pipeline import Engine, EngineSettings
from delivery.engine.sender import Sender
from delivery.store.signer_cache import SignerCache
from engine_helpers import add_account, add_endpoint


async def test_a_purge_that_fails_does_not_stop_the_sweep(pool, receiver_factory, keyring):
    account_id = await add_account(pool)
    await add_endpoint(pool, account_id, await receiver_factory(), keyring)
    created = await create_message(pool, MessageRequest(account_id, "e", b"{}"), attempts_max=3)
    delivery_id = created.deliveries[0].id
    await pool.execute("UPDATE deliveries SET state = 'sending', attempt = 1, leased_until = now() - interval '1 minute'"
                       " WHERE id = $1", delivery_id)
    await pool.execute("DROP TABLE idempotent_responses")
    sender = Sender()
    try:
        await Engine(pool, sender, None, SignerCache(keyring), EngineSettings(sweep_batches_max=0)).sweep()
    finally:
        await sender.close()
    assert await pool.fetchval("SELECT state FROM deliveries WHERE id = $1", delivery_id) == "pending"
