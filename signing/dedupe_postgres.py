"""Exactly-once processing on PostgreSQL: the claim commits with the receiver's own writes.

The receiver inserts the webhook id into a receipts table inside its own transaction, on its
own connection, before its side effects. If the transaction commits, the id and the effects are
stored together; if it rolls back (the handler raised), neither is, and the sender's retry is
processed.

A copy of an id that is being processed right now is not made to wait for it: each claim first
takes a transaction-scoped advisory lock on a hash of the id, without waiting. A copy that cannot
have it answers "in progress" (409, retry later) at once, instead of holding a pool connection
while it waits; once the first transaction has ended, a copy finds either the committed receipt
(a duplicate, answered 200) or none (and processes). A hash shared by two ids only costs a 409.
This relies on READ COMMITTED, PostgreSQL's default; under REPEATABLE READ a copy that starts as
the first commits can fail with a serialization error instead, which is still a retryable 500.

Before the commit, the claim re-reads its receipt: a handler that caught a failed statement has
left the transaction aborted, and asyncpg's COMMIT would then roll back without raising, so the
check fails the request (500, retried) instead of answering 2xx for work that was not kept.

Every statement of the package is in this module; the table name is validated before it is
quoted into SQL, since identifiers cannot be query parameters.
"""

from __future__ import annotations

import hashlib
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
# SQLSTATE "current transaction is aborted, commands ignored until end of transaction block".
_IN_FAILED_SQL_TRANSACTION = "25P02"


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
    """Claims on one connection, inside the transaction the caller has already opened.

    `claim` waits for another transaction that holds the id; `lock` first, to learn at once that
    the id is being processed instead.
    """

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
        self._lock_namespace = qualified.encode("ascii") + b"\0"

    async def claim(self, webhook_id: str) -> bool:
        # Outside a transaction the insert would commit at once, before the side effects:
        # that is at-most-once, not exactly-once, so it is refused as a programming error.
        if not self._connection.is_in_transaction():
            raise errors.NotInTransactionError()
        return bool(await self._connection.fetchval(self._claim_sql, webhook_id))

    async def lock(self, webhook_id: str) -> bool:
        """Takes the id's advisory lock until the transaction ends; False, at once, when another has it."""
        if not self._connection.is_in_transaction():
            raise errors.NotInTransactionError()
        lock_key = self._lock_key(webhook_id)
        return bool(await self._connection.fetchval("SELECT pg_try_advisory_xact_lock($1)", lock_key))

    async def complete(self, webhook_id: str) -> None:
        """Nothing to do: the caller's commit completes the claim."""

    async def check_committable(self, webhook_id: str) -> None:
        """Raises unless the claim is still there to commit: the last statement before the COMMIT.

        In an aborted transaction every statement fails, so this raises there, where the COMMIT
        itself would roll back silently; it also raises when the receipt was deleted.
        """
        try:
            present = await self._connection.fetchval(self._exists_sql, webhook_id)
        except Exception as error:
            if getattr(error, "sqlstate", None) == _IN_FAILED_SQL_TRANSACTION:
                raise errors.ReceiptNotCommittableError(f"{webhook_id}: the transaction is aborted") from error
            raise
        if not present:
            raise errors.ReceiptNotCommittableError(f"{webhook_id}: the receipt is gone")

    async def release(self, webhook_id: str) -> None:
        await self._connection.execute(self._release_sql, webhook_id)

    async def is_complete(self, webhook_id: str) -> bool:
        # A claim that returned False waited for any other transaction holding the id, so a
        # row it can see is committed.
        return bool(await self._connection.fetchval(self._exists_sql, webhook_id))

    def _lock_key(self, webhook_id: str) -> int:
        # 64 bits of a hash of table and id, as the signed bigint the lock functions take.
        digest = hashlib.sha256(self._lock_namespace + webhook_id.encode("utf-8", "surrogatepass")).digest()
        return int.from_bytes(digest[:8], "big", signed=True)


class PostgresDedupe:
    """For the aiohttp receiver: each webhook gets a pooled connection and a transaction.

    The handler receives the connection as `event.connection` and does its writes on it; they
    commit with the claim, or roll back with it when the handler raises. A handler that catches
    an SQL error must run the failing statement in a savepoint (`async with
    event.connection.transaction():`); otherwise the transaction is aborted and the webhook is
    answered 500, to be retried.
    """

    def __init__(self, pool: Any, *, table: str = TABLE_DEFAULT) -> None:
        _table_names(table)
        self._pool = pool
        self._table = table

    @asynccontextmanager
    async def claimed(self, webhook_id: str) -> AsyncIterator[Claim]:
        async with self._pool.acquire() as connection, connection.transaction():
            store = PostgresDedupeStore(connection, table=self._table)
            if not await store.lock(webhook_id):
                yield Claim(first=False, in_progress=True)
                return
            first = await store.claim(webhook_id)
            yield Claim(first=first, in_progress=False, connection=connection)
            if first:
                await store.check_committable(webhook_id)


def _table_names(table: str) -> tuple[str, str]:
    """The quoted, possibly schema-qualified name, and the bare table name."""
    parts = table.split(".") if isinstance(table, str) else []
    if not 1 <= len(parts) <= 2 or not all(_IDENTIFIER.fullmatch(part) for part in parts):
        raise errors.InvalidTableNameError(repr(table)[:80])
    return ".".join(f'"{part}"' for part in parts), parts[-1]
