"""Migration 0023 (HOOKLEDGER_ACCOUNT_PARTITIONS) on a populated database, both ways.

From 0022 with an account's money and deliveries on record, upgrading with 4 partitions makes
every distributed table PARTITION BY HASH with its rows, keys, indexes, foreign keys, statistics,
comments and triggers in their enabled states; the ledger still refuses an UPDATE (through the
partitioned table) and a TRUNCATE (of a partition named directly); a message still creates a
charged delivery, and the identity seq goes on from where it was. Downgrading makes the tables
plain again with the same rows and definitions. A bad value of the variable is refused before
anything changes.
"""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from billing import accounts, distribution, messages
from delivery.platform import migrate

# What a table has, read from the catalog, by name; partitions' copies are left out.
_SHAPE = """
SELECT 'constraint ' || c.relname || ' ' || con.conname || ' ' || pg_get_constraintdef(con.oid)
FROM pg_constraint con JOIN pg_class c ON c.oid = con.conrelid
WHERE c.relnamespace = 'public'::regnamespace AND NOT c.relispartition AND con.conparentid = 0
  AND (con.contype <> 'f' OR NOT (SELECT relispartition FROM pg_class WHERE oid = con.confrelid))
UNION ALL
SELECT 'index ' || i.relname || ' ' || regexp_replace(pg_get_indexdef(i.oid), ' ON ONLY ', ' ON ')
FROM pg_index x JOIN pg_class c ON c.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid
WHERE c.relnamespace = 'public'::regnamespace AND NOT c.relispartition
UNION ALL
SELECT 'trigger ' || c.relname || ' ' || t.tgenabled::text || ' ' || pg_get_triggerdef(t.oid)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = 'public'::regnamespace AND NOT c.relispartition AND NOT t.tgisinternal
UNION ALL
SELECT 'statistics ' || pg_get_statisticsobjdef(oid) FROM pg_statistic_ext
UNION ALL
SELECT 'comment ' || c.relname || ' ' || coalesce(obj_description(c.oid, 'pg_class'), '-')
FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition
UNION ALL
SELECT 'column ' || c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' '
       || a.attnotnull || ' ' || a.attidentity::text || a.attgenerated::text || ' ' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND a.attnum > 0 AND NOT a.attisdropped
"""
# Each table's rows, as one digest.
_DIGEST = "SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) FROM {table} AS t"
_PARTITION_TRIGGERS = """
SELECT t.tgname || ' ' || t.tgenabled::text FROM pg_trigger t WHERE t.tgrelid = $1::text::regclass AND NOT t.tgisinternal
ORDER BY 1
"""


async def _shape(connection: asyncpg.Connection) -> set[str]:
    return {row[0] for row in await connection.fetch(_SHAPE)}


async def _digests(connection: asyncpg.Connection) -> dict[str, str]:
    return {table: await connection.fetchval(_DIGEST.format(table=table)) for table in distribution.DISTRIBUTED}


async def _populate(database_url: str) -> uuid.UUID:
    """An account topped up, with an endpoint, and two messages each charged for a delivery."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        account = await accounts.create_account(pool, "acme")
        await accounts.top_up(pool, account.id, f"order-{account.id}", 100)
        await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, 'https://e.test')",
                           uuid.uuid4(), account.id)
        for _ in range(2):
            await messages.create_message(pool, messages.MessageRequest(account.id, "t", b"{}", None), attempts_max=3)
        return account.id
    finally:
        await pool.close()


async def test_0023_partitions_keep_rows_definitions_and_behaviour_both_ways(database_url: str, monkeypatch) -> None:
    """Up with 4 partitions and down again, on a populated database (see the module's docstring)."""
    monkeypatch.delenv(distribution.PARTITIONS_VARIABLE, raising=False)
    await migrate.downgrade_async(database_url, "0022")
    account_id = await _populate(database_url)
    connection = await asyncpg.connect(database_url)
    try:
        plain, rows = await _shape(connection), await _digests(connection)
        seq = await connection.fetchval("SELECT max(seq) FROM ledger_entries")

        monkeypatch.setenv(distribution.PARTITIONS_VARIABLE, "4")
        await migrate.upgrade_async(database_url, "0023")
        assert await _shape(connection) == plain
        assert await _digests(connection) == rows
        for table in distribution.DISTRIBUTED:
            assert await connection.fetchval("SELECT count(*) FROM pg_inherits WHERE inhparent = $1::text::regclass",
                                             table) == 4, table
        # Each partition's copy of an index or key is named after it, as a unique violation reports it.
        assert await connection.fetchval("SELECT count(*) FROM pg_indexes WHERE indexname = ANY($1::text[])",
                                         ["uq_applications_live_uid_p2", "pk_ledger_entries_p3", "ix_deliveries_due_p0"]) == 3
        with pytest.raises(asyncpg.UniqueViolationError) as raised:
            await connection.execute("INSERT INTO ledger_entries (id, account_id, kind, amount)"
                                     " SELECT id, account_id, kind, amount FROM ledger_entries WHERE kind = 'topup'")
        assert distribution.is_index_or_its_copy(raised.value.constraint_name, "pk_ledger_entries")
        assert not distribution.is_index_or_its_copy(raised.value.constraint_name, "pk_ledger")
        assert await connection.fetch(_PARTITION_TRIGGERS, "ledger_entries_p2") == await connection.fetch(
            _PARTITION_TRIGGERS, "ledger_entries")
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await connection.execute("UPDATE ledger_entries SET note = 'x' WHERE account_id = $1", account_id)
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await connection.execute("TRUNCATE ledger_entries_p1")
        created = await messages.create_message(connection, messages.MessageRequest(account_id, "t", b"{}", None),
                                                attempts_max=3)
        (made,) = created.deliveries
        charge = await connection.fetchrow("SELECT amount, seq FROM ledger_entries WHERE account_id = $1 AND id = $2",
                                           account_id, f"charge:{made.id}")
        assert charge["amount"] == -1 and charge["seq"] > seq
        assert await connection.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id) == 97
        rows = await _digests(connection)

        await migrate.downgrade_async(database_url, "0022")
        assert await _shape(connection) == plain
        assert await _digests(connection) == rows
        assert await connection.fetchval("SELECT count(*) FROM pg_class WHERE relkind = 'p'") == 0
    finally:
        await connection.close()


@pytest.mark.parametrize("value", ["65", "x", "-1", "2.5"])
async def test_0023_refuses_a_bad_setting_and_changes_nothing(database_url: str, monkeypatch, value: str) -> None:
    """A value other than 0..64 stops the upgrade with the variable's name, at 0022, tables plain."""
    monkeypatch.delenv(distribution.PARTITIONS_VARIABLE, raising=False)
    await migrate.downgrade_async(database_url, "0022")
    monkeypatch.setenv(distribution.PARTITIONS_VARIABLE, value)
    with pytest.raises(distribution.PartitionsSettingError, match=distribution.PARTITIONS_VARIABLE):
        await migrate.upgrade_async(database_url)
    connection = await asyncpg.connect(database_url)
    try:
        assert await connection.fetchval("SELECT version_num FROM alembic_version") == "0022"
        assert await connection.fetchval("SELECT count(*) FROM pg_class WHERE relkind = 'p'") == 0
    finally:
        await connection.close()


@pytest.mark.parametrize(("environ", "partitions"), [({}, 1), ({"HOOKLEDGER_ACCOUNT_PARTITIONS": ""}, 1),
                                                     ({"HOOKLEDGER_ACCOUNT_PARTITIONS": "0"}, 1),
                                                     ({"HOOKLEDGER_ACCOUNT_PARTITIONS": "1"}, 1),
                                                     ({"HOOKLEDGER_ACCOUNT_PARTITIONS": " 8 "}, 8),
                                                     ({"HOOKLEDGER_ACCOUNT_PARTITIONS": "64"}, 64)])
def test_the_setting_reads_plain_or_a_count(environ: dict, partitions: int) -> None:
    assert distribution.account_partitions(environ) == partitions
