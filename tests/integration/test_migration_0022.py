"""Migration 0022 (every key of an account-scoped table includes account_id) on a populated
database, both ways.

Upgrading keeps every row and makes the keys (account_id, <old key>): two accounts may then hold
the same id, and the writes that name the new conflict targets work. Downgrading while two
accounts share an id fails and changes nothing; once they no longer do, it restores the old keys
and keeps the rows.
"""

from __future__ import annotations

import uuid

import asyncpg
import pytest
import sqlalchemy.exc

from delivery.platform import migrate

_KEYS = """
SELECT c.relname || ' ' || pg_get_constraintdef(con.oid) FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid
WHERE con.contype IN ('p', 'u', 'f') AND c.relname = ANY($1::text[]) AND con.conparentid = 0 ORDER BY 1
"""
_TABLES = ["deliveries", "delivery_attempts", "ledger_entries", "operational_deliveries", "applications", "endpoints"]


async def _populate(connection: asyncpg.Connection, account_id: uuid.UUID) -> dict[str, uuid.UUID]:
    """An account with an endpoint, a message, a charged delivery with one attempt, and an
    operational event delivered to an operational endpoint."""
    ids = {name: uuid.uuid4() for name in ("endpoint", "message", "delivery", "event", "operational_endpoint")}
    await connection.execute("INSERT INTO accounts (id, name, balance) VALUES ($1, 'a', 9)", account_id)
    await connection.execute("INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, 'https://e.test')",
                             ids["endpoint"], account_id)
    await connection.execute("INSERT INTO messages (id, account_id, event_type, payload) VALUES ($1, $2, 't', '{}')",
                             ids["message"], account_id)
    await connection.execute("INSERT INTO deliveries (id, account_id, message_id, endpoint_id, price, attempts_max)"
                             " VALUES ($1, $2, $3, $4, 1, 3)", ids["delivery"], account_id, ids["message"], ids["endpoint"])
    await connection.execute("INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount)"
                             " VALUES ('charge:' || $1::uuid::text, $2, $1::uuid, 'charge', -1)", ids["delivery"], account_id)
    await connection.execute("INSERT INTO delivery_attempts (delivery_id, attempt, account_id, started_at, status_code)"
                             " VALUES ($1, 1, $2, now(), 500)", ids["delivery"], account_id)
    await connection.execute("INSERT INTO operational_endpoints (id, account_id, url) VALUES ($1, $2, 'https://o.test')",
                             ids["operational_endpoint"], account_id)
    await connection.execute("INSERT INTO operational_events (id, account_id, type, data)"
                             " VALUES ($1, $2, 'topup.applied', '{}')", ids["event"], account_id)
    await connection.execute("INSERT INTO operational_deliveries (id, account_id, event_id, endpoint_id, attempts_max)"
                             " VALUES ($1, $2, $1, $3, 3)", ids["event"], account_id, ids["operational_endpoint"])
    return ids


async def _counts(connection: asyncpg.Connection) -> list[int]:
    return [await connection.fetchval(f"SELECT count(*) FROM {table}") for table in _TABLES]


async def test_0022_puts_the_account_in_every_key_and_back(database_url: str) -> None:
    """From 0021 with two accounts' rows: upgrade keeps them and keys them by account (a second
    account may reuse an operational endpoint's id, and the new ON CONFLICT targets work); a
    downgrade while the id is shared fails and leaves 0022 in place; without it, the old keys
    come back and the rows stay."""
    await migrate.downgrade_async(database_url, "0021")
    connection = await asyncpg.connect(database_url)
    try:
        old_keys = await connection.fetch(_KEYS, _TABLES)
        assert "deliveries PRIMARY KEY (id)" in {row[0] for row in old_keys}
        first, second = uuid.uuid4(), uuid.uuid4()
        made = await _populate(connection, first)
        await _populate(connection, second)
        counts = await _counts(connection)

        await migrate.upgrade_async(database_url, "0022")
        assert await _counts(connection) == counts
        keys = {row[0] for row in await connection.fetch(_KEYS, _TABLES)}
        assert {"deliveries PRIMARY KEY (account_id, id)", "ledger_entries PRIMARY KEY (account_id, id)",
                "delivery_attempts PRIMARY KEY (account_id, delivery_id, attempt)",
                "applications PRIMARY KEY (account_id, id)",
                "operational_deliveries UNIQUE (account_id, event_id, endpoint_id)",
                "operational_deliveries FOREIGN KEY (account_id, event_id) REFERENCES operational_events(account_id, id)",
                "endpoints FOREIGN KEY (account_id, application_id) REFERENCES applications(account_id, id)"} <= keys
        inserted = await connection.fetchval(
            "INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount)"
            " VALUES ('charge:' || $1::uuid::text, $2, $1::uuid, 'charge', -1) ON CONFLICT (account_id, id) DO NOTHING RETURNING id",
            made["delivery"], first)
        assert inserted is None  # the charge is there: the conflict target names the new key
        await connection.execute("INSERT INTO operational_endpoints (id, account_id, url) VALUES ($1, $2, 'https://x.test')",
                                 made["operational_endpoint"], second)
        with pytest.raises(sqlalchemy.exc.IntegrityError, match="pk_operational_endpoints"):
            await migrate.downgrade_async(database_url, "0021")
        assert await connection.fetchval("SELECT version_num FROM alembic_version") == "0022"

        await connection.execute("DELETE FROM operational_endpoints WHERE id = $1 AND account_id = $2",
                                 made["operational_endpoint"], second)
        await migrate.downgrade_async(database_url, "0021")
        assert {row[0] for row in await connection.fetch(_KEYS, _TABLES)} == {row[0] for row in old_keys}
        assert await _counts(connection) == counts
    finally:
        await connection.close()
    await migrate.upgrade_async(database_url)
