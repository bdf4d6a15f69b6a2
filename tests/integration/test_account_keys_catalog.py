"""The migrated schema keeps the rules of a table distributed by account (billing.distribution).

Read from the catalog of the migrated test database: every table of `public` (but the
migrations' own) is in exactly one list; every DISTRIBUTED table has its distribution column, and
every primary key, unique constraint and unique index (partial ones too) of it includes that
column; every foreign key between two distributed tables pairs their distribution columns. With
HOOKLEDGER_ACCOUNT_PARTITIONS=N (N > 1) the template is partitioned (migration 0023): each
distributed table is PARTITION BY HASH (its column) with exactly N partitions, and no reference
table is partitioned. The last tests break the rules in their own database and see them reported,
so the check can fail.
"""

from __future__ import annotations

import asyncpg
import pytest

from billing import distribution

# Every table of public that is not itself a partition, with its partitioning (NULL: none).
_TABLES = """
SELECT c.relname AS table_name, c.relkind::text AS kind,
       pg_get_partkeydef(c.oid) AS partition_key,
       (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid) AS partitions
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
"""
# Every unique index (primary keys' and unique constraints' among them) of a table, by its columns
# (an expression's column is 0, which names nothing). Indexes of partitions are the parent's copies.
_UNIQUE_INDEXES = """
SELECT t.relname AS table_name, i.relname AS index_name,
       array(SELECT a.attname FROM unnest(x.indkey) AS k(attnum)
             JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum) AS columns
FROM pg_index x JOIN pg_class t ON t.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = 'public' AND x.indisunique AND NOT t.relispartition
"""
# Every foreign key, its columns paired with the referenced ones in order.
_FOREIGN_KEYS = """
SELECT con.conname AS name, t.relname AS table_name, r.relname AS referenced,
       array(SELECT a.attname || '=' || b.attname FROM unnest(con.conkey, con.confkey) AS k(mine, theirs)
             JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.mine
             JOIN pg_attribute b ON b.attrelid = con.confrelid AND b.attnum = k.theirs) AS pairs
FROM pg_constraint con JOIN pg_class t ON t.oid = con.conrelid JOIN pg_class r ON r.oid = con.confrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = 'public' AND con.contype = 'f' AND con.conparentid = 0 AND NOT t.relispartition
"""
_HAS_COLUMN = """
SELECT c.relname AS table_name FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND a.attname = $1 AND a.attnum > 0 AND NOT a.attisdropped
"""


async def violations(connection: asyncpg.Connection, partitions: int) -> list[str]:
    """Each way the database breaks the rules of billing.distribution, one line each."""
    found: list[str] = []
    tables = {row["table_name"]: row for row in await connection.fetch(_TABLES)}
    listed = [*distribution.DISTRIBUTED, *distribution.REFERENCE, *distribution.NOT_ACCOUNT_DATA]
    for name in sorted(tables):
        if listed.count(name) != 1:
            found.append(f"{name}: in {listed.count(name)} lists of billing.distribution, not exactly one")
    for name in sorted(set(listed) - set(tables)):
        found.append(f"{name}: listed in billing.distribution but not in the database")
    columns: dict[str, set[str]] = {}
    for column in {distribution.distribution_column(name) for name in distribution.DISTRIBUTED}:
        columns[column] = {row["table_name"] for row in await connection.fetch(_HAS_COLUMN, column)}
    distributed = [name for name in distribution.DISTRIBUTED if name in tables]
    for name in distributed:
        if name not in columns[distribution.distribution_column(name)]:
            found.append(f"{name}: has no column {distribution.distribution_column(name)}")
    for row in await connection.fetch(_UNIQUE_INDEXES):
        name = row["table_name"]
        if name in distributed and distribution.distribution_column(name) not in row["columns"]:
            found.append(f"{name}: unique index {row['index_name']} ({', '.join(row['columns'])})"
                         f" lacks {distribution.distribution_column(name)}")
    for row in await connection.fetch(_FOREIGN_KEYS):
        mine, theirs = row["table_name"], row["referenced"]
        if mine in distributed and theirs in distributed:
            pair = f"{distribution.distribution_column(mine)}={distribution.distribution_column(theirs)}"
            if pair not in row["pairs"]:
                found.append(f"{mine}: foreign key {row['name']} to {theirs} does not pair {pair}")
    found += _partitioning(tables, partitions)
    return found


def _partitioning(tables: dict[str, asyncpg.Record], partitions: int) -> list[str]:
    found = []
    for name, row in sorted(tables.items()):
        if name in distribution.DISTRIBUTED and partitions > 1:
            expected = f"HASH ({distribution.distribution_column(name)})"
            if row["partition_key"] != expected or row["partitions"] != partitions:
                found.append(f"{name}: partitioned by {row['partition_key']} in {row['partitions']} partitions,"
                             f" not {expected} in {partitions}")
        elif row["kind"] != "r":
            found.append(f"{name}: partitioned by {row['partition_key']}, expected a plain table")
    return found


async def test_the_migrated_schema_keeps_the_distribution_rules(database_url: str) -> None:
    """The template, migrated as this run configured it (plain, or partitioned by
    HOOKLEDGER_ACCOUNT_PARTITIONS), breaks none of the rules."""
    connection = await asyncpg.connect(database_url)
    try:
        assert await violations(connection, distribution.account_partitions()) == []
    finally:
        await connection.close()


async def test_a_key_without_the_account_is_reported(database_url: str) -> None:
    """A unique index of a distributed table without account_id, a partial one too, a foreign key
    between distributed tables that does not pair the accounts, and a table in no list, are each
    reported."""
    connection = await asyncpg.connect(database_url)
    partitions = distribution.account_partitions()
    try:
        await connection.execute("CREATE TABLE unlisted_things (id uuid PRIMARY KEY)")
        if partitions <= 1:  # a partitioned table refuses such indexes itself (see the test below)
            await connection.execute("CREATE UNIQUE INDEX ix_bad_messages ON messages (id, event_type)")
            await connection.execute("CREATE UNIQUE INDEX ix_bad_endpoints ON endpoints (url) WHERE deleted_at IS NULL")
        await connection.execute("ALTER TABLE event_types ADD COLUMN owner_id uuid,"
                                 " ADD CONSTRAINT fk_bad FOREIGN KEY (owner_id) REFERENCES accounts (id)")
        found = await violations(connection, partitions)
    finally:
        await connection.close()
    assert "unlisted_things: in 0 lists of billing.distribution, not exactly one" in found
    assert "event_types: foreign key fk_bad to accounts does not pair account_id=id" in found
    if partitions <= 1:
        assert "messages: unique index ix_bad_messages (id, event_type) lacks account_id" in found
        assert "endpoints: unique index ix_bad_endpoints (url) lacks account_id" in found
        assert len(found) == 4, found
    else:
        assert len(found) == 2, found


async def test_partitioning_is_reported_where_it_does_not_belong(database_url: str) -> None:
    """A distributed table left plain (or partitioned otherwise) while partitions are configured,
    and a partitioned reference table, are reported; a partitioned table itself refuses a unique
    index without its partition key."""
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute("CREATE TABLE api_keys_shadow (LIKE api_keys) PARTITION BY HASH (account_id)")
        tables = {row["table_name"]: row for row in await connection.fetch(_TABLES)}
        with pytest.raises(asyncpg.FeatureNotSupportedError):
            await connection.execute("CREATE UNIQUE INDEX ix_bad ON api_keys_shadow (id)")
    finally:
        await connection.close()
    found = _partitioning(tables, 3)
    assert "api_keys_shadow: partitioned by HASH (account_id), expected a plain table" in found
    assert any(line.startswith("ledger_entries: partitioned by") and line.endswith("not HASH (account_id) in 3")
               for line in found)
    assert any(line.startswith("accounts: partitioned by") and line.endswith("not HASH (id) in 3") for line in found)


# Every index of a distributed table, with its table's primary key columns and its own, in order.
_INDEXES_WITH_KEYS = """
SELECT t.relname AS table_name, i.relname AS index_name,
       array(SELECT a.attname FROM unnest(x.indkey) WITH ORDINALITY AS k(attnum, position)
             JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum ORDER BY k.position) AS columns,
       array(SELECT a.attname FROM pg_index p, unnest(p.indkey) AS k(attnum)
             JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
             WHERE p.indrelid = t.oid AND p.indisprimary) AS key_columns
FROM pg_index x JOIN pg_class t ON t.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid
WHERE t.relnamespace = 'public'::regnamespace AND NOT t.relispartition AND NOT x.indisprimary
  AND t.relname = ANY($1::text[])
"""
# The indexes that find a distributed table's rows by their key without the account, each with
# the statements that still need it (migration 0025 dropped the others).
BARE_KEY_INDEXES = {
    "ix_deliveries_dead": "the operator's page of dead deliveries across accounts, newest first (dead ones only)",
    "ix_deliveries_id": "trigger functions' probes by (account_id, id), kept off the account's other indexes (0025)",
    "ix_endpoints_id": "the operator switches an endpoint off by its id alone",
    "ix_ledger_entries_topup_id": "a top-up finds its order's entry on any account (top-ups only)",
}


async def bare_key_indexes(connection: asyncpg.Connection) -> list[str]:
    """Each index of a distributed table that leads with a column of the table's key other than
    its account, and lacks the account: one that finds rows by a bare id, across every account."""
    found = []
    tables = [name for name in distribution.DISTRIBUTED if name != "accounts"]
    for row in await connection.fetch(_INDEXES_WITH_KEYS, tables):
        bare_key = set(row["key_columns"]) - {distribution.ACCOUNT_COLUMN}
        if row["columns"][0] in bare_key and distribution.ACCOUNT_COLUMN not in row["columns"]:
            found.append(row["index_name"])
    return sorted(found)


async def test_only_the_listed_indexes_find_rows_by_a_bare_key(database_url: str) -> None:
    """Every statement names the account of the rows it reads: no index of a distributed table
    finds them by a bare id but those BARE_KEY_INDEXES lists, each with the statements that need it."""
    connection = await asyncpg.connect(database_url)
    try:
        assert await bare_key_indexes(connection) == sorted(BARE_KEY_INDEXES)
    finally:
        await connection.close()


async def test_an_index_on_a_bare_key_is_reported(database_url: str) -> None:
    """The check can fail: an index on messages' bare id, and one on attempts' bare delivery id, are
    reported; one that leads with the account, or with another column, is not."""
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute("CREATE INDEX ix_bad_messages_id ON messages (id)")
        await connection.execute("CREATE INDEX ix_bad_attempts ON delivery_attempts (delivery_id, attempt)")
        await connection.execute("CREATE INDEX ix_fine_messages ON messages (account_id, id, created_at)")
        await connection.execute("CREATE INDEX ix_fine_attempts ON delivery_attempts (started_at, delivery_id)")
        found = await bare_key_indexes(connection)
    finally:
        await connection.close()
    assert set(found) - set(BARE_KEY_INDEXES) == {"ix_bad_messages_id", "ix_bad_attempts"}
