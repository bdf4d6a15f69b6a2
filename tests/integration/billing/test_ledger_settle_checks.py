"""The settle function's own checks: a wrong charge stops it cold, attempt fencing, delivered is final."""

from __future__ import annotations

import pytest

from billing import closeout, ids
from billing.errors import BulkSettleMismatch, DeliveryNotFound, InvalidInput, LedgerMismatch
from billing.settle import DeadReason, Outcome, settle
from billing.audit import audit
from delivery.engine import claims, presend, results
from ledger_helpers import (
    add_endpoint,
    assert_audit_clean,
    balance,
    claim,
    delivery,
    entries_of,
    insert_raw_delivery,
    make_account,
    one_delivery,
    row_counts,
)


@pytest.mark.parametrize(
    ("charge", "problem"),
    [
        ("missing", "has no charge entry"),
        ("wrong amount", "is -2, expected -1"),
        # The charge is looked up in the delivery's own account (ledger ids are unique together
        # with the account): another account's charge:<id> is no charge of this delivery.
        ("other account", "has no charge entry"),
    ],
)
async def test_settle_refuses_a_delivery_whose_charge_is_wrong(pool, charge, problem):
    """A delivery written by raw SQL with a missing or wrong charge raises LedgerMismatch; it stays live and unrefunded."""
    account_id = await make_account(pool, balance=10)
    other = await make_account(pool, balance=10)
    endpoint_id = await add_endpoint(pool, account_id)
    delivery_id = await insert_raw_delivery(
        pool, account_id, endpoint_id, price=1,
        charge_amount={"missing": None, "wrong amount": -2, "other account": -1}[charge],
        charge_account_id=other if charge == "other account" else None,
    )
    entries_before = await entries_of(pool, delivery_id)
    counts_before = await row_counts(pool)
    balances_before = (await balance(pool, account_id), await balance(pool, other))

    for reason in DeadReason:
        with pytest.raises(LedgerMismatch, match=problem):
            await settle(pool, delivery_id, reason, account_id=account_id)

    row = await delivery(pool, delivery_id)
    assert (row["state"], row["dead_reason"]) == ("pending", None)
    assert await entries_of(pool, delivery_id) == entries_before
    assert ids.refund_id(delivery_id) not in entries_before
    assert await row_counts(pool) == counts_before
    assert (await balance(pool, account_id), await balance(pool, other)) == balances_before


async def test_bulk_settle_refuses_all_when_one_delivery_disagrees(pool):
    """One live delivery with a wrong charge makes bulk_settle raise with a report naming it, and settle none at all."""
    account_id = await make_account(pool, balance=10)
    endpoint_id = await add_endpoint(pool, account_id)
    good_id = await one_delivery(pool, account_id)
    bad_id = await insert_raw_delivery(pool, account_id, endpoint_id, price=1, charge_amount=-3)
    await closeout.begin_closing(pool, account_id)
    counts_before = await row_counts(pool)
    balance_before = await balance(pool, account_id)

    with pytest.raises(BulkSettleMismatch) as raised:
        await closeout.bulk_settle(pool, account_id)
    assert [(m.delivery_id, m.problem) for m in raised.value.mismatches] == [(bad_id, "charge is -3, expected -1")]
    assert await row_counts(pool) == counts_before
    assert await balance(pool, account_id) == balance_before
    for delivery_id in (good_id, bad_id):
        assert (await delivery(pool, delivery_id))["state"] == "pending"
        assert ids.refund_id(delivery_id) not in await entries_of(pool, delivery_id)


async def test_settle_quoting_an_old_attempt_is_stale(pool):
    """A settle that quotes an attempt the delivery has moved past returns STALE and changes nothing."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    delivery_id = await one_delivery(pool, account_id, attempts_max=3)
    first = await claim(pool, delivery_id)
    await results.record_results(pool, [results.AttemptResult(
        delivery_id, first.attempt, account_id, False, 1, 503, "HTTP 503", retry_delay_seconds=0.0)])
    second = await claim(pool, delivery_id)
    before = await delivery(pool, delivery_id)

    for reason in DeadReason:
        outcome = await settle(pool, delivery_id, reason, account_id=account_id, attempt=first.attempt)
        assert (outcome.outcome, outcome.amount) == (Outcome.STALE, 0)

    assert await delivery(pool, delivery_id) == before
    assert (before["state"], before["attempt"]) == ("sending", second.attempt)
    assert await entries_of(pool, delivery_id) == {ids.charge_id(delivery_id): -1}
    assert await balance(pool, account_id) == 9
    await assert_audit_clean(pool, account_id)


async def test_settle_of_a_delivered_delivery_refunds_nothing(pool):
    """Settling a delivered delivery, quoting its attempt or not, returns DELIVERED and refunds nothing."""
    account_id = await make_account(pool, balance=10, price=2)
    await add_endpoint(pool, account_id)
    delivery_id = await one_delivery(pool, account_id)
    claimed = await claim(pool, delivery_id)
    await results.record_results(pool, [results.AttemptResult(delivery_id, claimed.attempt, account_id, True, 1, 204)])

    for quoted in (claimed.attempt, None):
        for reason in DeadReason:
            outcome = await settle(pool, delivery_id, reason, account_id=account_id, attempt=quoted)
            assert (outcome.outcome, outcome.amount) == (Outcome.DELIVERED, 0)

    row = await delivery(pool, delivery_id)
    assert (row["state"], row["dead_reason"]) == ("delivered", None)
    assert await entries_of(pool, delivery_id) == {ids.charge_id(delivery_id): -2}
    assert await balance(pool, account_id) == 8
    await assert_audit_clean(pool, account_id)


async def test_settle_of_a_pending_delivery_quoting_its_attempt_refunds(pool):
    """Control for fencing: quoting the attempt the delivery is on (0, never claimed) settles it."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    delivery_id = await one_delivery(pool, account_id)
    outcome = await settle(pool, delivery_id, DeadReason.ENDPOINT_DELETED, account_id=account_id, attempt=0)
    assert (outcome.outcome, outcome.amount) == (Outcome.REFUNDED, 1)
    assert await balance(pool, account_id) == 10
    await assert_audit_clean(pool, account_id)


async def test_settle_refuses_unknown_delivery_and_unknown_reason(pool):
    """An unknown delivery raises DeliveryNotFound; an unknown reason raises InvalidInput; neither writes anything."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    delivery_id = await one_delivery(pool, account_id)
    before = await row_counts(pool)
    with pytest.raises(DeliveryNotFound):
        await settle(pool, ids.new_id(), DeadReason.OUT_OF_RETRIES, account_id=account_id)
    with pytest.raises(InvalidInput, match="unknown dead reason"):
        await settle(pool, delivery_id, "gave_up", account_id=account_id)
    assert await row_counts(pool) == before
    assert (await delivery(pool, delivery_id))["state"] == "pending"


async def _broken_exhausted_delivery(pool, account_id, endpoint_id):
    """BYPASSES THE APP: a delivery with a wrong charge, at its attempt limit, due long ago (first in every sweep)."""
    delivery_id = await insert_raw_delivery(pool, account_id, endpoint_id, price=1, charge_amount=-5)
    await pool.execute(
        "UPDATE deliveries SET attempt = attempts_max, next_attempt_at = now() - interval '1 hour' WHERE id = $1",
        delivery_id,
    )
    return delivery_id


async def test_one_broken_delivery_does_not_stop_settle_exhausted(pool):
    """A delivery whose charge is wrong stays stuck (and the audit names it), but the sweep still settles the healthy ones."""
    account_id = await make_account(pool, balance=10)
    endpoint_id = await add_endpoint(pool, account_id)
    broken_id = await _broken_exhausted_delivery(pool, account_id, endpoint_id)
    healthy_id = await one_delivery(pool, account_id, attempts_max=1)
    await claim(pool, healthy_id)
    await pool.execute("UPDATE deliveries SET leased_until = now() - interval '1 second' WHERE id = $1", healthy_id)
    await results.expire_leases(pool, batch_size=10, delay_seconds=lambda attempt: 0.0)

    assert await claims.settle_exhausted(pool, batch_size=10) == 1

    assert (await delivery(pool, healthy_id))["state"] == "dead"
    assert ids.refund_id(healthy_id) in await entries_of(pool, healthy_id)
    assert (await delivery(pool, broken_id))["state"] == "pending"
    assert await entries_of(pool, broken_id) == {ids.charge_id(broken_id): -5}
    report = await audit(pool, account_id)
    assert {(v.invariant, v.delivery_id) for v in report.violations} >= {("I1", broken_id)}
    assert all(v.delivery_id in (broken_id, None) for v in report.violations)


async def test_a_full_batch_of_broken_deliveries_does_not_hide_a_healthy_one(pool):
    """Broken exhausted deliveries (older, so first in line) never fill settle_exhausted's batch: with a
    batch of one, the healthy delivery behind them is still settled on the first sweep."""
    account_id = await make_account(pool, balance=100)
    endpoint_id = await add_endpoint(pool, account_id)
    broken = [await _broken_exhausted_delivery(pool, account_id, endpoint_id) for _ in range(3)]
    healthy_id = await one_delivery(pool, account_id, attempts_max=1)
    await claim(pool, healthy_id)
    await pool.execute("UPDATE deliveries SET leased_until = now() - interval '1 second' WHERE id = $1", healthy_id)
    await results.expire_leases(pool, batch_size=10, delay_seconds=lambda attempt: 0.0)

    assert await claims.settle_exhausted(pool, batch_size=1) == 1

    assert (await delivery(pool, healthy_id))["state"] == "dead"
    assert [(await delivery(pool, broken_id))["state"] for broken_id in broken] == ["pending"] * 3


async def test_one_broken_delivery_does_not_stop_the_presend_check_of_its_batch(pool):
    """In one claimed batch on a closing account, the healthy delivery is settled although its neighbour's charge is wrong."""
    account_id = await make_account(pool, balance=10)
    endpoint_id = await add_endpoint(pool, account_id)
    broken_id = await insert_raw_delivery(pool, account_id, endpoint_id, price=1, charge_amount=-5)
    healthy_id = await one_delivery(pool, account_id)
    claimed = await claims.claim_ids(pool, [claims.DeliveryKey(account_id, broken_id),
                                               claims.DeliveryKey(account_id, healthy_id)], lease_ms=60_000)
    assert len(claimed) == 2
    await closeout.begin_closing(pool, account_id)

    outgoing, settled = await presend.load_for_send(pool, claimed)

    assert outgoing == []  # the broken one is neither sent nor settled: it stays stuck
    assert [(s.delivery_id, s.outcome) for s in settled] == [(healthy_id, Outcome.REFUNDED)]
    assert (await delivery(pool, broken_id))["state"] == "sending"
    assert ids.refund_id(broken_id) not in await entries_of(pool, broken_id)


async def test_one_broken_delivery_does_not_stop_the_rest_of_a_result_batch(pool):
    """A last-attempt failure whose charge is wrong stays stuck; the reclaim of another result in the batch still happens."""
    account_id = await make_account(pool, balance=10)
    endpoint_id = await add_endpoint(pool, account_id)
    broken_id = await insert_raw_delivery(pool, account_id, endpoint_id, price=1, charge_amount=-5)
    await pool.execute("UPDATE deliveries SET attempts_max = 1 WHERE id = $1", broken_id)
    refunded_id = await one_delivery(pool, account_id)
    late = await claim(pool, refunded_id)
    await settle(pool, refunded_id, DeadReason.ENDPOINT_DISABLED, account_id=account_id, attempt=late.attempt)
    (broken,) = await claims.claim_ids(pool, [claims.DeliveryKey(account_id, broken_id)], lease_ms=60_000)

    summary = await results.record_results(pool, [
        results.AttemptResult(broken_id, broken.attempt, account_id, False, 1, 500, "HTTP 500"),
        results.AttemptResult(refunded_id, late.attempt, account_id, True, 1, 200),
    ])

    assert summary.reclaimed == [refunded_id]
    assert (await delivery(pool, refunded_id))["state"] == "delivered"
    assert (await delivery(pool, broken_id))["state"] == "sending"
    assert ids.refund_id(broken_id) not in await entries_of(pool, broken_id)
