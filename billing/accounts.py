"""Accounts and top-ups: create, top up by order id, reverse a top-up, read the balance.

Every operation is one transaction that locks the account row first (the lock order used
everywhere: account, then deliveries), writes its ledger entry with a derived id, and moves
the cached balance in the same transaction.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from billing import ids
from billing.database import Executor, transaction
from billing.tables import (
    PAYLOAD_RETENTION_DAYS_DEFAULT,
    PAYLOAD_RETENTION_DAYS_MAX,
    PAYLOAD_RETENTION_DAYS_MIN,
    PORTAL_FRAME_ANCESTORS_MAX,
)
from billing.errors import (
    AccountNotActive,
    AccountNotFound,
    BalanceLimitExceeded,
    InsufficientBalance,
    InvalidInput,
    TopupConflict,
    TopupUnknown,
)

NAME_LENGTH_MAX = 200
ORDER_ID_LENGTH_MAX = 200
AMOUNT_MAX = 10**15  # credits; far above any real top-up, far below bigint overflow
PRICE_MAX = 10**9
BALANCE_MAX = 2**63 - 1  # accounts.balance is a bigint


# The credits of pending and sending deliveries: charged, and refunded if they die, so a top-up
# leaves room for them. Charges and refunds move credits between the balance and this sum, and a
# delivery only leaves it for good, so a balance topped up within the limit never passes it.
_IN_FLIGHT = (
    "SELECT coalesce(sum(price), 0) FROM deliveries WHERE account_id = $1 AND state IN ('pending', 'sending')"
)


@dataclass(frozen=True)
class Account:
    id: uuid.UUID
    name: str
    status: str
    balance: int
    price_per_delivery: int
    payload_retention_days: int
    low_balance_threshold: int | None  # balance.low is sent when the balance falls below it; None: never
    portal_frame_ancestors: list[str]  # https origins that may embed the customer portal in an iframe


@dataclass(frozen=True)
class Balance:
    balance: int
    in_flight: int


@dataclass(frozen=True)
class TopupResult:
    entry_id: str
    amount: int
    balance: int
    applied: bool  # False when this order was already applied before (idempotent repeat)


def _check_amount(amount: object, what: str) -> int:
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise InvalidInput(f"{what} must be an integer number of credits, got {amount!r}")
    if not 0 < amount <= AMOUNT_MAX:
        raise InvalidInput(f"{what} must be between 1 and {AMOUNT_MAX}, got {amount}")
    return amount


def _check_text(value: object, what: str, length_max: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{what} must be a non-empty string")
    if len(value) > length_max:
        raise InvalidInput(f"{what} is {len(value)} characters; the limit is {length_max}")
    return value


async def _lock_account(connection, account_id: uuid.UUID):
    row = await connection.fetchrow(
        "SELECT id, name, status, balance, price_per_delivery FROM accounts WHERE id = $1 FOR UPDATE",
        account_id,
    )
    if row is None:
        raise AccountNotFound(f"no account {account_id}")
    return row


_ROW_LOCKS = frozenset({"FOR UPDATE", "FOR SHARE"})


async def lock_active(connection, account_id: uuid.UUID, what: str, *, lock: str = "FOR UPDATE") -> int:
    """Lock the account row (first: the platform's one lock order), refuse it unless active, and
    answer its balance as locked.

    For what an account makes besides messages (keys, endpoints, secrets): a closing account's
    deletion erases them under this lock, and a create that waited on it would otherwise give a
    deleted account a live key or secret again (its keys authenticate until the closeout commits).
    AccountNotFound for no such account; AccountNotActive, naming `what`, for a closing or deleted one.
    """
    assert lock in _ROW_LOCKS, lock
    row = await connection.fetchrow(f"SELECT status, balance FROM accounts WHERE id = $1 {lock}", account_id)
    if row is None:
        raise AccountNotFound(f"no account {account_id}")
    if row["status"] != "active":
        raise AccountNotActive(f"the account is {row['status']}; it takes no new {what}")
    return row["balance"]


_ACCOUNT_COLUMNS = ("id, name, status, balance, price_per_delivery, payload_retention_days, low_balance_threshold,"
                    " portal_frame_ancestors")


def _check_retention_days(days: object) -> int:
    if isinstance(days, bool) or not isinstance(days, int):
        raise InvalidInput(f"payload_retention_days must be an integer, got {days!r}")
    if not PAYLOAD_RETENTION_DAYS_MIN <= days <= PAYLOAD_RETENTION_DAYS_MAX:
        raise InvalidInput(f"payload_retention_days must be between {PAYLOAD_RETENTION_DAYS_MIN}"
                           f" and {PAYLOAD_RETENTION_DAYS_MAX}")
    return days


async def create_account(executor: Executor, name: str, *, price_per_delivery: int = 1,
                         payload_retention_days: int = PAYLOAD_RETENTION_DAYS_DEFAULT) -> Account:
    _check_text(name, "name", NAME_LENGTH_MAX)
    if isinstance(price_per_delivery, bool) or not isinstance(price_per_delivery, int):
        raise InvalidInput(f"price_per_delivery must be an integer, got {price_per_delivery!r}")
    if not 0 <= price_per_delivery <= PRICE_MAX:
        raise InvalidInput(f"price_per_delivery must be between 0 and {PRICE_MAX}")
    _check_retention_days(payload_retention_days)
    account_id = ids.new_id()
    async with transaction(executor) as connection:
        row = await connection.fetchrow(
            "INSERT INTO accounts (id, name, price_per_delivery, payload_retention_days) VALUES ($1, $2, $3, $4)"
            f" RETURNING {_ACCOUNT_COLUMNS}",
            account_id,
            name,
            price_per_delivery,
            payload_retention_days,
        )
    return Account(**dict(row))


async def get_account(executor: Executor, account_id: uuid.UUID) -> Account:
    row = await executor.fetchrow(f"SELECT {_ACCOUNT_COLUMNS} FROM accounts WHERE id = $1", account_id)
    if row is None:
        raise AccountNotFound(f"no account {account_id}")
    return Account(**dict(row))


async def update_settings(executor: Executor, account_id: uuid.UUID, *, payload_retention_days: int | None = None,
                          set_threshold: bool = False, low_balance_threshold: int | None = None,
                          portal_frame_ancestors: list[str] | None = None) -> Account:
    """Change an account's settings in one statement: payload_retention_days when given, and with
    set_threshold its low_balance_threshold (None: off), which arms balance.low again (the next fall
    below it is sent; billing.operational_outbox); portal_frame_ancestors when given (the caller
    checked each is an https origin; [] clears them). Moves no money."""
    if payload_retention_days is not None:
        _check_retention_days(payload_retention_days)
    if set_threshold and low_balance_threshold is not None and (
            isinstance(low_balance_threshold, bool) or not isinstance(low_balance_threshold, int)
            or not 0 < low_balance_threshold <= BALANCE_MAX):
        raise InvalidInput(f"low_balance_threshold must be between 1 and {BALANCE_MAX}, got {low_balance_threshold!r}")
    if portal_frame_ancestors is not None and len(portal_frame_ancestors) > PORTAL_FRAME_ANCESTORS_MAX:
        raise InvalidInput(f"portal_frame_ancestors lists at most {PORTAL_FRAME_ANCESTORS_MAX} origins")
    row = await executor.fetchrow(
        "UPDATE accounts SET payload_retention_days = coalesce($2, payload_retention_days),"
        " low_balance_threshold = CASE WHEN $3 THEN $4 ELSE low_balance_threshold END,"
        " low_balance_armed = low_balance_armed OR $3,"
        " portal_frame_ancestors = coalesce($5::text[], portal_frame_ancestors)"
        f" WHERE id = $1 RETURNING {_ACCOUNT_COLUMNS}",
        account_id, payload_retention_days, set_threshold, low_balance_threshold, portal_frame_ancestors,
    )
    if row is None:
        raise AccountNotFound(f"no account {account_id}")
    return Account(**dict(row))


# An entry of the account by its derived id: ledger ids are unique together with the account.
_ENTRY_OF_ACCOUNT = "SELECT account_id, amount FROM ledger_entries WHERE account_id = $1 AND id = $2"
# The top-up of an order on whichever account it was applied to: a read by the bare derived id
# across accounts, allowed to span them, as it is what keeps an order to one account (on a
# distributed engine, a read of every shard). Through ix_ledger_entries_topup_id, an index of the
# top-ups only (migration 0025): the charges and refunds written on every delivery add nothing to it.
_TOPUP_OF_ANY_ACCOUNT = "SELECT account_id, amount FROM ledger_entries WHERE id = $1 AND kind = 'topup'"


async def top_up(executor: Executor, account_id: uuid.UUID, order_id: str, amount: int) -> TopupResult:
    """Add credits for a paid order. The same order twice adds once; another amount is an error."""
    _check_text(order_id, "order_id", ORDER_ID_LENGTH_MAX)
    _check_amount(amount, "amount")
    entry_id = ids.topup_id(order_id)
    async with transaction(executor) as connection:
        account = await _lock_account(connection, account_id)
        # An order applies to one account. The ledger's key includes the account (0022), so no
        # index refuses the same order on another account: top-ups of one order take turns on a
        # lock named by it, taken after the account's, and the later one finds the earlier's entry.
        await connection.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", entry_id)
        existing = await connection.fetchrow(_TOPUP_OF_ANY_ACCOUNT, entry_id)
        if existing is not None:
            return _applied_before(order_id, entry_id, account_id, amount, account["balance"], existing)
        if account["status"] != "active":
            raise AccountNotActive(f"account {account_id} is {account['status']}")
        in_flight = int(await connection.fetchval(_IN_FLIGHT, account_id))  # a sum of bigints is numeric
        room = BALANCE_MAX - account["balance"] - in_flight
        if amount > room:
            raise BalanceLimitExceeded(
                f"a top-up of {amount} would take the balance ({account['balance']}, plus {in_flight} in flight"
                f" that may be refunded) past the maximum of {BALANCE_MAX}; at most {max(room, 0)} can be added"
            )
        # ON CONFLICT: a second write of the same entry changes nothing, and never raises a driver error.
        balance = await connection.fetchval(
            "WITH entry AS (INSERT INTO ledger_entries (id, account_id, kind, amount)"
            " VALUES ($1, $2, 'topup', $3) ON CONFLICT (account_id, id) DO NOTHING RETURNING amount)"
            " UPDATE accounts SET balance = balance + entry.amount FROM entry WHERE id = $2 RETURNING balance",
            entry_id,
            account_id,
            amount,
        )
        if balance is None:
            existing = await connection.fetchrow(_ENTRY_OF_ACCOUNT, account_id, entry_id)
            return _applied_before(order_id, entry_id, account_id, amount, account["balance"], existing)
    return TopupResult(entry_id, amount, balance, applied=True)


def _applied_before(order_id: str, entry_id: str, account_id: uuid.UUID, amount: int, balance: int, existing) -> TopupResult:
    """The order's top-up already exists: the same one again is a no-op, anything else a conflict."""
    if existing["account_id"] != account_id or existing["amount"] != amount:
        raise TopupConflict(
            f"order {order_id!r} was already applied with amount {existing['amount']}"
            + ("" if existing["account_id"] == account_id else " to another account")
        )
    return TopupResult(entry_id, amount, balance, applied=False)


async def reverse_top_up(executor: Executor, account_id: uuid.UUID, order_id: str) -> TopupResult:
    """Take back a top-up (a chargeback). Refused when unknown, or when the balance cannot cover it."""
    _check_text(order_id, "order_id", ORDER_ID_LENGTH_MAX)
    entry_id = ids.topup_reversal_id(order_id)
    async with transaction(executor) as connection:
        account = await _lock_account(connection, account_id)
        rows = await connection.fetch(
            "SELECT id, account_id, amount FROM ledger_entries WHERE account_id = $2 AND id = ANY($1::text[])",
            [ids.topup_id(order_id), entry_id], account_id,
        )
        entries = {row["id"]: row for row in rows}
        topup = entries.get(ids.topup_id(order_id))
        if topup is None or topup["account_id"] != account_id:
            raise TopupUnknown(f"no top-up with order id {order_id!r} on account {account_id}")
        amount = topup["amount"]
        if entry_id in entries:
            return TopupResult(entry_id, -amount, account["balance"], applied=False)
        if account["balance"] < amount:
            raise InsufficientBalance(
                f"balance {account['balance']} cannot cover reversing {amount}; the balance never goes below zero"
            )
        balance = await connection.fetchval(
            "WITH entry AS (INSERT INTO ledger_entries (id, account_id, kind, amount)"
            " VALUES ($1, $2, 'topup_reversal', $3))"
            " UPDATE accounts SET balance = balance + $3 WHERE id = $2 RETURNING balance",
            entry_id,
            account_id,
            -amount,
        )
    return TopupResult(entry_id, -amount, balance, applied=True)


async def get_balance(executor: Executor, account_id: uuid.UUID) -> Balance:
    """The balance, and the credits charged for deliveries not yet delivered or refunded."""
    row = await executor.fetchrow(
        "SELECT a.balance, (SELECT coalesce(sum(d.price), 0) FROM deliveries d"
        "   WHERE d.account_id = a.id AND d.state IN ('pending', 'sending'))::bigint AS in_flight"
        " FROM accounts a WHERE a.id = $1",
        account_id,
    )
    if row is None:
        raise AccountNotFound(f"no account {account_id}")
    return Balance(balance=row["balance"], in_flight=row["in_flight"])
