"""The ledger demo that `./scripts/run` shows: money moving through every kind of entry."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from billing import accounts, audit, closeout, messages
from billing.settle import DeadReason, settle
from delivery import audit_report, claims, endpoints, presend, results
from delivery.config import Settings
from delivery.database import open_pool


async def main(settings: Settings, console: Console) -> int:
    pool = await open_pool(settings, run_migrations=True)
    try:
        return await _story(pool, console)
    finally:
        await pool.close()


async def _story(pool, console: Console) -> int:
    account = await accounts.create_account(pool, "demo sender", price_per_delivery=2)
    await accounts.top_up(pool, account.id, f"order-{account.id}-1", 100)
    await accounts.top_up(pool, account.id, f"order-{account.id}-1", 100)  # the same order twice adds once
    for name in ("orders", "billing", "audit-log"):
        await endpoints.insert_endpoint(pool, account.id, f"https://{name}.example.com/hooks", secret_ciphertext=None)
    console.print(f"account {account.id}: topped up 100 (the same order sent twice), 3 endpoints")
    for number in range(4):
        request = messages.MessageRequest(account.id, "invoice.paid", b'{"invoice": %d}' % number, f"key-{number}")
        await messages.create_message(pool, request, attempts_max=2)
    _show_balance(console, "after 4 messages x 3 endpoints at 2 credits", await accounts.get_balance(pool, account.id))

    claimed = await claims.claim_due(pool, batch_size=100, lease_ms=30_000)
    outgoing, _ = await presend.load_for_send(pool, claimed)
    outcomes = [
        results.AttemptResult(item.claimed.id, item.claimed.attempt, account.id, success=index % 3 != 0,
                              latency_ms=12, status_code=200 if index % 3 else 503, retry_delay_seconds=0)
        for index, item in enumerate(outgoing)
    ]
    summary = await results.record_results(pool, outcomes)
    console.print(f"first attempts: {len(summary.delivered)} delivered, {len(summary.retrying)} to retry")
    retry = await claims.claim_due(pool, batch_size=100, lease_ms=30_000)
    failed = [results.AttemptResult(c.id, c.attempt, account.id, False, 30, 500, retry_delay_seconds=0) for c in retry]
    if failed:
        summary = await results.record_results(pool, failed)
        console.print(f"second attempts failed: {len(summary.settled)} dead after their last attempt, refunded")
        again = await settle(pool, failed[0].delivery_id, DeadReason.OUT_OF_RETRIES)
        console.print(f"settling one of them again: {again.outcome} (nothing added)")
    _show_balance(console, "after delivering and refunding", await accounts.get_balance(pool, account.id))

    report = await audit.audit(pool, account.id)
    audit_report.render(report, console)
    await closeout.begin_closing(pool, account.id)
    await messages.create_messages(pool, [messages.MessageRequest(account.id, "x", b"{}")], attempts_max=2)
    bulk = await closeout.bulk_settle(pool, account.id)
    closed = await closeout.close_out(pool, account.id)
    console.print(f"account deleted: bulk settle locked {bulk.locked}, refunded {bulk.refunded},"
                  f" marked dead {bulk.marked_dead}; closeout owes the customer {closed.owed_to_customer} credits")
    final = await audit.audit(pool)
    audit_report.render(final, console)
    return 0 if report.clean and final.clean else 1


def _show_balance(console: Console, title: str, balance: accounts.Balance) -> None:
    table = Table(title=title)
    table.add_column("balance")
    table.add_column("in flight")
    table.add_row(str(balance.balance), str(balance.in_flight))
    console.print(table)
