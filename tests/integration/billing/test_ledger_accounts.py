"""Accounts and top-ups against real PostgreSQL: idempotent by order id, reversals never go below zero."""

from __future__ import annotations

import pytest

from billing import accounts, ids
from billing.errors import InsufficientBalance, TopupConflict, TopupUnknown
from delivery.engine import results
from ledger_helpers import (
    add_endpoint,
    assert_audit_clean,
    balance,
    claim,
    create,
    ledger_sum,
    make_account,
    row_counts,
)


async def test_create_account_starts_active_and_empty(pool):
    """A new account is active, has a zero balance and no ledger rows, and reads back as created."""
    account = await accounts.create_account(pool, "Acme Ltd", price_per_delivery=3)
    assert (account.name, account.status, account.balance, account.price_per_delivery) == ("Acme Ltd", "active", 0, 3)
    assert await accounts.get_account(pool, account.id) == account
    assert await ledger_sum(pool, account.id) == 0
    assert await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE account_id = $1", account.id) == 0


async def test_top_up_same_order_twice_adds_once(pool):
    """The same order applied twice writes one topup:<order> entry and adds its amount once."""
    account_id = await make_account(pool)
    first = await accounts.top_up(pool, account_id, "order-1", 500)
    second = await accounts.top_up(pool, account_id, "order-1", 500)
    assert (first.applied, first.balance) == (True, 500)
    assert (second.applied, second.balance) == (False, 500)
    rows = await pool.fetch("SELECT id, kind, amount FROM ledger_entries WHERE account_id = $1", account_id)
    assert [tuple(row) for row in rows] == [(ids.topup_id("order-1"), "topup", 500)]
    assert await balance(pool, account_id) == 500
    await assert_audit_clean(pool, account_id)


async def test_top_up_same_order_other_amount_conflicts_and_writes_nothing(pool):
    """Reusing an order id with another amount raises TopupConflict and leaves ledger and balance as they were."""
    account_id = await make_account(pool)
    await accounts.top_up(pool, account_id, "order-1", 500)
    before = await row_counts(pool)
    with pytest.raises(TopupConflict, match="order-1"):
        await accounts.top_up(pool, account_id, "order-1", 600)
    assert await row_counts(pool) == before
    assert await balance(pool, account_id) == 500


async def test_top_up_order_used_by_another_account_conflicts(pool):
    """An order id already applied to one account cannot top up another (ledger ids are global)."""
    first = await make_account(pool)
    second = await make_account(pool)
    await accounts.top_up(pool, first, "shared-order", 100)
    before = await row_counts(pool)
    with pytest.raises(TopupConflict, match="another account"):
        await accounts.top_up(pool, second, "shared-order", 100)
    assert await row_counts(pool) == before
    assert (await balance(pool, first), await balance(pool, second)) == (100, 0)


async def test_reverse_top_up_takes_it_back_once(pool):
    """A reversal writes topup_reversal:<order> of -amount once; a second reversal adds nothing."""
    account_id = await make_account(pool)
    await accounts.top_up(pool, account_id, "order-1", 300)
    await accounts.top_up(pool, account_id, "order-2", 50)
    first = await accounts.reverse_top_up(pool, account_id, "order-1")
    second = await accounts.reverse_top_up(pool, account_id, "order-1")
    assert (first.applied, first.amount, first.balance) == (True, -300, 50)
    assert (second.applied, second.amount, second.balance) == (False, -300, 50)
    reversal = await pool.fetchrow(
        "SELECT amount, kind FROM ledger_entries WHERE id = $1", ids.topup_reversal_id("order-1")
    )
    assert tuple(reversal) == (-300, "topup_reversal")
    assert await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE account_id = $1", account_id) == 3
    assert await balance(pool, account_id) == 50
    await assert_audit_clean(pool, account_id)


async def test_reverse_unknown_top_up_raises_and_writes_nothing(pool):
    """Reversing an order never applied, or applied to another account, raises TopupUnknown and writes nothing."""
    account_id = await make_account(pool, balance=100)
    other = await make_account(pool)
    await accounts.top_up(pool, other, "their-order", 10)
    before = await row_counts(pool)
    with pytest.raises(TopupUnknown):
        await accounts.reverse_top_up(pool, account_id, "never-applied")
    with pytest.raises(TopupUnknown):
        await accounts.reverse_top_up(pool, account_id, "their-order")
    assert await row_counts(pool) == before
    assert (await balance(pool, account_id), await balance(pool, other)) == (100, 10)


async def test_reverse_top_up_never_takes_the_balance_below_zero(pool):
    """When credits were spent, a reversal the balance cannot cover raises InsufficientBalance and writes nothing."""
    account_id = await make_account(pool)
    await add_endpoint(pool, account_id)
    await accounts.top_up(pool, account_id, "order-1", 5)
    await create(pool, account_id)  # spends 1 of the 5 credits
    before = await row_counts(pool)
    with pytest.raises(InsufficientBalance, match="below zero"):
        await accounts.reverse_top_up(pool, account_id, "order-1")
    assert await row_counts(pool) == before
    assert await balance(pool, account_id) == 4
    assert await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE id = $1", ids.topup_reversal_id("order-1")) == 0


async def test_get_balance_counts_live_deliveries_in_flight(pool):
    """in_flight is the sum of the prices of pending and sending deliveries; delivered ones drop out."""
    account_id = await make_account(pool, balance=100, price=7)
    await add_endpoint(pool, account_id)
    await add_endpoint(pool, account_id)
    assert await accounts.get_balance(pool, account_id) == accounts.Balance(balance=100, in_flight=0)
    created = await create(pool, account_id)  # two deliveries at 7
    assert await accounts.get_balance(pool, account_id) == accounts.Balance(balance=86, in_flight=14)
    sent = await claim(pool, created.deliveries[0].id)
    assert await accounts.get_balance(pool, account_id) == accounts.Balance(balance=86, in_flight=14)
    await results.record_results(
        pool, [results.AttemptResult(sent.id, sent.attempt, account_id, True, 10, status_code=200)]
    )
    assert await accounts.get_balance(pool, account_id) == accounts.Balance(balance=86, in_flight=7)
    await assert_audit_clean(pool, account_id)
