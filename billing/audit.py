"""The audit: checks invariants I1-I7 of DESIGN.md over all accounts or one, set-based.

Each check is one SQL scan that returns the offending rows, never a query per delivery. A
clean audit returns no violations. Notices are facts worth a look that break no invariant
(a stale success that arrived after its account was deleted, which was never reclaimed).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field

import asyncpg

from billing.database import Executor

INVARIANTS = {
    "I1": "every delivery has exactly one charge of -price, on its own account",
    "I2": "net ledger of a delivery: -price if delivered or live, 0 if dead",
    "I3": "a refund only for a dead (or recovered) delivery, at most one; a reclaim only after a refund",
    "I4": "accounts.balance equals the sum of the account's ledger entries",
    "I5": "the ledger is append-only: its triggers exist and always fire",
    "I6": "attempt fencing: no recorded attempt beyond the delivery's, and every delivered one has a 2xx",
    "I7": "a charge never takes a balance below zero",
}


@dataclass(frozen=True)
class Violation:
    invariant: str
    account_id: uuid.UUID | None
    delivery_id: uuid.UUID | None
    detail: str


@dataclass
class AuditReport:
    violations: list[Violation] = field(default_factory=list)
    notices: list[Violation] = field(default_factory=list)
    accounts: int = 0
    deliveries: int = 0
    ledger_entries: int = 0

    @property
    def clean(self) -> bool:
        return not self.violations

    def to_json(self) -> dict:
        def row(v: Violation) -> dict:
            data = asdict(v)
            data["account_id"] = str(v.account_id) if v.account_id else None
            data["delivery_id"] = str(v.delivery_id) if v.delivery_id else None
            return data

        return {
            "clean": self.clean,
            "accounts": self.accounts,
            "deliveries": self.deliveries,
            "ledger_entries": self.ledger_entries,
            "violations": [row(v) for v in self.violations],
            "notices": [row(v) for v in self.notices],
        }


# $1: an account id, or NULL for every account.
_DELIVERY_CHECKS = """
WITH entries AS (
    SELECT delivery_id,
        count(*) FILTER (WHERE kind = 'charge') AS charges,
        coalesce(sum(amount) FILTER (WHERE kind = 'charge'), 0) AS charge_amount,
        count(*) FILTER (WHERE kind = 'refund') AS refunds,
        count(*) FILTER (WHERE kind = 'reclaim') AS reclaims,
        sum(amount) AS net,
        min(account_id::text) AS account_low, max(account_id::text) AS account_high
    FROM ledger_entries
    WHERE delivery_id IS NOT NULL AND ($1::uuid IS NULL OR account_id = $1)
    GROUP BY delivery_id
), joined AS (
    SELECT coalesce(d.id, e.delivery_id) AS delivery_id, coalesce(d.account_id, e.account_low::uuid) AS account_id,
        d.state, d.price, e.charges, e.charge_amount, e.refunds, e.reclaims, e.net, e.account_low, e.account_high,
        d.id IS NULL AS orphan
    FROM (SELECT * FROM deliveries WHERE $1::uuid IS NULL OR account_id = $1) d
    FULL JOIN entries e ON e.delivery_id = d.id
)
SELECT * FROM (
    SELECT account_id, delivery_id, unnest(ARRAY[
        CASE WHEN orphan THEN 'I1:ledger entries for a delivery that does not exist' END,
        CASE WHEN NOT orphan AND coalesce(charges, 0) <> 1 THEN 'I1:' || coalesce(charges, 0) || ' charge entries' END,
        CASE WHEN NOT orphan AND charges = 1 AND charge_amount <> -price
            THEN 'I1:charge is ' || charge_amount || ', expected ' || -price END,
        CASE WHEN NOT orphan AND (account_low <> account_id::text OR account_high <> account_id::text)
            THEN 'I1:an entry is on another account' END,
        CASE WHEN NOT orphan AND state IN ('delivered', 'pending', 'sending') AND coalesce(net, 0) <> -price
            THEN 'I2:net ' || coalesce(net, 0) || ' for a ' || state || ' delivery, expected ' || -price END,
        CASE WHEN NOT orphan AND state = 'dead' AND coalesce(net, 0) <> 0
            THEN 'I2:net ' || coalesce(net, 0) || ' for a dead delivery, expected 0' END,
        CASE WHEN coalesce(refunds, 0) > 1 OR coalesce(reclaims, 0) > 1 THEN 'I3:more than one refund or reclaim' END,
        CASE WHEN coalesce(reclaims, 0) > coalesce(refunds, 0) THEN 'I3:reclaim without a refund' END,
        CASE WHEN state IN ('pending', 'sending') AND coalesce(refunds, 0) > 0 THEN 'I3:refund on a live delivery' END,
        CASE WHEN state = 'delivered' AND coalesce(refunds, 0) > coalesce(reclaims, 0)
            THEN 'I3:refund on a delivered delivery that was not reclaimed' END
    ]) AS problem
    FROM joined
) checked WHERE problem IS NOT NULL
"""
_BALANCE_CHECK = """
SELECT a.id AS account_id, a.balance, coalesce(l.total, 0) AS ledger_total
FROM accounts a LEFT JOIN (
    SELECT account_id, sum(amount) AS total FROM ledger_entries
    WHERE $1::uuid IS NULL OR account_id = $1 GROUP BY account_id
) l ON l.account_id = a.id
WHERE ($1::uuid IS NULL OR a.id = $1) AND a.balance <> coalesce(l.total, 0)
"""
_TRIGGER_CHECK = """
SELECT count(*) FROM pg_trigger
WHERE tgrelid = 'ledger_entries'::regclass AND tgenabled = 'A'
  AND tgname IN ('ledger_entries_no_update_delete', 'ledger_entries_no_truncate')
"""
_FENCING_CHECK = """
SELECT d.account_id, d.id AS delivery_id, 'I6:attempt ' || max(a.attempt) || ' recorded beyond the delivery''s attempt ' || d.attempt AS problem
FROM deliveries d JOIN delivery_attempts a ON a.delivery_id = d.id
WHERE ($1::uuid IS NULL OR d.account_id = $1)
GROUP BY d.id HAVING max(a.attempt) > d.attempt
UNION ALL
SELECT d.account_id, d.id, 'I6:delivered without a 2xx attempt on record'
FROM deliveries d
WHERE d.state = 'delivered' AND ($1::uuid IS NULL OR d.account_id = $1)
  AND NOT EXISTS (SELECT 1 FROM delivery_attempts a WHERE a.delivery_id = d.id AND a.status_code BETWEEN 200 AND 299)
"""
_NEGATIVE_CHARGE_CHECK = """
SELECT account_id, delivery_id, 'I7:charge took the balance to ' || running AS problem FROM (
    SELECT account_id, delivery_id, kind, amount, sum(amount) OVER (PARTITION BY account_id ORDER BY seq) AS running
    FROM ledger_entries WHERE $1::uuid IS NULL OR account_id = $1
) t WHERE kind = 'charge' AND amount < 0 AND running < 0
"""
_UNPAID_STALE_SUCCESS = """
SELECT d.account_id, d.id AS delivery_id,
    'a send succeeded after the delivery died on a ' || a.status || ' account; not reclaimed' AS problem
FROM deliveries d JOIN accounts a ON a.id = d.account_id
WHERE d.state = 'dead' AND a.status <> 'active' AND ($1::uuid IS NULL OR d.account_id = $1)
  AND EXISTS (SELECT 1 FROM delivery_attempts t WHERE t.delivery_id = d.id AND t.status_code BETWEEN 200 AND 299)
"""
_COUNTS = """
SELECT (SELECT count(*) FROM accounts WHERE $1::uuid IS NULL OR id = $1) AS accounts,
       (SELECT count(*) FROM deliveries WHERE $1::uuid IS NULL OR account_id = $1) AS deliveries,
       (SELECT count(*) FROM ledger_entries WHERE $1::uuid IS NULL OR account_id = $1) AS ledger_entries
"""


def _violation(row, problem: str | None = None) -> Violation:
    invariant, _, detail = (problem or row["problem"]).partition(":")
    return Violation(invariant, row["account_id"], row["delivery_id"], detail)


async def audit(executor: Executor, account_id: uuid.UUID | None = None) -> AuditReport:
    """Check I1-I7 over one account or all, in one repeatable-read snapshot."""
    async with _snapshot(executor) as connection:
        report = AuditReport(**dict(await connection.fetchrow(_COUNTS, account_id)))
        for row in await connection.fetch(_DELIVERY_CHECKS, account_id):
            report.violations.append(_violation(row))
        for row in await connection.fetch(_BALANCE_CHECK, account_id):
            report.violations.append(
                Violation("I4", row["account_id"], None,
                          f"balance {row['balance']} but the ledger sums to {row['ledger_total']}")
            )
        if await connection.fetchval(_TRIGGER_CHECK) != 2:
            report.violations.append(Violation("I5", None, None, "the append-only triggers are missing or disabled"))
        for query in (_FENCING_CHECK, _NEGATIVE_CHARGE_CHECK):
            report.violations.extend(_violation(row) for row in await connection.fetch(query, account_id))
        report.notices.extend(
            Violation("notice", row["account_id"], row["delivery_id"], row["problem"])
            for row in await connection.fetch(_UNPAID_STALE_SUCCESS, account_id)
        )
    return report


@contextlib.asynccontextmanager
async def _snapshot(executor: Executor) -> AsyncIterator[asyncpg.Connection]:
    """A read-only repeatable-read transaction: every check sees the same moment."""
    if isinstance(executor, asyncpg.Pool):
        async with executor.acquire() as connection:
            async with connection.transaction(isolation="repeatable_read", readonly=True):
                yield connection
    else:
        async with executor.transaction(isolation="repeatable_read", readonly=True):
            yield executor
