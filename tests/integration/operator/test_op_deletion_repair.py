"""A ledger corrupted behind the application's back stops a deletion (waiting_repair, named in the
report, nothing settled); the repair path writes adjustments; the resumed deletion finishes clean."""

from __future__ import annotations

import asyncio

import pytest
from typer.testing import CliRunner

from billing import adjustments
from billing.audit import audit
from billing.errors import BalanceLimitExceeded
from delivery.operations import deletion, repair
from delivery.cli.main import app
from ledger_helpers import execute_unchecked
from operator_helpers import (add_endpoint, assert_audit_clean, balance_and_ledger, create_many, make_account,
                              raw_delivery, refunds_per_delivery)


async def _corrupted_account(pool):
    account_id = await make_account(pool, balance=1000)
    endpoint_id = await add_endpoint(pool, account_id)
    healthy = await create_many(pool, account_id, endpoint_id, 10)
    broken = {
        await raw_delivery(pool, account_id, endpoint_id, charge=-2): "charge is -2, expected -5",
        await raw_delivery(pool, account_id, endpoint_id, charge=None): "no charge entry",
        await raw_delivery(pool, account_id, endpoint_id, charge=-5, refund=5): "already refunded while still live",
    }
    return account_id, healthy, broken


async def test_mismatch_waits_for_repair_then_finishes(pool, database_url, monkeypatch):
    """Wrong-amount charge, missing charge and refund-on-live stop the deletion with every one named;
    `accounts repair` shows and writes nothing without --apply; with --apply --yes the adjustments go in,
    the resumed deletion refunds the healthy deliveries once, and the audit is clean."""
    account_id, healthy, broken = await _corrupted_account(pool)
    balance_before = (await balance_and_ledger(pool, account_id))[0]

    state = await deletion.run_deletion(pool, account_id)
    assert state.status == "waiting_repair"
    named = {item["delivery_id"]: item["problem"] for item in state.report["mismatches"]}
    assert named == {str(delivery_id): problem for delivery_id, problem in broken.items()}
    assert await refunds_per_delivery(pool, account_id) == {"pending:0": 12, "pending:1": 1}  # nothing settled
    assert (await balance_and_ledger(pool, account_id))[0] == balance_before

    monkeypatch.setenv("DATABASE_URL", database_url)
    runner = CliRunner()
    shown = await asyncio.to_thread(runner.invoke, app, ["accounts", "repair", str(account_id)])
    assert shown.exit_code == 0, shown.output
    assert "balance change +2 credits" in shown.output and (await balance_and_ledger(pool, account_id))[0] == balance_before
    waiting = await asyncio.to_thread(runner.invoke, app, ["accounts", "delete", str(account_id), "--inline", "--yes"])
    assert waiting.exit_code == 3, waiting.output

    applied = await asyncio.to_thread(runner.invoke, app, ["accounts", "repair", str(account_id), "--apply", "--yes"])
    assert applied.exit_code == 0, applied.output
    ledger = dict(await pool.fetch("SELECT id, amount FROM ledger_entries WHERE kind = 'adjustment'"))
    wrong, missing, refunded = broken
    assert ledger == {adjustments.adjustment_id(wrong, "charge_difference"): -3,
                      adjustments.adjustment_id(missing, "missing_charge"): -5,
                      adjustments.adjustment_id(refunded, "refund_on_live"): 0}
    await assert_audit_clean(pool)

    done = await asyncio.to_thread(runner.invoke, app, ["accounts", "delete", str(account_id), "--inline", "--yes"])
    assert done.exit_code == 0, done.output
    state = await deletion.read_deletion(pool, account_id)
    assert state.status == "done" and state.report["mismatches"] == []
    assert state.report["refunded"] == len(healthy)
    assert await refunds_per_delivery(pool, account_id) == {"dead:1": 13}
    assert await balance_and_ledger(pool, account_id) == (0, 0, "deleted")
    await assert_audit_clean(pool)


async def test_repair_refuses_when_the_ledger_changed_and_leaves_unrepairable_rows(pool):
    """Applying a plan that no longer matches writes nothing (RepairChanged); a charge on another account
    is shown as needing a person, gets no adjustment, and the deletion keeps waiting."""
    account_id, _, broken = await _corrupted_account(pool)
    other = await make_account(pool, balance=100)
    endpoint_id = await add_endpoint(pool, account_id)
    foreign = await raw_delivery(pool, account_id, endpoint_id, charge=None)
    async with pool.acquire() as connection, connection.transaction():
        # The database refuses a charge on another account than its delivery's (billing.references).
        await execute_unchecked(
            connection, "ledger_entries",
            "INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount) VALUES ($1, $2, $3, 'charge', -5)",
            f"charge:{foreign}", other, foreign)
    await pool.execute("UPDATE accounts SET balance = balance - 5 WHERE id = $1", other)
    assert (await deletion.run_deletion(pool, account_id)).status == "waiting_repair"

    plan = await repair.plan(pool, account_id)
    assert [r.delivery_id for r in plan.needs_a_person] == [foreign] and len(plan.repairable) == 3
    stale = repair.RepairPlan(account_id, plan.deletion, plan.repairs[:-1])
    with pytest.raises(adjustments.RepairChanged):
        await repair.apply(pool, stale)
    assert await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE kind = 'adjustment'") == 0

    applied = await repair.apply(pool, plan)
    assert applied.repaired == 3
    state = await deletion.run_deletion(pool, account_id)
    assert state.status == "waiting_repair"
    assert [item["delivery_id"] for item in state.report["mismatches"]] == [str(foreign)]
    violations = (await audit(pool)).violations
    assert {v.delivery_id for v in violations} == {foreign}


async def test_a_repair_that_would_take_the_balance_past_bigint_is_refused_and_writes_nothing(pool):
    """A charge of -2**62 written behind the application's back without its balance change: the
    correction refunds it all, which would pass the largest balance; refused, nothing written."""
    account_id = await make_account(pool, balance=1)
    endpoint_id = await add_endpoint(pool, account_id)
    delivery_id = await raw_delivery(pool, account_id, endpoint_id, charge=-(2**62))
    await pool.execute("UPDATE accounts SET balance = $2 WHERE id = $1", account_id, 2**63 - 10)  # the cache lies
    assert (await deletion.run_deletion(pool, account_id)).status == "waiting_repair"
    plan = await repair.plan(pool, account_id)
    assert [r.delivery_id for r in plan.repairable] == [delivery_id]
    with pytest.raises(BalanceLimitExceeded, match="nothing was written"):
        await repair.apply(pool, plan)
    assert await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE kind IN ('adjustment', 'refund')") == 0
    assert await pool.fetchval("SELECT state FROM deliveries WHERE id = $1", delivery_id) == "pending"
    assert await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id) == 2**63 - 10
