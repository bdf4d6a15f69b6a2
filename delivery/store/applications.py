"""Application storage: create, list (by cursor), read by id or uid, update and delete an account's
applications.

An application is one customer of the account's app: a message sent to it goes only to its
endpoints, and the account pays. Every account has a default application whose id is the
account's own (made with the account by billing.application_triggers); the routes that name no
application use it, and it is never deleted. Every statement is scoped by account id, so another
account's application is as invisible as a missing one. A deleted application keeps its row (its
messages point at it) and frees its uid.

Every API process keeps the uids it sent to for a few seconds (delivery.api.application_uids). A
statement that may take a uid from its application (an update given a uid, the deletion of an
application that has one) NOTIFYs UID_CHANGED_CHANNEL with the account's id, so every process
drops that account's uids as soon as it commits.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from billing import accounts, distribution, ids
from billing.database import OUTCOME_WAIT_SECONDS, Executor, OutcomeUnknown, resolved_transaction, transaction
from billing.ids import parse_id

APPLICATIONS_PER_ACCOUNT_MAX = 100_000
_UID_INDEX = "uq_applications_live_uid"


class ApplicationLimitReached(Exception):
    """The account already has the most applications allowed."""


class UidTaken(Exception):
    """Another live application of the account has this uid."""


class DefaultApplication(Exception):
    """The default application cannot be deleted: the routes without an application send to it."""


@dataclass(frozen=True)
class Application:
    id: uuid.UUID
    account_id: uuid.UUID
    uid: str | None
    name: str
    metadata: dict
    rate_limit_per_second: int | None
    created_at: datetime
    updated_at: datetime

    @property
    def is_default(self) -> bool:
        return self.id == self.account_id

    @classmethod
    def from_row(cls, row) -> Application:
        fields = dict(row)
        fields.pop("notified", None)  # the writing statements' notice (below)
        return cls(**{**fields, "metadata": json.loads(row["metadata"])})


_COLUMNS = "id, account_id, uid, name, metadata, rate_limit_per_second, created_at, updated_at"
UID_CHANGED_CHANNEL = "hookledger_application_uid_changed"
# The notice, sent by the writing statement itself for the row it returns when `condition` holds;
# PostgreSQL delivers it at commit, and none for a statement rolled back.
_NOTIFY_UID_CHANGED_WHEN = ("CASE WHEN {condition} THEN pg_notify('%s', account_id::text) END AS notified"
                            % UID_CHANGED_CHANNEL)


def uid_is_id_shaped(uid: str) -> bool:
    """Whether a uid would read as an id in a path: such uids are refused, so {app} is never ambiguous."""
    try:
        parse_id(uid)
    except ValueError:
        return False
    return True


async def create_application(
    executor: Executor, account_id: uuid.UUID, name: str, *, uid: str | None = None, metadata: dict | None = None,
    rate_limit_per_second: int | None = None, outcome_wait_seconds: float = OUTCOME_WAIT_SECONDS,
) -> Application:
    """Create an application under the per-account bound (ApplicationLimitReached past it);
    UidTaken when a live application of the account has `uid`.

    The account row is locked first (the platform's one lock order), so two creates cannot both
    pass the count. A COMMIT whose answer is lost is resolved (resolved_transaction)."""
    application_id = ids.new_id()
    try:
        async with resolved_transaction(executor, wait_seconds=outcome_wait_seconds) as connection:
            await accounts.lock_active(connection, account_id, "applications")
            # Kept by triggers on applications (billing.application_triggers): one probe at any count.
            count = await connection.fetchval(
                "SELECT coalesce((SELECT live FROM application_counts WHERE account_id = $1), 0)", account_id)
            if count >= APPLICATIONS_PER_ACCOUNT_MAX:
                raise ApplicationLimitReached(
                    f"an account has at most {APPLICATIONS_PER_ACCOUNT_MAX} applications (applications_per_account)")
            try:
                async with connection.transaction():  # a savepoint: a taken uid leaves the transaction usable
                    row = await connection.fetchrow(
                        "INSERT INTO applications (id, account_id, uid, name, metadata, rate_limit_per_second)"
                        f" VALUES ($1, $2, $3, $4, $5::jsonb, $6) RETURNING {_COLUMNS}",
                        application_id, account_id, uid, name, json.dumps(metadata or {}), rate_limit_per_second)
            except asyncpg.UniqueViolationError as error:
                if distribution.is_index_or_its_copy(error.constraint_name, _UID_INDEX):
                    raise UidTaken(f"another application of the account has uid {uid!r}") from None
                raise
            return Application.from_row(row)
    except OutcomeUnknown as unknown:
        unknown.look_for = f"application {application_id} (GET /v1/applications/{application_id})"
        raise


async def find(executor: Executor, account_id: uuid.UUID, reference: str) -> Application | None:
    """The account's live application named by `reference`: its id, or else its uid."""
    application_id = None
    try:
        application_id = parse_id(reference)
    except ValueError:
        pass
    if application_id is not None:
        row = await executor.fetchrow(
            f"SELECT {_COLUMNS} FROM applications WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL",
            application_id, account_id)
    else:
        row = await executor.fetchrow(
            f"SELECT {_COLUMNS} FROM applications WHERE account_id = $1 AND uid = $2 AND deleted_at IS NULL",
            account_id, reference)
    return None if row is None else Application.from_row(row)


async def find_id_by_uid(executor: Executor, account_id: uuid.UUID, uid: str) -> uuid.UUID | None:
    """The id of the account's live application with this uid (the live-uid unique index), None if none."""
    return await executor.fetchval(
        "SELECT id FROM applications WHERE account_id = $1 AND uid = $2 AND deleted_at IS NULL", account_id, uid)


async def page(executor: Executor, account_id: uuid.UUID, *, after: uuid.UUID | None, limit: int) -> list[Application]:
    """Up to limit + 1 of the account's live applications in id order (oldest first), after the
    cursor `after`: the (account_id, id) index from the cursor on, whatever the account's count."""
    return [Application.from_row(row) for row in await page_records(executor, account_id, after=after, limit=limit)]


async def page_records(executor: Executor, account_id: uuid.UUID, *, after: uuid.UUID | None,
                       limit: int) -> list[asyncpg.Record]:
    """As `page`, the records as read: the columns of _COLUMNS, metadata as its JSON text.

    For the API's list, which copies each into its answer: turning a record into an Application
    (a dict of the record, the metadata parsed, a dataclass) cost 10 to 15 µs a row here, 1 to
    1.5 ms of a 100-row page whose statement takes 0.06 ms."""
    return await executor.fetch(
        f"SELECT {_COLUMNS} FROM applications WHERE account_id = $1 AND deleted_at IS NULL"
        " AND id > coalesce($2::uuid, '00000000-0000-0000-0000-000000000000') ORDER BY id LIMIT $3",
        account_id, after, limit + 1)


_UPDATABLE = ("name", "uid", "metadata", "rate_limit_per_second")


async def update_application(executor: Executor, account_id: uuid.UUID, application_id: uuid.UUID,
                             changes: dict[str, object]) -> Application | None:
    """Apply the given fields; None when there is no such live application; UidTaken."""
    unknown = set(changes) - set(_UPDATABLE)
    assert not unknown, f"not updatable: {unknown}"
    values = [json.dumps(changes[name]) if name == "metadata" and name in changes else changes.get(name)
              for name in _UPDATABLE]
    given = [name in changes for name in _UPDATABLE]
    try:
        row = await executor.fetchrow(
            "UPDATE applications SET"
            "   name = CASE WHEN $3 THEN $4 ELSE name END,"
            "   uid = CASE WHEN $5 THEN $6 ELSE uid END,"
            "   metadata = CASE WHEN $7 THEN $8::jsonb ELSE metadata END,"
            "   rate_limit_per_second = CASE WHEN $9 THEN $10::int ELSE rate_limit_per_second END,"
            "   updated_at = now()"
            " WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL"
            f" RETURNING {_COLUMNS}, {_NOTIFY_UID_CHANGED_WHEN.format(condition='$5')}",  # $5: a uid given
            application_id, account_id, *[item for pair in zip(given, values) for item in pair])
    except asyncpg.UniqueViolationError as error:
        if distribution.is_index_or_its_copy(error.constraint_name, _UID_INDEX):
            raise UidTaken(f"another application of the account has uid {changes.get('uid')!r}") from None
        raise
    return None if row is None else Application.from_row(row)


async def delete_application(pool: asyncpg.Pool, account_id: uuid.UUID, application_id: uuid.UUID) -> list[uuid.UUID] | None:
    """Mark the application and its endpoints deleted, in one transaction under the account's row
    lock (so no endpoint is created in it meanwhile); the ids of the endpoints it deleted, or None
    when the account has no such live application. DefaultApplication for the default one.

    The endpoints' pending deliveries are then settled as deleting an endpoint settles them
    (delivery.store.endpoints.delete_endpoint, by the caller); the rest die at the worker's
    pre-send check, refunded, as for any deleted endpoint."""
    if application_id == account_id:
        raise DefaultApplication("the default application cannot be deleted")
    async with transaction(pool) as connection:
        await connection.fetchval("SELECT id FROM accounts WHERE id = $1 FOR UPDATE", account_id)
        deleted = await connection.fetchval(
            "UPDATE applications SET deleted_at = now(), updated_at = now()"
            " WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL"
            f" RETURNING id, {_NOTIFY_UID_CHANGED_WHEN.format(condition='uid IS NOT NULL')}",
            application_id, account_id)
        if deleted is None:
            return None
        rows = await connection.fetch(
            "UPDATE endpoints SET deleted_at = now(), updated_at = now()"
            " WHERE application_id = $1 AND account_id = $2 AND deleted_at IS NULL RETURNING id",
            application_id, account_id)
    return [row["id"] for row in rows]
