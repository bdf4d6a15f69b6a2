"""Exactly-once processing on PostgreSQL: the claim commits with the receiver's own writes.

The receiver inserts the webhook id into a receipts table inside its own transaction, on its
own connection, before its side effects. If the transaction commits, the id and the effects are
stored together; if it rolls back (the handler raised), neither is, and the sender's retry is
processed. A concurrent copy of the same id blocks on the uncommitted row until the first
transaction ends, then sees either the committed row (a duplicate) or nothing (and processes).
This relies on READ COMMITTED, PostgreSQL's default; under REPEATABLE READ the waiting copy
fails with a serialization error instead, which still answers the sender with a retryable 500.

Every statement of the package is in this module; the table name is validated before it is
quoted into SQL, since identifiers cannot be query parameters.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from signing import errors
from signing.dedupe import Claim
from signing.signatures import WEBHOOK_ID_LENGTH_MAX

TABLE_DEFAULT = "webhook_receipts"
DELETED_PER_CALL_MAX = 10_000
# Short enough that "<table>_received_at_index" stays within PostgreSQL's 63-byte names.
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,39}")


def receipts_table_ddl(table: str = TABLE_DEFAULT) -> str:
    """`CREATE TABLE IF NOT EXISTS` for the receipts table, its index and its comment."""
    qualified, bare = _table_names(table)
    return f"""
CREATE TABLE IF NOT EXISTS {qualified} (
    webhook_id text PRIMARY KEY CHECK (length(webhook_id) BETWEEN 1 AND {WEBHOOK_ID_LENGTH_MAX}),
    received_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS "{bare}_received_at_index" ON {qualified} (received_at);
COMMENT ON TABLE {qualified} IS
    'Webhook ids already processed, written in the same transaction as the processing, so each webhook takes effect once.';
"""


async def create_receipts_table(connection: Any, table: str = TABLE_DEFAULT) -> None:
    """Runs `receipts_table_ddl`; safe to run at every start."""
    await connection.execute(receipts_table_ddl(table))


async def delete_old_receipts(
    connection: Any,
    *,
    older_than_seconds: float,
    table: str = TABLE_DEFAULT,
    rows_max: int = DELETED_PER_CALL_MAX,
) -> int:
    """Deletes up to `rows_max` receipts older than `older_than_seconds`; returns how many.

    Keep receipts longer than the sender's whole retry schedule. Call repeatedly until it
    returns less than `rows_max`; the bound keeps each delete's locks and WAL small.
    """
    qualified, _bare = _table_names(table)
    status = await connection.execute(
        # Delete old receipts, a bounded batch at a time; the clock is the database's.
        f"DELETE FROM {qualified} WHERE webhook_id IN ("
        f" SELECT webhook_id FROM {qualified}"
        f" WHERE received_at < now() - make_interval(secs => $1) LIMIT $2)",
        float(older_than_seconds),
        rows_max,
    )
    return int(status.rsplit(" ", 1)[-1])


class PostgresDedupeStore:
    """Claims on one connection, inside the transaction the caller has already opened."""

    def __init__(self, connection: Any, *, table: str = TABLE_DEFAULT) -> None:
        qualified, _bare = _table_names(table)
        self._connection = connection
        # Mark an id as processed; a row back means this is the first time.
        self._claim_sql = (
            f"INSERT INTO {qualified} (webhook_id) VALUES ($1) ON CONFLICT (webhook_id) DO NOTHING RETURNING true"
        )
        # Forget an id within the same transaction (the usual undo is the rollback itself).
        self._release_sql = f"DELETE FROM {qualified} WHERE webhook_id = $1"
        # Whether an id's processing has committed.
        self._exists_sql = f"SELECT EXISTS (SELECT 1 FROM {qualified} WHERE webhook_id = $1)"

    async def claim(self, webhook_id: str) -> bool:
        # Outside a transaction the insert would commit at once, before the side effects:
        # that is at-most-once, not exactly-once, so it is refused as a programming error.
        if not self._connection.is_in_transaction():
            raise errors.NotInTransactionError()
        return bool(await self._connection.fetchval(self._claim_sql, webhook_id))

    async def complete(self, webhook_id: str) -> None:
        """Nothing to do: the caller's commit completes the claim."""

    async def release(self, webhook_id: str) -> None:
        await self._connection.execute(self._release_sql, webhook_id)

    async def is_complete(self, webhook_id: str) -> bool:
        # A claim that returned False waited for any other transaction holding the id, so a
        # row it can see is committed.
        return bool(await self._connection.fetchval(self._exists_sql, webhook_id))


class PostgresDedupe:
    """For the aiohttp receiver: each webhook gets a pooled connection and a transaction.

    The handler receives the connection as `event.connection` and does its writes on it; they
    commit with the claim, or roll back with it when the handler raises.
    """

    def __init__(self, pool: Any, *, table: str = TABLE_DEFAULT) -> None:
        _table_names(table)
        self._pool = pool
        self._table = table

    @asynccontextmanager
    async def claimed(self, webhook_id: str) -> AsyncIterator[Claim]:
        async with self._pool.acquire() as connection, connection.transaction():
            store = PostgresDedupeStore(connection, table=self._table)
            first = await store.claim(webhook_id)
            yield Claim(first=first, in_progress=False, connection=connection)


def _table_names(table: str) -> tuple[str, str]:
    """The quoted, possibly schema-qualified name, and the bare table name."""
    parts = table.split(".") if isinstance(table, str) else []
    if not 1 <= len(parts) <= 2 or not all(_IDENTIFIER.fullmatch(part) for part in parts):
        raise errors.InvalidTableNameError(repr(table)[:80])
    return ".".join(f'"{part}"' for part in parts), parts[-1]
