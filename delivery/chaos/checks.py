"""What must hold once the faults stopped and everything drained, read from the run's database.

Each check returns a `Check` (name, passed, detail). The credit check is done twice, from
independent sources that must agree with the cached balances:

    ledger by kind:   topup + topup_reversal + charge + refund + reclaim + closeout + adjustment
    deliveries table: topups (ledger) + reversals (ledger) - price of every delivered delivery
                      + closeouts + adjustments (no delivery is live after the drain)

and the top-ups in the ledger are compared with the orders the workload asked for. The
operational events are checked against their causes (delivery.chaos.operational_checks).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import asyncpg

from billing.audit import audit
from delivery.chaos import operational_checks
from delivery.chaos.receivers import ReceiverFarm
from delivery.chaos.workload import Workload

DRAIN_POLL_SECONDS = 0.5
# A deletion whose job was lost is resumed by the platform's sweep after 60 s (delivery.operations.deletion
# STALE_AFTER_SECONDS); only past this is it requested again by hand, and the summary says so.
DELETION_RETRY_SECONDS = 120.0
DETAILS_MAX = 5  # ids named in a failed check's detail

_LIVE = "SELECT count(*) FROM deliveries WHERE state IN ('pending', 'sending')"
# Operational events of active accounts not yet dispatched, and operational deliveries not finished.
_OPERATIONAL_WAITING = (
    "SELECT (SELECT count(*) FROM operational_events e JOIN accounts a ON a.id = e.account_id"
    "   WHERE e.dispatched_at IS NULL AND a.status = 'active')"
    " + (SELECT count(*) FROM operational_deliveries WHERE state IN ('pending', 'sending'))"
)
_DELETIONS_NOT_DONE = "SELECT account_id::text FROM account_deletions WHERE status <> 'done'"
_OUTCOMES = ("SELECT state, coalesce(dead_reason, '') AS reason, count(*) AS n, sum(price) AS credits"
             " FROM deliveries GROUP BY 1, 2 ORDER BY 1, 2")
_REFUNDS_BY_REASON = (
    "SELECT coalesce(d.dead_reason, 'recovered') AS reason, count(*) AS n, sum(l.amount) AS credits"
    " FROM ledger_entries l JOIN deliveries d ON d.account_id = l.account_id AND d.id = l.delivery_id"
    " WHERE l.kind = 'refund' GROUP BY 1 ORDER BY 1"
)
_LEDGER_BY_KIND = "SELECT kind, count(*) AS n, sum(amount) AS credits FROM ledger_entries GROUP BY kind"
_BALANCES = "SELECT coalesce(sum(balance), 0) FROM accounts"
_DELIVERED_PRICE = "SELECT coalesce(sum(price), 0) FROM deliveries WHERE state = 'delivered'"
# What each delivered delivery was sent under: its own id, or for a replay the replayed one's.
_DELIVERED_IDS = "SELECT coalesce(webhook_id, id)::text FROM deliveries WHERE state = 'delivered'"
_ALL_IDS = "SELECT id::text FROM deliveries UNION ALL SELECT id::text FROM operational_events"
_TOPUPS = "SELECT substr(id, length('topup:') + 1) AS order_id, amount FROM ledger_entries WHERE kind = 'topup'"
_REVERSALS = ("SELECT substr(id, length('topup_reversal:') + 1) AS order_id, amount FROM ledger_entries"
              " WHERE kind = 'topup_reversal'")
# Each deleted account with its closeout entry, read by the ledger's key (account_id, id).
_DELETED_ACCOUNTS = ("SELECT a.id::text, a.status, a.balance, l.amount AS closeout FROM accounts a"
                     " LEFT JOIN ledger_entries l ON l.account_id = a.id AND l.id = 'closeout:' || a.id::text"
                     " WHERE a.id = ANY($1::uuid[])")


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str


async def drain(pool: asyncpg.Pool, workload: Workload, timeout_seconds: float) -> float:
    """Wait until no delivery is live and every deletion is done. Returns the seconds it took.

    A deletion still running after DELETION_RETRY_SECONDS is requested again, as an operator
    would (`hookledger accounts delete` again): its job can be lost with Redis or a killed worker.
    """
    started = time.monotonic()
    last_request = started
    while time.monotonic() - started < timeout_seconds:
        live = await pool.fetchval(_LIVE) + await pool.fetchval(_OPERATIONAL_WAITING)
        waiting = [row[0] for row in await pool.fetch(_DELETIONS_NOT_DONE)]
        if live == 0 and not waiting:
            break
        if waiting and time.monotonic() - last_request > DELETION_RETRY_SECONDS:
            for account_id in waiting:
                await workload.request_deletion(account_id)
                workload.tally["deletion_rerequests"] += 1
            last_request = time.monotonic()
        await asyncio.sleep(DRAIN_POLL_SECONDS)
    return time.monotonic() - started


async def run_checks(pool: asyncpg.Pool, workload: Workload, receivers: ReceiverFarm,
                     unexpected_exits: list[str]) -> tuple[list[Check], dict]:
    """Every check, and the facts the summary reports (outcomes, refunds, ledger by kind)."""
    checks: list[Check] = []
    report = await audit(pool)
    first = "; ".join(f"{v.invariant} {v.delivery_id or v.account_id}: {v.detail}" for v in report.violations[:DETAILS_MAX])
    checks.append(Check("audit clean", report.clean, f"{len(report.violations)} violations {first}".strip()))
    live = await pool.fetchval(_LIVE)
    checks.append(Check("no delivery pending or sending", live == 0, f"{live} live"))
    checks.append(_receipts_check({r[0] for r in await pool.fetch(_DELIVERED_IDS)}, receivers))
    all_ids = {r[0] for r in await pool.fetch(_ALL_IDS)}
    lost = workload.accepted_deliveries - all_ids
    checks.append(Check("every accepted delivery exists", not lost, f"{len(lost)} missing {sorted(lost)[:DETAILS_MAX]}"))
    unknown = [webhook_id for webhook_id, r in receivers.receipts.items() if r.valid and webhook_id not in all_ids]
    checks.append(Check("receivers saw only real deliveries, all signed", not unknown and receivers.invalid == 0,
                        f"{receivers.invalid} invalid signatures, {len(unknown)} unknown ids"))
    by_kind = {row["kind"]: (row["n"], row["credits"]) for row in await pool.fetch(_LEDGER_BY_KIND)}
    checks.extend(await _credit_checks(pool, workload, by_kind))
    checks.extend(await _deletion_checks(pool, workload))
    rerequests = workload.tally["deletion_rerequests"]
    checks.append(Check("every deletion finished without being asked again", rerequests == 0,
                        f"{rerequests} re-requested after {DELETION_RETRY_SECONDS:.0f} s"))
    checks.append(Check("idempotent answers agree", not workload.mismatches, "; ".join(workload.mismatches[:DETAILS_MAX])))
    checks.append(Check("no platform process exited by itself", not unexpected_exits, "; ".join(unexpected_exits)))
    checks.extend(Check(*found) for found in await operational_checks.run(pool, receivers))
    facts = {
        "audit": {"accounts": report.accounts, "deliveries": report.deliveries, "ledger_entries": report.ledger_entries,
                  "notices": len(report.notices)},
        "outcomes": [dict(row) for row in await pool.fetch(_OUTCOMES)],
        "refunds_by_reason": [dict(row) for row in await pool.fetch(_REFUNDS_BY_REASON)],
        "ledger_by_kind": {kind: {"entries": n, "credits": credits} for kind, (n, credits) in sorted(by_kind.items())},
    }
    return checks, facts


def _receipts_check(delivered: set[str], receivers: ReceiverFarm) -> Check:
    missing = [delivery_id for delivery_id in delivered
               if (r := receivers.receipts.get(delivery_id)) is None or not r.valid or not r.answered_2xx]
    return Check("every delivered delivery was received, signed, answered 2xx", not missing,
                 f"{len(delivered)} delivered, {len(missing)} not seen so {sorted(missing)[:DETAILS_MAX]}")


async def _credit_checks(pool: asyncpg.Pool, workload: Workload, by_kind: dict) -> list[Check]:
    def credits(kind: str) -> int:
        return int(by_kind.get(kind, (0, 0))[1] or 0)

    balances = int(await pool.fetchval(_BALANCES))
    ledger_total = sum(credits(kind) for kind in by_kind)
    delivered_price = int(await pool.fetchval(_DELIVERED_PRICE))
    from_deliveries = (credits("topup") + credits("topup_reversal") - delivered_price + credits("closeout")
                       + credits("adjustment"))
    money = credits("charge") + credits("refund") + credits("reclaim")
    checks = [
        Check("credits: ledger by kind = sum of balances", ledger_total == balances,
              f"ledger {ledger_total}, balances {balances}"),
        Check("credits: top-ups - delivered - closeouts (- reversals + adjustments) = sum of balances",
              from_deliveries == balances,
              f"top-ups {credits('topup')}, reversals {credits('topup_reversal')}, delivered {delivered_price},"
              f" closeouts {credits('closeout')}, adjustments {credits('adjustment')} -> {from_deliveries};"
              f" balances {balances}"),
        Check("credits: charges + refunds + reclaims = - price of delivered", money == -delivered_price,
              f"{money} vs {-delivered_price}"),
    ]
    topups = {row["order_id"]: row["amount"] for row in await pool.fetch(_TOPUPS)}
    reversals = {row["order_id"]: row["amount"] for row in await pool.fetch(_REVERSALS)}
    wrong = [order for order, amount in topups.items() if workload.orders.get(order) != amount]
    unapplied = [order for order in workload.orders_answered if order not in topups]
    bad_reversals = [order for order in workload.reversed_orders if reversals.get(order) != -workload.orders[order]]
    bad_reversals += [order for order in reversals if order not in workload.reversed_orders]
    checks.append(Check("top-ups: each order once, as asked", not (wrong or unapplied or bad_reversals),
                        f"{len(topups)} top-ups, {len(reversals)} reversals; wrong {wrong[:DETAILS_MAX]},"
                        f" answered but absent {unapplied[:DETAILS_MAX]}, reversals {bad_reversals[:DETAILS_MAX]}"))
    return checks


async def _deletion_checks(pool: asyncpg.Pool, workload: Workload) -> list[Check]:
    rows = await pool.fetch(_DELETED_ACCOUNTS, workload.deleted_accounts)
    bad = [row["id"] for row in rows if row["status"] != "deleted" or row["balance"] != 0 or row["closeout"] is None]
    return [Check("deleted accounts: deleted, balance 0, closed out", not bad and len(rows) == len(workload.deleted_accounts),
                  f"{len(workload.deleted_accounts)} deleted, {len(bad)} not finished {bad[:DETAILS_MAX]}")]
