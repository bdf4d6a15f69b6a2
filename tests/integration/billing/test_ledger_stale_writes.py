"""Stale results change nothing, except the one reclaim: only after a refund, at most once, never on a closed account."""

from __future__ import annotations

import asyncio

import pytest

from billing import accounts, closeout, ids
from billing.audit import audit
from billing.settle import DeadReason, Outcome, reclaim, settle
from delivery.engine import claims, presend, results
from ledger_helpers import (
    add_endpoint,
    assert_audit_clean,
    balance,
    claim,
    delivery,
    entries_of,
    expire_lease,
    make_account,
    one_delivery,
    order_id,
)


def _result(claimed, account_id, *, success: bool, attempt: int | None = None):
    return results.AttemptResult(
        claimed.id, claimed.attempt if attempt is None else attempt, claimed.account_id, success, 12,
        status_code=200 if success else 500, error=None if success else "HTTP 500", retry_delay_seconds=0.0,
    )


async def _attempt_rows(pool, delivery_id):
    rows = await pool.fetch(
        "SELECT attempt, status_code, error, stale FROM delivery_attempts WHERE delivery_id = $1 ORDER BY attempt",
        delivery_id,
    )
    return [tuple(row) for row in rows]


async def _dead_and_refunded_by_exhaustion(pool, account_id):
    """A delivery whose only attempt's lease expired and which was then settled attempts_exhausted."""
    delivery_id = await one_delivery(pool, account_id, attempts_max=1)
    claimed = await claim(pool, delivery_id)
    await expire_lease(pool, delivery_id)
    await results.expire_leases(pool, batch_size=10, delay_seconds=lambda attempt: 0.0)
    assert await claims.settle_exhausted(pool, batch_size=10) == 1
    assert (await delivery(pool, delivery_id))["state"] == "dead"
    return claimed


async def test_a_failure_for_an_old_attempt_changes_nothing(pool):
    """A failure quoting attempt 1 while the delivery is sending attempt 2 leaves the delivery untouched."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    delivery_id = await one_delivery(pool, account_id, attempts_max=3)
    first = await claim(pool, delivery_id)
    await results.record_results(pool, [_result(first, account_id, success=False)])
    await claim(pool, delivery_id)
    before = await delivery(pool, delivery_id)
    attempts_before = await _attempt_rows(pool, delivery_id)

    summary = await results.record_results(pool, [_result(first, account_id, success=False)])

    assert (summary.stale, summary.delivered, summary.retrying, summary.settled, summary.reclaimed) == (
        [delivery_id], [], [], [], [])
    after = await delivery(pool, delivery_id)
    assert after == before
    assert (after["state"], after["attempt"]) == ("sending", 2)
    assert await _attempt_rows(pool, delivery_id) == attempts_before
    assert await entries_of(pool, delivery_id) == {ids.charge_id(delivery_id): -1}
    assert await balance(pool, account_id) == 9
    await assert_audit_clean(pool, account_id)


async def test_a_late_success_after_lease_expiry_on_the_same_attempt_delivers(pool):
    """A slow success for an expired lease, while the delivery waits pending on that same attempt (no
    retry claimed yet), marks it delivered: it did arrive, so resending would only duplicate it and a
    later death would refund a delivery that arrived. The charge stays; nothing is refunded or reclaimed."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    delivery_id = await one_delivery(pool, account_id, attempts_max=3)
    claimed = await claim(pool, delivery_id)
    await expire_lease(pool, delivery_id)
    await results.expire_leases(pool, batch_size=10, delay_seconds=lambda attempt: 30.0)
    before = await delivery(pool, delivery_id)
    assert (before["state"], before["attempt"]) == ("pending", 1)

    summary = await results.record_results(pool, [_result(claimed, account_id, success=True)])

    assert (summary.delivered, summary.stale, summary.reclaimed) == ([delivery_id], [], [])
    after = await delivery(pool, delivery_id)
    assert (after["state"], after["attempt"], after["leased_until"]) == ("delivered", 1, None)
    assert await entries_of(pool, delivery_id) == {ids.charge_id(delivery_id): -1}
    # The lease-expiry placeholder is replaced by the real result, which was applied (not stale).
    assert await _attempt_rows(pool, delivery_id) == [(1, 200, None, False)]
    assert (await reclaim(pool, delivery_id, account_id=account_id)).outcome == Outcome.NOT_RECLAIMED
    await assert_audit_clean(pool, account_id)


async def test_a_late_success_after_a_retry_was_claimed_delivers_and_fences_the_retry(pool):
    """Attempt 1's late success while attempt 2 is on the wire: the webhook arrived, so the delivery
    is delivered and charged once; attempt 2's failure then matches nothing, and nothing is refunded
    when attempt 2 was the last (before, it died out_of_retries and refunded a delivery that arrived)."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    delivery_id = await one_delivery(pool, account_id, attempts_max=2)
    claimed = await claim(pool, delivery_id)
    await expire_lease(pool, delivery_id)
    await results.expire_leases(pool, batch_size=10, delay_seconds=lambda attempt: 0.0)
    retry = await claim(pool, delivery_id)
    before = await delivery(pool, delivery_id)
    assert (before["state"], before["attempt"]) == ("sending", 2)

    summary = await results.record_results(pool, [_result(claimed, account_id, success=True)])

    assert (summary.delivered, summary.stale, summary.reclaimed) == ([delivery_id], [], [])
    after = await delivery(pool, delivery_id)
    assert (after["state"], after["attempt"], after["leased_until"]) == ("delivered", 2, None)
    assert await _attempt_rows(pool, delivery_id) == [(1, 200, None, False)]

    summary = await results.record_results(pool, [_result(retry, account_id, success=False)])

    assert (summary.stale, summary.delivered, summary.retrying, summary.settled) == ([delivery_id], [], [], [])
    assert (await delivery(pool, delivery_id))["state"] == "delivered"
    assert await _attempt_rows(pool, delivery_id) == [(1, 200, None, False), (2, 500, "HTTP 500", True)]
    assert await entries_of(pool, delivery_id) == {ids.charge_id(delivery_id): -1}
    assert await balance(pool, account_id) == 9
    await assert_audit_clean(pool, account_id)


async def test_a_stale_success_on_a_refunded_delivery_reclaims_once(pool):
    """A success that arrives after the delivery died and was refunded reclaims once: delivered, net -price."""
    account_id = await make_account(pool, balance=10, price=3)
    await add_endpoint(pool, account_id)
    claimed = await _dead_and_refunded_by_exhaustion(pool, account_id)
    delivery_id = claimed.id
    assert await balance(pool, account_id) == 10

    summary = await results.record_results(pool, [_result(claimed, account_id, success=True)])

    assert (summary.stale, summary.reclaimed) == ([delivery_id], [delivery_id])
    row = await delivery(pool, delivery_id)
    assert (row["state"], row["leased_until"]) == ("delivered", None)
    assert await entries_of(pool, delivery_id) == {
        ids.charge_id(delivery_id): -3, ids.refund_id(delivery_id): 3, ids.reclaim_id(delivery_id): -3}
    assert await balance(pool, account_id) == 7
    await assert_audit_clean(pool, account_id)

    # The same success again, and a direct reclaim, add nothing.
    summary = await results.record_results(pool, [_result(claimed, account_id, success=True)])
    assert (summary.stale, summary.reclaimed) == ([delivery_id], [])
    assert (await reclaim(pool, delivery_id, account_id=account_id)).outcome == Outcome.NOT_RECLAIMED
    assert (await settle(pool, delivery_id, DeadReason.OUT_OF_RETRIES, account_id=account_id)).outcome == Outcome.DELIVERED
    assert len(await entries_of(pool, delivery_id)) == 3
    assert await balance(pool, account_id) == 7
    await assert_audit_clean(pool, account_id)


async def test_reclaim_may_take_the_balance_below_zero(pool):
    """A reclaim is the one write allowed below zero: the credit was refunded and spent, then the delivery arrived."""
    account_id = await make_account(pool, balance=1)
    await add_endpoint(pool, account_id)
    claimed = await _dead_and_refunded_by_exhaustion(pool, account_id)
    await one_delivery(pool, account_id)  # spends the refunded credit
    assert await balance(pool, account_id) == 0

    summary = await results.record_results(pool, [_result(claimed, account_id, success=True)])

    assert summary.reclaimed == [claimed.id]
    assert await balance(pool, account_id) == -1
    assert (await accounts.get_balance(pool, account_id)).balance == -1
    await assert_audit_clean(pool, account_id)  # I7 is about charges, and no charge went below zero


async def test_a_stale_success_after_a_presend_settle_reclaims(pool):
    """A worker that sent although the pre-send check settled the delivery (endpoint disabled) gets it paid for once."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    delivery_id = await one_delivery(pool, account_id)
    claimed = await claim(pool, delivery_id)
    await pool.execute("UPDATE endpoints SET enabled = false WHERE account_id = $1", account_id)
    await presend.load_for_send(pool, [claimed])
    assert await balance(pool, account_id) == 10

    summary = await results.record_results(pool, [_result(claimed, account_id, success=True)])

    assert summary.reclaimed == [delivery_id]
    assert (await delivery(pool, delivery_id))["state"] == "delivered"
    assert await balance(pool, account_id) == 9
    assert await _attempt_rows(pool, delivery_id) == [(1, 200, None, True)]
    await assert_audit_clean(pool, account_id)


async def test_a_stale_success_on_a_never_refunded_delivery_does_not_reclaim(pool):
    """Without a refund there is nothing to reclaim: live or delivered deliveries get no reclaim entry."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    live_id = await one_delivery(pool, account_id)
    delivered_id = await one_delivery(pool, account_id)
    done = await claim(pool, delivered_id)
    await results.record_results(pool, [_result(done, account_id, success=True)])

    summary = await results.record_results(pool, [_result(done, account_id, success=True)])

    assert (summary.stale, summary.reclaimed) == ([delivered_id], [])
    for delivery_id in (live_id, delivered_id):
        assert (await reclaim(pool, delivery_id, account_id=account_id)).outcome == Outcome.NOT_RECLAIMED
        assert ids.reclaim_id(delivery_id) not in await entries_of(pool, delivery_id)
    assert await balance(pool, account_id) == 8
    await assert_audit_clean(pool, account_id)


@pytest.mark.parametrize("status", ["closing", "deleted"])
async def test_a_stale_success_on_a_closed_account_is_a_notice_not_a_reclaim(pool, status):
    """After an account started closing, a late success reclaims nothing; the audit lists it as a notice, still clean."""
    account_id = await make_account(pool, balance=10, price=2)
    await add_endpoint(pool, account_id)
    delivery_id = await one_delivery(pool, account_id)
    claimed = await claim(pool, delivery_id)
    await closeout.begin_closing(pool, account_id)
    if status == "closing":
        (settled,) = (await presend.load_for_send(pool, [claimed]))[1]
        assert settled.outcome == Outcome.REFUNDED
    else:
        assert (await closeout.bulk_settle(pool, account_id)).refunded == 1
        await closeout.close_out(pool, account_id)
    balance_before = await balance(pool, account_id)

    summary = await results.record_results(pool, [_result(claimed, account_id, success=True)])

    assert (summary.stale, summary.reclaimed) == ([delivery_id], [])
    assert (await delivery(pool, delivery_id))["state"] == "dead"
    assert ids.reclaim_id(delivery_id) not in await entries_of(pool, delivery_id)
    assert await balance(pool, account_id) == balance_before
    report = await audit(pool, account_id)
    assert report.clean, report.to_json()
    assert [(n.invariant, n.account_id, n.delivery_id) for n in report.notices] == [
        ("notice", account_id, delivery_id)]
    assert status in report.notices[0].detail


async def test_top_up_after_reclaim_below_zero_restores_a_usable_balance(pool):
    """After a reclaim took the balance to -1, a top-up of 3 leaves 2, and the next charge is judged against that."""
    account_id = await make_account(pool, balance=1)
    await add_endpoint(pool, account_id)
    claimed = await _dead_and_refunded_by_exhaustion(pool, account_id)
    await one_delivery(pool, account_id)
    await results.record_results(pool, [_result(claimed, account_id, success=True)])
    await accounts.top_up(pool, account_id, order_id(account_id), 3)
    assert await balance(pool, account_id) == 2
    await one_delivery(pool, account_id)
    await one_delivery(pool, account_id)
    assert await balance(pool, account_id) == 0
    await assert_audit_clean(pool, account_id)


async def test_closing_an_account_that_a_reclaim_took_below_zero(pool):
    """A balance of -1 after a reclaim closes out with a +1 entry: the customer owes 1, the ledger ends at 0, audit clean."""
    account_id = await make_account(pool, balance=1)
    await add_endpoint(pool, account_id)
    claimed = await _dead_and_refunded_by_exhaustion(pool, account_id)
    spent = await claim(pool, await one_delivery(pool, account_id))
    await results.record_results(pool, [_result(spent, account_id, success=True)])
    await results.record_results(pool, [_result(claimed, account_id, success=True)])
    assert await balance(pool, account_id) == -1
    await closeout.begin_closing(pool, account_id)
    assert (await closeout.bulk_settle(pool, account_id)).refunded == 0
    closed = await closeout.close_out(pool, account_id)
    assert (closed.amount, closed.owed_to_customer) == (1, -1)
    assert await balance(pool, account_id) == 0
    await assert_audit_clean(pool, account_id)


async def test_a_reclaim_lost_after_its_result_was_recorded_is_made_by_the_sweep(pool):
    """record_results reclaims after its transaction commits; killed in between, the late 2xx is
    recorded and the refund stands. The audit calls that a violation once it is minutes old, and
    the sweep's reclaim_late_successes makes the reclaim, once."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    claimed = await _dead_and_refunded_by_exhaustion(pool, account_id)
    other = await _dead_and_refunded_by_exhaustion(pool, account_id)  # dead, and no 2xx came back
    # What the recording transaction committed before the worker died: the 2xx, fenced off (stale).
    await pool.execute(
        "UPDATE delivery_attempts SET status_code = 200, error = NULL, stale = true,"
        " finished_at = now() - interval '10 minutes' WHERE delivery_id = $1 AND attempt = $2", claimed.id, claimed.attempt)
    assert await _attempt_rows(pool, claimed.id) == [(1, 200, None, True)]
    report = await audit(pool, account_id)
    assert [(v.invariant, v.delivery_id) for v in report.violations] == [("I2", claimed.id)]

    assert await results.reclaim_late_successes(pool, batch_size=10) == [claimed.id]

    assert (await delivery(pool, claimed.id))["state"] == "delivered"
    assert (await delivery(pool, other.id))["state"] == "dead"
    assert await entries_of(pool, claimed.id) == {
        ids.charge_id(claimed.id): -1, ids.refund_id(claimed.id): 1, ids.reclaim_id(claimed.id): -1}
    assert await balance(pool, account_id) == 9
    await assert_audit_clean(pool, account_id)
    assert await results.reclaim_late_successes(pool, batch_size=10) == []


@pytest.mark.parametrize("round_number", range(20))
async def test_the_sweep_and_the_recording_of_a_late_2xx_reclaim_once_when_they_race(pool, round_number):
    """record_results reclaims a late 2xx while the sweep's reclaim_late_successes finds the same
    answer: run at once, on separate connections, the refund is taken back exactly once."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    claimed = await _dead_and_refunded_by_exhaustion(pool, account_id)
    await pool.execute(
        "UPDATE delivery_attempts SET status_code = 200, error = NULL, stale = true"
        " WHERE delivery_id = $1 AND attempt = $2", claimed.id, claimed.attempt)

    summary, swept = await asyncio.gather(
        results.record_results(pool, [_result(claimed, account_id, success=True)]),
        results.reclaim_late_successes(pool, batch_size=10))

    assert sorted([*summary.reclaimed, *swept]) == [claimed.id]
    assert await entries_of(pool, claimed.id) == {
        ids.charge_id(claimed.id): -1, ids.refund_id(claimed.id): 1, ids.reclaim_id(claimed.id): -1}
    assert await balance(pool, account_id) == 9
    await assert_audit_clean(pool, account_id)
