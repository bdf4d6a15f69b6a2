"""Event catalog storage: an account's event types (name, description, optional JSON Schema,
archived), created, listed, read and changed; every statement scoped by account.

Every API process caches each account's catalog (delivery.api.event_catalog). The statements
that create or change an event type NOTIFY CHANGED_CHANNEL with the account's id, so every process
drops that account's catalog as soon as the change commits (and hears nothing of one rolled back)."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime

from billing import accounts, ids
from billing.database import Executor, transaction
from billing.tables import EVENT_TYPES_PER_ACCOUNT_MAX


class EventTypeExists(Exception):
    """The account already has an event type of this name."""


class EventTypeLimitReached(Exception):
    """The account already has the most event types allowed."""


@dataclass(frozen=True)
class EventType:
    id: uuid.UUID
    name: str
    description: str
    schema: object | None  # a JSON Schema (an object or a boolean), or None
    archived: bool
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row) -> EventType:
        fields = dict(row)
        fields.pop("notified", None)  # the writing statements' notice (below)
        return cls(**{**fields, "schema": None if row["schema"] is None else json.loads(row["schema"])})


_COLUMNS = "id, name, description, schema, archived, created_at, updated_at"
CHANGED_CHANNEL = "hookledger_event_catalog_changed"
# The notice, sent by the writing statement itself for each row it returns (so none for a create
# that found the name taken, or an update of nothing); PostgreSQL delivers it at commit.
_NOTIFY_CHANGED = f"pg_notify('{CHANGED_CHANNEL}', account_id::text) AS notified"


async def create_event_type(executor: Executor, account_id: uuid.UUID, name: str, *, description: str,
                            schema: object | None, archived: bool) -> EventType:
    """EventTypeExists for a name the account has; EventTypeLimitReached past the bound (the
    account row locked first, so two creates cannot both pass the count)."""
    async with transaction(executor) as connection:
        await accounts.lock_active(connection, account_id, "event types")
        count = await connection.fetchval("SELECT count(*) FROM event_types WHERE account_id = $1", account_id)
        if count >= EVENT_TYPES_PER_ACCOUNT_MAX:
            raise EventTypeLimitReached(
                f"an account has at most {EVENT_TYPES_PER_ACCOUNT_MAX} event types (event_types_per_account)")
        row = await connection.fetchrow(
            "INSERT INTO event_types (id, account_id, name, description, schema, archived)"
            " VALUES ($1, $2, $3, $4, $5::jsonb, $6) ON CONFLICT (account_id, name) DO NOTHING"
            f" RETURNING {_COLUMNS}, {_NOTIFY_CHANGED}",
            ids.new_id(), account_id, name, description, None if schema is None else json.dumps(schema), archived)
        if row is None:
            raise EventTypeExists(f"an event type named {name!r} exists already")
        return EventType.from_row(row)


async def page(executor: Executor, account_id: uuid.UUID, *, after: uuid.UUID | None, limit: int,
               include_archived: bool) -> list[EventType]:
    """Up to limit + 1 event types in id order (oldest first), after the cursor."""
    rows = await executor.fetch(
        f"SELECT {_COLUMNS} FROM event_types WHERE account_id = $1 AND ($2 OR NOT archived)"
        " AND id > coalesce($3::uuid, '00000000-0000-0000-0000-000000000000') ORDER BY id LIMIT $4",
        account_id, include_archived, after, limit + 1)
    return [EventType.from_row(row) for row in rows]


async def get(executor: Executor, account_id: uuid.UUID, name: str) -> EventType | None:
    row = await executor.fetchrow(f"SELECT {_COLUMNS} FROM event_types WHERE account_id = $1 AND name = $2",
                                  account_id, name)
    return None if row is None else EventType.from_row(row)


async def catalog(executor: Executor, account_id: uuid.UUID) -> list[tuple[str, object | None, bool]]:
    """Every event type of the account that has a schema or is archived: (name, schema, archived)."""
    rows = await executor.fetch(
        "SELECT name, schema, archived FROM event_types WHERE account_id = $1 AND (schema IS NOT NULL OR archived)",
        account_id)
    return [(row["name"], None if row["schema"] is None else json.loads(row["schema"]), row["archived"]) for row in rows]


_UPDATABLE = ("description", "schema", "archived")


async def update(executor: Executor, account_id: uuid.UUID, name: str, changes: dict) -> EventType | None:
    unknown = set(changes) - set(_UPDATABLE)
    assert not unknown, f"not updatable: {unknown}"
    given = [field in changes for field in _UPDATABLE]
    values = [json.dumps(changes["schema"]) if field == "schema" and changes.get("schema") is not None
              else changes.get(field) for field in _UPDATABLE]
    row = await executor.fetchrow(
        "UPDATE event_types SET"
        "   description = CASE WHEN $3 THEN $4 ELSE description END,"
        "   schema = CASE WHEN $5 THEN $6::jsonb ELSE schema END,"
        "   archived = CASE WHEN $7 THEN $8::boolean ELSE archived END,"
        "   updated_at = now()"
        f" WHERE account_id = $1 AND name = $2 RETURNING {_COLUMNS}, {_NOTIFY_CHANGED}",
        account_id, name, *[item for pair in zip(given, values) for item in pair])
    return None if row is None else EventType.from_row(row)
