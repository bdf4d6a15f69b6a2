"""Migration 0021 (delivery_attempts.sent_headers) on a populated database, both ways.

Upgrading adds the column to the attempts already there, NULL (what they were sent with was not
recorded), and extends the trigger of 0018 to drop a late attempt's headers once its message was
erased; downgrading drops the column and keeps every row and the trigger for excerpts. The
revision below 0021 is read from the migration itself, so the test holds wherever the migrations
chain it.
"""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path

import asyncpg
import pytest

from delivery.platform import migrate

_MIGRATION = Path(__file__).resolve().parents[2] / "migrations" / "versions" / "0021_attempt_sent_headers.py"
_TRIGGER = "SELECT count(*) FROM pg_trigger WHERE tgname = 'delivery_attempts_erased_message'"


def _revision_below() -> str:
    spec = importlib.util.spec_from_file_location("migration_0021", _MIGRATION)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.down_revision


async def _columns(connection: asyncpg.Connection) -> set[str]:
    rows = await connection.fetch(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'delivery_attempts'")
    return {row["column_name"] for row in rows}


async def _delivery(connection: asyncpg.Connection, account_id: uuid.UUID, endpoint_id: uuid.UUID,
                    *, erased: bool) -> uuid.UUID:
    """A dead delivery of a message of its own (erased or kept), with one attempt on record."""
    message_id, delivery_id = uuid.uuid4(), uuid.uuid4()
    await connection.execute("INSERT INTO messages (id, account_id, event_type, payload) VALUES ($1, $2, 't', '{}')",
                             message_id, account_id)
    await connection.execute("INSERT INTO deliveries (id, account_id, message_id, endpoint_id, price, state, attempt,"
                             " attempts_max, dead_reason, finished_at)"
                             " VALUES ($1, $2, $3, $4, 0, 'dead', 1, 1, 'out_of_retries', now())",
                             delivery_id, account_id, message_id, endpoint_id)
    await connection.execute("INSERT INTO delivery_attempts (delivery_id, attempt, account_id, started_at, status_code,"
                             " response_excerpt) VALUES ($1, 1, $2, now(), 500, 'busy')", delivery_id, account_id)
    if erased:
        await connection.execute("UPDATE messages SET payload = NULL, payload_erased_at = now(),"
                                 " payload_erased_by = 'test' WHERE id = $1", message_id)
    return delivery_id


async def test_0021_adds_null_sent_headers_erases_late_ones_and_drops_them_keeping_the_rows(database_url: str):
    """Down to the revision below with attempts written; up: theirs are NULL, a new attempt keeps
    its headers, a non-object is refused, and a late (stale) answer for an erased message keeps
    neither excerpt nor headers; down again: the column goes, the rows stay, and the trigger still
    drops a late excerpt."""
    await migrate.downgrade_async(database_url, _revision_below())
    connection = await asyncpg.connect(database_url)
    try:
        assert "sent_headers" not in await _columns(connection)
        account_id, endpoint_id = uuid.uuid4(), uuid.uuid4()
        await connection.execute("INSERT INTO accounts (id, name) VALUES ($1, 'a')", account_id)
        await connection.execute("INSERT INTO endpoints (id, account_id, url, secret) VALUES ($1, $2, 'https://e.test',"
                                 " 'sealed')", endpoint_id, account_id)
        before = [await _delivery(connection, account_id, endpoint_id, erased=False) for _ in range(3)]

        await migrate.upgrade_async(database_url, "0021")
        rows = await connection.fetch("SELECT delivery_id, sent_headers, response_excerpt FROM delivery_attempts")
        assert {row["delivery_id"]: (row["sent_headers"], row["response_excerpt"]) for row in rows} == dict.fromkeys(
            before, (None, "busy"))
        await connection.execute("UPDATE delivery_attempts SET sent_headers = '{\"X-Tenant\": \"acme\"}'"
                                 " WHERE delivery_id = $1", before[0])
        assert await connection.fetchval("SELECT sent_headers->>'X-Tenant' FROM delivery_attempts"
                                         " WHERE delivery_id = $1", before[0]) == "acme"
        with pytest.raises(asyncpg.CheckViolationError):
            await connection.execute("UPDATE delivery_attempts SET sent_headers = '[1]' WHERE delivery_id = $1",
                                     before[1])
        erased = await _delivery(connection, account_id, endpoint_id, erased=True)
        await connection.execute("UPDATE delivery_attempts SET stale = true, status_code = 200, response_excerpt = 'ok',"
                                 " sent_headers = '{\"X-Tenant\": \"acme\"}' WHERE delivery_id = $1", erased)
        late = await connection.fetchrow("SELECT sent_headers, response_excerpt FROM delivery_attempts"
                                         " WHERE delivery_id = $1", erased)
        assert tuple(late) == (None, None)

        await migrate.downgrade_async(database_url, _revision_below())
        assert "sent_headers" not in await _columns(connection)
        assert await connection.fetchval(_TRIGGER) == 1
        assert {row["delivery_id"] for row in await connection.fetch("SELECT delivery_id FROM delivery_attempts")} == {
            *before, erased}
        await connection.execute("UPDATE delivery_attempts SET stale = true, response_excerpt = 'late'"
                                 " WHERE delivery_id = $1", erased)
        assert await connection.fetchval("SELECT response_excerpt FROM delivery_attempts WHERE delivery_id = $1",
                                         erased) is None
    finally:
        await connection.close()
    await migrate.upgrade_async(database_url)
