"""Migration 0016 (applications) on a populated database: every account gets its default
application, existing endpoints and messages move to it without loss, the ledger still proves
every credit; the downgrade restores the rows as they were, and refuses while other applications exist."""

from __future__ import annotations

import hashlib
import uuid

import asyncpg
import pytest

from billing import messages
from billing.audit import audit
from delivery.platform import migrate

_SNAPSHOT = {
    "accounts": "SELECT id, name, status, balance, price_per_delivery FROM accounts ORDER BY id",
    "endpoints": "SELECT id, account_id, url, event_types, enabled, deleted_at FROM endpoints ORDER BY id",
    "messages": "SELECT id, account_id, event_type, payload, idempotency_key FROM messages ORDER BY id",
    "deliveries": "SELECT id, account_id, message_id, endpoint_id, price, state, dead_reason FROM deliveries ORDER BY id",
    "ledger_entries": "SELECT id, account_id, delivery_id, kind, amount FROM ledger_entries ORDER BY seq",
}


async def _snapshot(connection) -> dict:
    return {name: [tuple(row) for row in await connection.fetch(query)] for name, query in _SNAPSHOT.items()}


async def _populate(connection) -> None:
    """At 0013, by SQL: two accounts, each topped up, with endpoints (one deleted), messages and
    charged deliveries (one dead and refunded)."""
    for number in range(2):
        account_id = uuid.uuid4()
        await connection.execute("INSERT INTO accounts (id, name, balance) VALUES ($1, $2, 10)", account_id, f"a{number}")
        await connection.execute("INSERT INTO ledger_entries (id, account_id, kind, amount) VALUES ($1, $2, 'topup', 10)",
                                 f"topup:{account_id}", account_id)
        endpoints = [uuid.uuid4(), uuid.uuid4()]
        for index, endpoint_id in enumerate(endpoints):
            await connection.execute("INSERT INTO endpoints (id, account_id, url, deleted_at)"
                                     " VALUES ($1, $2, 'https://example.com/h', CASE WHEN $3 THEN now() END)",
                                     endpoint_id, account_id, index == 1)
        for index in range(3):
            message_id, delivery_id = uuid.uuid4(), uuid.uuid4()
            # The request hash as the create path wrote it before 0016: a retry with the key still replays.
            await connection.execute("INSERT INTO messages (id, account_id, event_type, payload, idempotency_key,"
                                     " request_hash) VALUES ($1, $2, 'invoice.paid', '{}', $3, $4)",
                                     message_id, account_id, f"k{index}", hashlib.sha256(b"invoice.paid\0{}").digest())
            await connection.execute("INSERT INTO deliveries (id, account_id, message_id, endpoint_id, price, attempts_max)"
                                     " VALUES ($1, $2, $3, $4, 1, 3)", delivery_id, account_id, message_id, endpoints[0])
            await connection.execute("INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount)"
                                     " VALUES ($1, $2, $3, 'charge', -1)", f"charge:{delivery_id}", account_id, delivery_id)
            await connection.execute("UPDATE accounts SET balance = balance - 1 WHERE id = $1", account_id)
            if index == 0:
                await connection.execute("UPDATE deliveries SET state = 'dead', dead_reason = 'out_of_retries',"
                                         " finished_at = now() WHERE id = $1", delivery_id)
                await connection.execute("INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount)"
                                         " VALUES ($1, $2, $3, 'refund', 1)", f"refund:{delivery_id}", account_id, delivery_id)
                await connection.execute("UPDATE accounts SET balance = balance + 1 WHERE id = $1", account_id)


async def test_upgrade_moves_everything_to_a_default_application_and_downgrades(database_url):
    """Upgrade from 0013 with data: nothing lost or changed, every row in its account's default
    application, the audit clean, an old key still replays its message, a new account (even one
    inserted by hand) gets its default application. Downgrading gives back the rows as they were;
    with another application, or an endpoint subscribed to a wildcard, the downgrade refuses and
    changes nothing."""
    await migrate.downgrade_async(database_url, "0013")
    connection = await asyncpg.connect(database_url)
    try:
        await _populate(connection)
        before = await _snapshot(connection)
    finally:
        await connection.close()

    await migrate.upgrade_async(database_url)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        assert await _snapshot(pool) == before
        defaults = await pool.fetch("SELECT id, account_id, name FROM applications ORDER BY id")
        assert [(row["id"], row["name"]) for row in defaults] == [(row[0], "default") for row in before["accounts"]]
        assert all(row["id"] == row["account_id"] for row in defaults)
        counts = dict(await pool.fetch("SELECT account_id, live FROM application_counts"))
        assert counts == {row[0]: 1 for row in before["accounts"]}
        assert await pool.fetchval("SELECT count(*) FROM endpoints WHERE application_id <> account_id") == 0
        assert await pool.fetchval("SELECT count(*) FROM messages WHERE application_id <> account_id") == 0
        report = await audit(pool)
        assert report.clean, report.to_json()
        account_id = before["accounts"][0][0]
        replayed = await messages.create_message(pool, messages.MessageRequest(account_id, "invoice.paid", b"{}", "k1"),
                                                 attempts_max=3)
        assert replayed.replayed and len(replayed.deliveries) == 1
        new_account = uuid.uuid4()
        await pool.execute("INSERT INTO accounts (id, name) VALUES ($1, 'by hand')", new_account)
        assert await pool.fetchval("SELECT name FROM applications WHERE id = $1 AND account_id = $1", new_account) == "default"
        assert await pool.fetchval("SELECT live FROM application_counts WHERE account_id = $1", new_account) == 1
    finally:
        await pool.close()

    await migrate.downgrade_async(database_url, "0013")
    connection = await asyncpg.connect(database_url)
    try:
        after = await _snapshot(connection)
        assert {name: rows for name, rows in after.items() if name != "accounts"} == {
            name: rows for name, rows in before.items() if name != "accounts"}
        assert set(before["accounts"]) < set(after["accounts"])  # and the account inserted by hand
    finally:
        await connection.close()

    await migrate.upgrade_async(database_url)
    # An endpoint subscribed to a wildcard would receive other messages once downgraded: refused.
    connection = await asyncpg.connect(database_url)
    try:
        endpoint_id = before["endpoints"][0][0]
        await connection.execute("UPDATE endpoints SET event_types = '{invoice.*}' WHERE id = $1", endpoint_id)
    finally:
        await connection.close()
    with pytest.raises(Exception, match="wildcard subscriptions or channels"):
        await migrate.downgrade_async(database_url, "0013")
    # So does any application besides the defaults (its rows are kept for good: messages point at them).
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute("UPDATE endpoints SET event_types = NULL WHERE id = $1", endpoint_id)
        await connection.execute("INSERT INTO applications (id, account_id, name) VALUES ($1, $2, 'customer')",
                                 uuid.uuid4(), before["accounts"][0][0])
        kept = await _snapshot(connection)
        head = await connection.fetchval("SELECT version_num FROM alembic_version")
    finally:
        await connection.close()
    with pytest.raises(Exception, match="applications other than the accounts' defaults exist"):
        await migrate.downgrade_async(database_url, "0013")
    connection = await asyncpg.connect(database_url)
    try:
        assert await connection.fetchval("SELECT version_num FROM alembic_version") == head  # all rolled back
        assert await _snapshot(connection) == kept
    finally:
        await connection.close()
