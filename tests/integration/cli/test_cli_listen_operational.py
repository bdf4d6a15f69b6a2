"""`hookledger listen --secret <operational secret>` verifies an operational event as a receiver would:
sent by the operational sender under the event's id, with the operational endpoint's own secret."""

from __future__ import annotations

import sys
from pathlib import Path

from billing import accounts
from delivery.store import operational as store
from signing import Keyring, generate_at_rest_key, generate_secret
from test_cli_listen import Listener

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from operational_helpers import send_due  # noqa: E402


async def test_listen_verifies_an_operational_event(pool):
    secret = generate_secret()
    keyring = Keyring({"k1": generate_at_rest_key()}, "k1")
    listener = Listener("--secret", secret)
    try:
        account = await accounts.create_account(pool, "listening", price_per_delivery=1)
        await store.create_endpoint(pool, account.id, f"{listener.url}/webhooks", secret=secret, keyring=keyring,
                                    event_types=["topup.applied"], description="", enabled=True)
        await accounts.top_up(pool, account.id, "order-listen", 25)
        event_id = await pool.fetchval("SELECT id FROM operational_events WHERE account_id = $1", account.id)
        await send_due(pool, keyring)
        line = listener.line()
        assert line.startswith(f"received {event_id}  topup.applied  signed "), line
        assert '"order_id":"order-listen"' in line  # the body, byte for byte
        assert await pool.fetchval("SELECT state FROM operational_deliveries") == "delivered"
    finally:
        assert listener.stop() == 0
