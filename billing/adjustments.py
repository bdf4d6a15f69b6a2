"""Repairs of a closing account's live deliveries that disagree with the ledger: adjustment entries.

A deletion's bulk settlement refuses to settle anything while a live delivery disagrees with
the ledger (billing.closeout.precheck). This module proposes and applies the correction for
each such delivery, so the settlement can then run and the audit is clean afterwards:

    problem                          adjustment entry                              then
    no charge entry                  adjustment:<id>:missing_charge   = -price     settle: refund +price
    charge of X, expected -price     adjustment:<id>:charge_difference = -price-X  settle: refund +price
    refunded while still live        adjustment:<id>:refund_on_live   = 0          settle: the refund counts

"Settle" here is what the bulk settlement would have done to the delivery: mark it dead
(`account_deleted`) and insert `refund:<id>` unless one exists. Afterwards the delivery is
dead with a net ledger of 0, its charge (with the adjustment) is -price, and it has one refund:
invariants I1-I3 hold under the audit's adjustment rule (billing.audit). A zero adjustment
is still written for a refund on a live delivery: the ledger is where a repair is recorded.

Adjustment ids are derived (`adjustment:<delivery_id>:<reason>`); adjustments carry no
delivery_id column (the schema reserves that for charge, refund and reclaim), so the audit ties
them to their delivery by id. Not repaired automatically, and shown as such: a charge on another
account (two accounts' money), a refund of the wrong amount, or a delivery that already has an
adjustment. Those need a person.

Lock order as everywhere: the account row, then the deliveries by id.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from billing.database import Executor, transaction
from billing.errors import AccountNotClosable, AccountNotFound, BalanceLimitExceeded, BillingError

REASONS = ("missing_charge", "charge_difference", "refund_on_live")
# Adjustments that stand in for or correct a delivery's charge; the audit adds them to the charge.
CHARGE_REASONS = ("missing_charge", "charge_difference")
REPAIRS_PER_CALL_MAX = 10_000
BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1  # accounts.balance


class RepairChanged(BillingError):
    """The ledger changed since the repairs were shown; nothing was written. Look again."""


@dataclass(frozen=True)
class Repair:
    delivery_id: uuid.UUID
    account_id: uuid.UUID
    price: int
    problem: str
    reason: str | None  # None: not repairable automatically (see problem)
    adjustment_amount: int  # credits the adjustment moves
    refund_amount: int  # credits the settle's refund moves (0 when a refund exists)

    @property
    def adjustment_id(self) -> str | None:
        return adjustment_id(self.delivery_id, self.reason) if self.reason else None

    @property
    def repairable(self) -> bool:
        return self.reason is not None

    @property
    def balance_change(self) -> int:
        return self.adjustment_amount + self.refund_amount


def adjustment_id(delivery_id: uuid.UUID, reason: str) -> str:
    assert reason in REASONS, reason
    return f"adjustment:{delivery_id}:{reason}"


# The live deliveries of one account with everything its ledger says about them. $2: lock them.
# Every read names the account: ledger ids are unique together with the account, so another
# account's charge:<id> is no charge of this delivery; _FOREIGN_CHARGES looks for those apart.
_LIVE_WITH_ENTRIES = (
    "SELECT d.id, d.account_id, d.price, c.amount AS charge_amount, r.amount AS refund_amount,"
    "   EXISTS (SELECT 1 FROM ledger_entries a WHERE a.account_id = $1"
    "     AND a.id IN ('adjustment:' || d.id || ':missing_charge',"
    "       'adjustment:' || d.id || ':charge_difference', 'adjustment:' || d.id || ':refund_on_live')) AS adjusted"
    " FROM deliveries d"
    " LEFT JOIN ledger_entries c ON c.account_id = $1 AND c.id = 'charge:' || d.id"
    " LEFT JOIN ledger_entries r ON r.account_id = $1 AND r.id = 'refund:' || d.id"
    " WHERE d.account_id = $1 AND d.state IN ('pending', 'sending')"
    "   AND (c.id IS NULL OR c.amount <> -d.price OR r.id IS NOT NULL)"
    " ORDER BY d.id"
)
# The charges of these deliveries ($1) written on another account than $2. An operator's read that
# spans accounts by nature (a repair runs by hand), made only for the deliveries that have no
# charge of their own: a delivery charged elsewhere needs a person, not an adjustment here. Found
# by the deliveries' ids through ix_ledger_entries_delivery_id (a charge names its delivery), not
# by the bare entry ids, whose index migration 0025 dropped.
_FOREIGN_CHARGES = (
    "SELECT delivery_id, account_id FROM ledger_entries"
    " WHERE delivery_id = ANY($1::uuid[]) AND kind = 'charge' AND id = 'charge:' || delivery_id AND account_id <> $2"
)
# Adjustments, then dead marks and the missing refunds, then the balance: one statement.
_APPLY = (
    "WITH adjustments AS ("
    "   INSERT INTO ledger_entries (id, account_id, kind, amount, note)"
    "   SELECT r.id, $1, 'adjustment', r.amount, r.note"
    "   FROM unnest($2::text[], $3::bigint[], $4::text[]) AS r(id, amount, note)"
    "   RETURNING amount),"
    " dead AS ("
    "   UPDATE deliveries d SET state = 'dead', dead_reason = 'account_deleted', leased_until = NULL,"
    "       finished_at = now()"
    "   WHERE d.account_id = $1 AND d.id = ANY($5::uuid[]) AND d.state IN ('pending', 'sending')"
    "   RETURNING d.id, d.price),"
    " refunds AS ("
    "   INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount)"
    "   SELECT 'refund:' || id, $1, id, 'refund', price FROM dead"
    "   ON CONFLICT (account_id, id) DO NOTHING RETURNING amount),"
    " moved AS ("
    "   UPDATE accounts SET balance = balance + (SELECT coalesce(sum(amount), 0) FROM adjustments)"
    "       + (SELECT coalesce(sum(amount), 0) FROM refunds)"
    "   WHERE id = $1 RETURNING balance)"
    " SELECT (SELECT count(*) FROM adjustments) AS adjustments, (SELECT count(*) FROM dead) AS marked_dead,"
    "   (SELECT count(*) FROM refunds) AS refunds, (SELECT balance FROM moved) AS balance"
)


def _plan(row, charged_elsewhere: uuid.UUID | None = None) -> Repair:
    """The correction for one live delivery that disagrees with the ledger (pure); `charged_elsewhere`:
    the other account its charge was written on, if any."""
    price, charge, refund = row["price"], row["charge_amount"], row["refund_amount"]

    def repair(problem: str, reason: str | None, amount: int = 0) -> Repair:
        refund_amount = price if refund is None else 0
        if reason is None:
            amount = refund_amount = 0
        return Repair(row["id"], row["account_id"], price, problem, reason, amount, refund_amount)

    if row["adjusted"]:
        return repair("already has an adjustment entry; needs a person", None)
    if charge is None and charged_elsewhere is not None:
        return repair(f"charge belongs to account {charged_elsewhere}; needs a person", None)
    if refund is not None and refund != price:
        return repair(f"refunded {refund} while live, expected {price}; needs a person", None)
    if charge is None:
        return repair("no charge entry", "missing_charge", -price)
    if charge != -price:
        return repair(f"charge is {charge}, expected {-price}", "charge_difference", -price - charge)
    return repair("already refunded while still live", "refund_on_live", 0)


async def propose(executor: Executor, account_id: uuid.UUID) -> list[Repair]:
    """The corrections the account's live deliveries need. Reads only; one scan."""
    async with transaction(executor) as connection:
        rows = await connection.fetch(_LIVE_WITH_ENTRIES + " LIMIT $2", account_id, REPAIRS_PER_CALL_MAX)
        return await _plans(connection, account_id, rows)


async def _plans(connection, account_id: uuid.UUID, rows) -> list[Repair]:
    """Each row's correction, after looking for the charges missing here on other accounts."""
    missing = [row["id"] for row in rows if row["charge_amount"] is None]
    elsewhere = {}
    if missing:
        elsewhere = {r["delivery_id"]: r["account_id"]
                     for r in await connection.fetch(_FOREIGN_CHARGES, missing, account_id)}
    return [_plan(row, elsewhere.get(row["id"])) for row in rows]


@dataclass(frozen=True)
class Applied:
    repaired: int
    adjustments: int
    refunds: int
    balance: int


async def apply(executor: Executor, account_id: uuid.UUID, shown: list[Repair]) -> Applied:
    """Apply exactly the repairs that were shown (and confirmed), or nothing.

    The account must be closing (its deletion waits for the repair). Locks the account, then
    the deliveries by id; recomputes the repairs and refuses (RepairChanged) if they differ
    from `shown`, so nobody confirms one thing and gets another.
    """
    async with transaction(executor) as connection:
        status = await connection.fetchval("SELECT status FROM accounts WHERE id = $1 FOR UPDATE", account_id)
        if status is None:
            raise AccountNotFound(f"no account {account_id}")
        if status != "closing":
            raise AccountNotClosable(f"account {account_id} is {status}; repairs apply to a closing account")
        rows = await connection.fetch(_LIVE_WITH_ENTRIES + " LIMIT $2 FOR UPDATE OF d", account_id,
                                      REPAIRS_PER_CALL_MAX)
        current = await _plans(connection, account_id, rows)
        if current != list(shown):
            raise RepairChanged(f"{len(current)} repairs are needed now, {len(shown)} were shown; nothing was written")
        chosen = [repair for repair in current if repair.repairable]
        balance = await connection.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id)
        if not chosen:
            return Applied(0, 0, 0, balance)
        after = balance + sum(repair.balance_change for repair in chosen)
        if not BIGINT_MIN <= after <= BIGINT_MAX:
            raise BalanceLimitExceeded(
                f"the repairs would move the balance of {balance} by {after - balance}, past what an account can"
                " hold; nothing was written: these need a person")
        row = await connection.fetchrow(
            _APPLY, account_id,
            [repair.adjustment_id for repair in chosen],
            [repair.adjustment_amount for repair in chosen],
            [f"repair: {repair.problem}" for repair in chosen],
            [repair.delivery_id for repair in chosen],
        )
        # Every repaired delivery was locked live above, so each is marked dead exactly once.
        assert row["marked_dead"] == row["adjustments"] == len(chosen), dict(row)
    return Applied(len(chosen), row["adjustments"], row["refunds"], row["balance"])
