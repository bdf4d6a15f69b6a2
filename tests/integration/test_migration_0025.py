"""Migration 0025 (drop the bare-id indexes) on a populated database, both ways, plain and
partitioned.

From 0024 with an account's money and deliveries on record, upgrading drops the plain indexes on
the old keys of applications, delivery_attempts, ledger_entries and messages, keeps those of
deliveries, endpoints and the operational tables, and adds the top-ups' partial index; the rows stay,
and an order topped up on one account is still refused on another, the check reading the new
index; messages' idempotency key becomes a unique index of the keys given, as strict as before.
Downgrading makes the dropped indexes and the key constraint again. With HOOKLEDGER_ACCOUNT_PARTITIONS (0023 first)
the same holds for every partition, and each partition's copy of an index made here is named
<index>_p<k>, as 0023 names them.
"""

from __future__ import annotations

import uuid

import asyncpg
import pytest

from billing import accounts, distribution, messages
from billing.errors import TopupConflict
from delivery.platform import migrate

DROPPED = {"ix_applications_id", "ix_delivery_attempts_delivery_id_attempt", "ix_ledger_entries_id", "ix_messages_id",
           "ix_operational_deliveries_id", "ix_operational_endpoints_id", "ix_operational_events_id"}
KEPT = {"ix_deliveries_id", "ix_endpoints_id"}
TOPUP_INDEX = "ix_ledger_entries_topup_id"
IDEMPOTENCY_KEY = "uq_messages_account_id_idempotency_key"
PARTITIONS = 4

# Every index of a table of public that is not a partition, with its definition.
_INDEXES = """
SELECT i.relname AS name, regexp_replace(pg_get_indexdef(i.oid), ' ON ONLY ', ' ON ') AS definition
FROM pg_index x JOIN pg_class c ON c.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid
WHERE c.relnamespace = 'public'::regnamespace AND NOT c.relispartition
"""
# The names of the partitions' copies of an index.
_COPIES = """
SELECT array_agg(child.relname::text ORDER BY child.relname) FROM pg_inherits i
JOIN pg_class child ON child.oid = i.inhrelid JOIN pg_class parent ON parent.oid = i.inhparent
WHERE parent.relname = $1
"""
_DIGEST = "SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) FROM {table} AS t"


async def _indexes(connection: asyncpg.Connection) -> dict[str, str]:
    return {row["name"]: row["definition"] for row in await connection.fetch(_INDEXES)}


async def _digests(connection: asyncpg.Connection) -> dict[str, str]:
    return {table: await connection.fetchval(_DIGEST.format(table=table)) for table in distribution.DISTRIBUTED}


async def _populate(database_url: str) -> uuid.UUID:
    """An account topped up (order "order-1"), with an endpoint, and two messages each charged for a delivery."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        account = await accounts.create_account(pool, "acme")
        await accounts.top_up(pool, account.id, "order-1", 100)
        await pool.execute("INSERT INTO endpoints (id, account_id, url) VALUES ($1, $2, 'https://e.test')",
                           uuid.uuid4(), account.id)
        for _ in range(2):
            await messages.create_message(pool, messages.MessageRequest(account.id, "t", b"{}", None), attempts_max=3)
        return account.id
    finally:
        await pool.close()


async def _order_stays_on_its_account(database_url: str) -> None:
    """The order already applied to the first account is refused on a second; the check's read of
    the order's entry on any account goes through the top-ups' index."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        other = await accounts.create_account(pool, "other")
        with pytest.raises(TopupConflict, match="another account"):
            await accounts.top_up(pool, other.id, "order-1", 100)
        async with pool.acquire() as connection:
            await connection.execute("SET enable_seqscan = off")  # a table this small is otherwise read whole
            plan = "\n".join(row[0] for row in await connection.fetch(
                "EXPLAIN " + accounts._TOPUP_OF_ANY_ACCOUNT, "topup:order-1"))
        assert TOPUP_INDEX in plan, plan
    finally:
        await pool.close()


def _check_upgraded(indexes: dict[str, str]) -> None:
    assert not DROPPED & set(indexes), sorted(DROPPED & set(indexes))
    assert KEPT <= set(indexes)
    assert indexes[TOPUP_INDEX].endswith("USING btree (id) WHERE (kind = 'topup'::text)"), indexes[TOPUP_INDEX]
    assert indexes[IDEMPOTENCY_KEY].endswith("(account_id, idempotency_key) WHERE (idempotency_key IS NOT NULL)")


async def _keys_stay_unique(database_url: str, account_id: uuid.UUID) -> None:
    """The idempotency key, now a partial unique index, still refuses a second message with the same
    key on the account, and still lets messages without a key be many."""
    connection = await asyncpg.connect(database_url)
    insert = "INSERT INTO messages (id, account_id, event_type, payload, idempotency_key) VALUES ($1, $2, 't', '{}', $3)"
    try:
        async with connection.transaction():
            for key in ("k-1", None, None):
                await connection.execute(insert, uuid.uuid4(), account_id, key)
            with pytest.raises(asyncpg.UniqueViolationError) as raised:
                await connection.execute(insert, uuid.uuid4(), account_id, "k-1")
            assert distribution.is_index_or_its_copy(raised.value.constraint_name, IDEMPOTENCY_KEY)
            raise _RolledBack
    except _RolledBack:
        pass
    finally:
        await connection.close()


class _RolledBack(Exception):
    """Leaves the rows of _keys_stay_unique uncommitted."""


async def test_0025_drops_the_bare_id_indexes_and_makes_them_again(database_url: str, monkeypatch) -> None:
    """Plain tables: up from 0024 and down again (see the module's docstring)."""
    monkeypatch.delenv(distribution.PARTITIONS_VARIABLE, raising=False)
    await migrate.downgrade_async(database_url, "0022")  # plain, whatever the template was
    await migrate.upgrade_async(database_url, "0024")
    account_id = await _populate(database_url)
    connection = await asyncpg.connect(database_url)
    try:
        before, rows = await _indexes(connection), await _digests(connection)
        assert DROPPED | KEPT <= set(before) and TOPUP_INDEX not in before

        await migrate.upgrade_async(database_url, "0025")
        after = await _indexes(connection)
        _check_upgraded(after)
        assert set(before) - DROPPED == set(after) - {TOPUP_INDEX}
        assert await _digests(connection) == rows
        await _order_stays_on_its_account(database_url)
        await _keys_stay_unique(database_url, account_id)

        rows = await _digests(connection)
        await migrate.downgrade_async(database_url, "0024")
        assert await _indexes(connection) == before
        assert await _digests(connection) == rows
    finally:
        await connection.close()


async def test_0025_after_0023_drops_and_makes_them_on_every_partition(database_url: str, monkeypatch) -> None:
    """Partitioned tables (0023 with 4 partitions): up, down and up again; the partitions' copies go
    with their index, and each copy made here is named after its index and partition."""
    monkeypatch.delenv(distribution.PARTITIONS_VARIABLE, raising=False)
    await migrate.downgrade_async(database_url, "0022")
    monkeypatch.setenv(distribution.PARTITIONS_VARIABLE, str(PARTITIONS))
    await migrate.upgrade_async(database_url, "0024")
    account_id = await _populate(database_url)
    connection = await asyncpg.connect(database_url)
    try:
        before, rows = await _indexes(connection), await _digests(connection)
        copies = {name: await connection.fetchval(_COPIES, name) for name in DROPPED | KEPT | {IDEMPOTENCY_KEY}}

        await migrate.upgrade_async(database_url, "0025")
        _check_upgraded(await _indexes(connection))
        for name in (TOPUP_INDEX, IDEMPOTENCY_KEY):
            assert await connection.fetchval(_COPIES, name) == [f"{name}_p{k}" for k in range(PARTITIONS)]
        for name in DROPPED:
            assert await connection.fetchval("SELECT count(*) FROM pg_class WHERE relname LIKE $1 || '%'", name) == 0
        assert await connection.fetchval("SELECT count(*) FROM pg_inherits WHERE inhparent = 'ledger_entries'::regclass") \
            == PARTITIONS
        assert await _digests(connection) == rows
        await _order_stays_on_its_account(database_url)
        await _keys_stay_unique(database_url, account_id)

        rows = await _digests(connection)
        await migrate.downgrade_async(database_url, "0024")
        assert await _indexes(connection) == before
        assert {name: await connection.fetchval(_COPIES, name) for name in DROPPED | KEPT | {IDEMPOTENCY_KEY}} == copies
        assert await connection.fetchval("SELECT count(*) FROM pg_class WHERE relname LIKE $1 || '%'", TOPUP_INDEX) == 0
        assert await _digests(connection) == rows

        await migrate.upgrade_async(database_url, "0025")
        _check_upgraded(await _indexes(connection))
    finally:
        await connection.close()
