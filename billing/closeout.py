"""Account deletion, money side: bulk settlement with a count check, then the closeout.

1. `begin_closing`: the account turns `closing`; no new messages, pre-send checks settle.
2. `bulk_settle`: one transaction. Lock the account, then a read-only locking pre-check that
   compares every live delivery with the ledger; then ONE statement settles them all and
   returns three counts (rows locked, refunds inserted, rows marked dead). If the pre-check
   finds a mismatch or the counts differ, it raises with a report and rolls back.
3. `close_out`: erase payloads, endpoint and operational endpoint secrets and custom headers, and
   the account's stored API answers (keys and secrets shown once, sealed), revoke keys, write `closeout:<account>`
   for the remaining balance (owed to the customer), mark the account deleted.
Each step is idempotent, so a deletion job that crashed can simply run again.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from billing import ids
from billing.database import Executor, transaction
from billing.errors import AccountNotClosable, AccountNotFound, BulkSettleMismatch
from billing.settle import CREDITS_MOVED


@dataclass(frozen=True)
class Mismatch:
    delivery_id: uuid.UUID
    problem: str


@dataclass(frozen=True)
class BulkSettled:
    locked: int
    refunded: int
    marked_dead: int
    refunded_amount: int


@dataclass(frozen=True)
class ClosedOut:
    entry_id: str
    amount: int  # the ledger amount (minus what is owed to the customer)
    owed_to_customer: int
    payloads_erased: int
    keys_revoked: int
    already_deleted: bool


_BEGIN_CLOSING = (
    "UPDATE accounts SET status = 'closing' WHERE id = $1 AND status IN ('active', 'closing') RETURNING status"
)
_PRECHECK = (
    "SELECT d.id, d.price, d.account_id, c.account_id AS charge_account_id, c.amount AS charge_amount,"
    "   r.id IS NOT NULL AS refunded"
    " FROM deliveries d"
    " LEFT JOIN ledger_entries c ON c.id = 'charge:' || d.id"
    " LEFT JOIN ledger_entries r ON r.id = 'refund:' || d.id"
    " WHERE d.account_id = $1 AND d.state IN ('pending', 'sending')"
    " ORDER BY d.id FOR UPDATE OF d"
)
_BULK_SETTLE = (
    "WITH live AS ("
    "   SELECT id, price FROM deliveries WHERE account_id = $1 AND state IN ('pending', 'sending')"
    "   ORDER BY id FOR UPDATE),"
    " refunds AS ("
    "   INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount)"
    "   SELECT 'refund:' || id, $1, id, 'refund', price FROM live"
    "   ON CONFLICT (account_id, id) DO NOTHING RETURNING amount),"
    " dead AS ("
    "   UPDATE deliveries d SET state = 'dead', dead_reason = 'account_deleted', leased_until = NULL,"
    "       finished_at = now()"
    "   FROM live WHERE d.id = live.id RETURNING d.id),"
    " credit AS ("
    "   UPDATE accounts SET balance = balance + (SELECT coalesce(sum(amount), 0) FROM refunds)"
    "   WHERE id = $1 RETURNING balance)"
    " SELECT (SELECT count(*) FROM live) AS locked, (SELECT count(*) FROM refunds) AS refunded,"
    "   (SELECT count(*) FROM dead) AS marked_dead,"
    "   (SELECT coalesce(sum(amount), 0) FROM refunds)::bigint AS refunded_amount,"
    "   (SELECT balance FROM credit) AS balance"
)


async def begin_closing(executor: Executor, account_id: uuid.UUID) -> str:
    """Mark the account closing (idempotent). Returns its status afterwards."""
    async with transaction(executor) as connection:
        status = await connection.fetchval(_BEGIN_CLOSING, account_id)
        if status is None:
            status = await connection.fetchval("SELECT status FROM accounts WHERE id = $1", account_id)
            if status is None:
                raise AccountNotFound(f"no account {account_id}")
    return status


async def precheck(connection, account_id: uuid.UUID) -> list[Mismatch]:
    """Lock the account's live deliveries and compare each with the ledger. Writes nothing."""
    mismatches = []
    for row in await connection.fetch(_PRECHECK, account_id):
        problem = _problem(row)
        if problem:
            mismatches.append(Mismatch(row["id"], problem))
    return mismatches


def _problem(row) -> str | None:
    if row["charge_amount"] is None:
        return "no charge entry"
    if row["charge_account_id"] != row["account_id"]:
        return f"charge belongs to account {row['charge_account_id']}"
    if row["charge_amount"] != -row["price"]:
        return f"charge is {row['charge_amount']}, expected {-row['price']}"
    if row["refunded"]:
        return "already refunded while still live"
    return None


async def bulk_settle(executor: Executor, account_id: uuid.UUID) -> BulkSettled:
    """Settle every live delivery of a closing account in one statement, or nothing."""
    async with transaction(executor) as connection:
        status = await connection.fetchval("SELECT status FROM accounts WHERE id = $1 FOR UPDATE", account_id)
        if status is None:
            raise AccountNotFound(f"no account {account_id}")
        if status != "closing":
            raise AccountNotClosable(f"account {account_id} is {status}; bulk settlement needs it closing")
        mismatches = await precheck(connection, account_id)
        if mismatches:
            raise BulkSettleMismatch(
                f"{len(mismatches)} live deliveries disagree with the ledger; nothing was settled",
                mismatches=mismatches,
            )
        row = await connection.fetchrow(_BULK_SETTLE, account_id)
        result = BulkSettled(row["locked"], row["refunded"], row["marked_dead"], row["refunded_amount"])
        if not result.locked == result.refunded == result.marked_dead:
            # Raising rolls the statement back: refunds, dead marks and the credit alike.
            raise BulkSettleMismatch(
                f"counts disagree: locked {result.locked}, refunded {result.refunded},"
                f" marked dead {result.marked_dead}; nothing was settled",
                mismatches=[],
            )
    CREDITS_MOVED["refunded"] += result.refunded_amount or 0
    return result


async def close_out(executor: Executor, account_id: uuid.UUID) -> ClosedOut:
    """Erase, revoke and close out a closing account with no live deliveries left. Idempotent."""
    entry_id = ids.closeout_id(account_id)
    async with transaction(executor) as connection:
        account = await connection.fetchrow(
            "SELECT status, balance FROM accounts WHERE id = $1 FOR UPDATE", account_id
        )
        if account is None:
            raise AccountNotFound(f"no account {account_id}")
        if account["status"] == "deleted":
            amount = await connection.fetchval("SELECT amount FROM ledger_entries WHERE id = $1", entry_id)
            return ClosedOut(entry_id, amount or 0, -(amount or 0), 0, 0, already_deleted=True)
        if account["status"] != "closing":
            raise AccountNotClosable(f"account {account_id} is {account['status']}; begin closing first")
        live = await connection.fetchval(
            "SELECT count(*) FROM deliveries WHERE account_id = $1 AND state IN ('pending', 'sending')", account_id
        )
        if live:
            raise AccountNotClosable(f"account {account_id} still has {live} live deliveries")
        erased = await connection.fetchval(
            "WITH erased AS (UPDATE messages SET payload = NULL, payload_erased_at = now(),"
            " payload_erased_by = 'account_deletion' WHERE account_id = $1 AND payload IS NOT NULL"
            " RETURNING 1) SELECT count(*) FROM erased", account_id
        )
        await connection.execute(
            "UPDATE endpoints SET secret = NULL, previous_secret = NULL, headers = NULL, enabled = false,"
            " disabled_reason = coalesce(disabled_reason, 'account deleted'), updated_at = now()"
            " WHERE account_id = $1", account_id
        )
        await connection.execute(
            "UPDATE operational_endpoints SET secret = NULL, enabled = false, deleted_at = coalesce(deleted_at, now()),"
            " updated_at = now() WHERE account_id = $1", account_id
        )
        # The account's stored answers hold its shown-once keys and secrets, sealed; they go with the rest.
        await connection.execute("DELETE FROM idempotent_responses WHERE principal = $1", str(account_id))
        revoked = await connection.fetchval(
            "WITH revoked AS (UPDATE api_keys SET revoked_at = now() WHERE account_id = $1 AND revoked_at IS NULL"
            " RETURNING 1) SELECT count(*) FROM revoked", account_id
        )
        amount = -account["balance"]
        await connection.execute(
            "INSERT INTO ledger_entries (id, account_id, kind, amount) VALUES ($1, $2, 'closeout', $3)",
            entry_id, account_id, amount,
        )
        await connection.execute(
            "UPDATE accounts SET balance = balance + $2, status = 'deleted', deleted_at = now() WHERE id = $1",
            account_id, amount,
        )
    return ClosedOut(entry_id, amount, -amount, erased, revoked, already_deleted=False)
