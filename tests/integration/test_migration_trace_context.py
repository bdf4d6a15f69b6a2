"""Migration 0017 (messages.trace_context) on a populated database, both ways.

Upgrading adds the column to the messages already there, NULL (they were written untraced);
downgrading drops it and keeps every row. The revision below 0017 is read from the migration
itself, so the test holds wherever the migrations chain it.
"""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path

import asyncpg
import pytest

from delivery.platform import migrate

_MIGRATION = Path(__file__).resolve().parents[2] / "migrations" / "versions" / "0017_message_trace_context.py"
TRACEPARENT = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"


def _revision_below() -> str:
    spec = importlib.util.spec_from_file_location("migration_0017", _MIGRATION)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.down_revision


async def _columns(connection: asyncpg.Connection) -> set[str]:
    rows = await connection.fetch("SELECT column_name FROM information_schema.columns WHERE table_name = 'messages'")
    return {row["column_name"] for row in rows}


async def test_0017_adds_a_null_trace_context_to_the_messages_there_and_drops_it_keeping_them(database_url: str):
    """Down to the revision below, messages written; up: each has trace_context NULL, a new one keeps its own and a
    longer one than a traceparent could be is refused; down again: the column goes, the messages stay."""
    await migrate.downgrade_async(database_url, _revision_below())
    connection = await asyncpg.connect(database_url)
    try:
        assert "trace_context" not in await _columns(connection)
        account_id = uuid.uuid4()
        await connection.execute("INSERT INTO accounts (id, name) VALUES ($1, 'a')", account_id)
        before = [uuid.uuid4() for _ in range(3)]
        for message_id in before:
            await connection.execute("INSERT INTO messages (id, account_id, event_type, payload) VALUES ($1, $2, 't', '{}')",
                                     message_id, account_id)
        await migrate.upgrade_async(database_url, "0017")
        rows = await connection.fetch("SELECT id, trace_context FROM messages")
        assert {row["id"]: row["trace_context"] for row in rows} == dict.fromkeys(before)
        traced = uuid.uuid4()
        await connection.execute("INSERT INTO messages (id, account_id, event_type, payload, trace_context)"
                                 " VALUES ($1, $2, 't', '{}', $3)", traced, account_id, TRACEPARENT)
        assert await connection.fetchval("SELECT trace_context FROM messages WHERE id = $1", traced) == TRACEPARENT
        with pytest.raises(asyncpg.CheckViolationError):
            await connection.execute("INSERT INTO messages (id, account_id, event_type, payload, trace_context)"
                                     " VALUES ($1, $2, 't', '{}', $3)", uuid.uuid4(), account_id, "x" * 129)
        await migrate.downgrade_async(database_url, _revision_below())
        assert "trace_context" not in await _columns(connection)
        assert {row["id"] for row in await connection.fetch("SELECT id FROM messages")} == {*before, traced}
    finally:
        await connection.close()
    await migrate.upgrade_async(database_url)
