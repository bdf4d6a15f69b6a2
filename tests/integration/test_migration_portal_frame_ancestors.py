"""Migration 0019 (accounts.portal_frame_ancestors) on a populated database, both ways.

Upgrading gives the accounts already there an empty list (nothing may frame their portal); more
than 10 origins are refused; downgrading drops the column and keeps every account. The revisions
are read from the migration itself, so the test holds wherever the migrations chain it.
"""

from __future__ import annotations

import importlib.util
import uuid
from pathlib import Path

import asyncpg
import pytest

from delivery.platform import migrate

_MIGRATION = Path(__file__).resolve().parents[2] / "migrations" / "versions" / "0019_portal_frame_ancestors.py"


def _migration():
    spec = importlib.util.spec_from_file_location("migration_portal_frame_ancestors", _MIGRATION)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _has_column(connection: asyncpg.Connection) -> bool:
    return await connection.fetchval("SELECT count(*) FROM information_schema.columns WHERE table_name = 'accounts'"
                                     " AND column_name = 'portal_frame_ancestors'") == 1


async def test_0019_gives_every_account_no_framing_origin_and_drops_the_column_keeping_them(database_url: str):
    migration = _migration()
    await migrate.downgrade_async(database_url, migration.down_revision)
    connection = await asyncpg.connect(database_url)
    try:
        assert not await _has_column(connection)
        before = [uuid.uuid4() for _ in range(3)]
        for account_id in before:
            await connection.execute("INSERT INTO accounts (id, name) VALUES ($1, 'a')", account_id)
        await migrate.upgrade_async(database_url, migration.revision)
        rows = await connection.fetch("SELECT id, portal_frame_ancestors FROM accounts")
        assert {row["id"]: row["portal_frame_ancestors"] for row in rows} == dict.fromkeys(before, [])
        await connection.execute("UPDATE accounts SET portal_frame_ancestors = $2 WHERE id = $1", before[0],
                                 ["https://app.example.com"])
        with pytest.raises(asyncpg.CheckViolationError):
            await connection.execute("UPDATE accounts SET portal_frame_ancestors = $2 WHERE id = $1", before[1],
                                     [f"https://a{n}.example.com" for n in range(11)])
        await migrate.downgrade_async(database_url, migration.down_revision)
        assert not await _has_column(connection)
        assert {row["id"] for row in await connection.fetch("SELECT id FROM accounts")} == set(before)
        await migrate.upgrade_async(database_url, "head")
    finally:
        await connection.close()
