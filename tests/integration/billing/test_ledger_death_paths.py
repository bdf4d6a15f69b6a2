"""Every death path, through its real caller, leaves exactly one refund; running it again adds nothing."""

from __future__ import annotations

import pytest

from billing import closeout, ids
from billing.errors import AccountNotClosable
from billing.settle import DeadReason, Outcome, settle
from delivery.engine import claims
from delivery.store import endpoints
from delivery.engine import presend, results
from ledger_helpers import (
    add_endpoint,
    assert_audit_clean,
    assert_settled_once,
    balance,
    claim,
    delivery,
    expire_lease,
    make_account,
    one_delivery,
)


def _failure(claimed, account_id):
    return results.AttemptResult(claimed.id, claimed.attempt, account_id, False, 5, status_code=500,
                                 error="HTTP 500", retry_delay_seconds=0.0)


async def _settle_again_adds_nothing(pool, delivery_id, reason, attempt):
    """Death path 6: the same settle again, quoting the attempt and not, finds the refund and adds nothing."""
    account_id = (await pool.fetchrow("SELECT account_id FROM deliveries WHERE id = $1", delivery_id))["account_id"]
    balance_before = await balance(pool, account_id)
    for quoted in (attempt, None):
        again = await settle(pool, delivery_id, reason, account_id=account_id, attempt=quoted)
        assert (again.outcome, again.amount) == (Outcome.ALREADY_SETTLED, 0)
    await assert_settled_once(pool, delivery_id, reason)
    assert await balance(pool, account_id) == balance_before
    await assert_audit_clean(pool, account_id)


async def test_out_of_retries_refunds_once(pool):
    """A failure on the last attempt (record_results) settles out_of_retries: dead, one refund, balance restored."""
    account_id = await make_account(pool, balance=10, price=2)
    await add_endpoint(pool, account_id)
    delivery_id = await one_delivery(pool, account_id, attempts_max=2)
    first = await claim(pool, delivery_id)
    summary = await results.record_results(pool, [_failure(first, account_id)])
    assert summary.retrying == [delivery_id] and summary.settled == []
    last = await claim(pool, delivery_id)
    assert last.attempt == 2
    summary = await results.record_results(pool, [_failure(last, account_id)])
    assert summary.settled == [delivery_id]
    await assert_settled_once(pool, delivery_id, "out_of_retries")
    assert await balance(pool, account_id) == 10

    # The same result reported again is stale and changes nothing.
    summary = await results.record_results(pool, [_failure(last, account_id)])
    assert (summary.settled, summary.stale) == ([], [delivery_id])
    await _settle_again_adds_nothing(pool, delivery_id, DeadReason.OUT_OF_RETRIES, last.attempt)


@pytest.mark.parametrize(
    ("reason", "break_it"),
    [
        ("endpoint_deleted", "UPDATE endpoints SET deleted_at = now() WHERE account_id = $1"),
        ("endpoint_disabled", "UPDATE endpoints SET enabled = false, disabled_reason = 'test' WHERE account_id = $1"),
        ("account_closed", None),  # begin_closing: the account turns closing
    ],
)
async def test_presend_check_refunds_once(pool, reason, break_it):
    """The pre-send check settles a claimed delivery whose endpoint went away or whose account is closing, once."""
    account_id = await make_account(pool, balance=10, price=3)
    await add_endpoint(pool, account_id)
    delivery_id = await one_delivery(pool, account_id)
    claimed = await claim(pool, delivery_id)
    if break_it is None:
        assert await closeout.begin_closing(pool, account_id) == "closing"
    else:
        await pool.execute(break_it, account_id)

    outgoing, settled = await presend.load_for_send(pool, [claimed])
    assert outgoing == []
    assert [(s.delivery_id, s.outcome, s.amount) for s in settled] == [(delivery_id, Outcome.REFUNDED, 3)]
    await assert_settled_once(pool, delivery_id, reason)
    assert await balance(pool, account_id) == 10

    outgoing, settled = await presend.load_for_send(pool, [claimed])
    assert outgoing == [] and [s.outcome for s in settled] == [Outcome.ALREADY_SETTLED]
    await _settle_again_adds_nothing(pool, delivery_id, DeadReason(reason), claimed.attempt)


async def test_presend_check_passes_a_healthy_delivery(pool):
    """Control for the pre-send paths: with account and endpoint fine, nothing is settled and the delivery stays sending."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    delivery_id = await one_delivery(pool, account_id)
    claimed = await claim(pool, delivery_id)
    outgoing, settled = await presend.load_for_send(pool, [claimed])
    assert settled == [] and [o.claimed.id for o in outgoing] == [delivery_id]
    assert outgoing[0].payload == b'{"n": 1}'
    assert set(await pool.fetchval("SELECT array_agg(id) FROM ledger_entries WHERE delivery_id = $1", delivery_id)) == {
        ids.charge_id(delivery_id)}


async def test_attempts_exhausted_refunds_once(pool):
    """An expired lease on the last attempt goes back to pending at the limit; settle_exhausted settles it, once."""
    account_id = await make_account(pool, balance=10, price=4)
    await add_endpoint(pool, account_id)
    delivery_id = await one_delivery(pool, account_id, attempts_max=1)
    claimed = await claim(pool, delivery_id)
    await expire_lease(pool, delivery_id)
    expired = await results.expire_leases(pool, batch_size=10, delay_seconds=lambda attempt: 0.0)
    assert expired == [delivery_id]
    row = await pool.fetchrow("SELECT state, attempt FROM deliveries WHERE id = $1", delivery_id)
    assert tuple(row) == ("pending", 1)
    # A claim does not take a delivery that used its last attempt.
    assert await claims.claim_ids(pool, [claims.DeliveryKey(account_id, delivery_id)], lease_ms=60_000) == []

    assert await claims.settle_exhausted(pool, batch_size=10) == 1
    await assert_settled_once(pool, delivery_id, "attempts_exhausted")
    assert await balance(pool, account_id) == 10

    assert await claims.settle_exhausted(pool, batch_size=10) == 0
    await _settle_again_adds_nothing(pool, delivery_id, DeadReason.ATTEMPTS_EXHAUSTED, claimed.attempt)


async def test_an_expired_last_attempt_is_settled_at_once_whatever_the_backoff(pool):
    """The backoff after a failed attempt is for the next one; after the last there is none, so
    the refund does not wait for it (it waited the schedule's last delay, 10 h by default)."""
    account_id = await make_account(pool, balance=10, price=4)
    await add_endpoint(pool, account_id)
    last, earlier = await one_delivery(pool, account_id, attempts_max=1), await one_delivery(pool, account_id, attempts_max=2)
    for delivery_id in (last, earlier):
        await claim(pool, delivery_id)
        await expire_lease(pool, delivery_id)
    assert sorted(await results.expire_leases(pool, batch_size=10, delay_seconds=lambda attempt: 36_000.0)) == sorted([last, earlier])
    due = dict(await pool.fetch("SELECT id, next_attempt_at <= now() FROM deliveries WHERE id = ANY($1)", [last, earlier]))
    assert due == {last: True, earlier: False}
    assert await claims.settle_exhausted(pool, batch_size=10) == 1
    await assert_settled_once(pool, last, "attempts_exhausted")
    assert (await pool.fetchrow("SELECT state, attempt FROM deliveries WHERE id = $1", earlier))["state"] == "pending"


async def test_account_deleted_refunds_every_live_delivery_once(pool):
    """begin_closing, bulk_settle, close_out: every live delivery refunded once, delivered ones untouched, balance closed out."""
    account_id = await make_account(pool, balance=20, price=2)
    await add_endpoint(pool, account_id)
    pending_id = await one_delivery(pool, account_id)
    sending_id = await one_delivery(pool, account_id)
    delivered_id = await one_delivery(pool, account_id)
    sending = await claim(pool, sending_id)
    done = await claim(pool, delivered_id)
    await results.record_results(pool, [results.AttemptResult(delivered_id, done.attempt, account_id, True, 1, 200)])
    assert await balance(pool, account_id) == 14

    assert await closeout.begin_closing(pool, account_id) == "closing"
    settled = await closeout.bulk_settle(pool, account_id)
    assert settled == closeout.BulkSettled(locked=2, refunded=2, marked_dead=2, refunded_amount=4)
    assert await balance(pool, account_id) == 18
    again = await closeout.bulk_settle(pool, account_id)
    assert again == closeout.BulkSettled(0, 0, 0, 0)
    for delivery_id in (pending_id, sending_id):
        await assert_settled_once(pool, delivery_id, "account_deleted")
    assert await pool.fetchval("SELECT state FROM deliveries WHERE id = $1", delivered_id) == "delivered"
    await assert_audit_clean(pool, account_id)

    closed = await closeout.close_out(pool, account_id)
    assert (closed.entry_id, closed.amount, closed.owed_to_customer, closed.already_deleted) == (
        ids.closeout_id(account_id), -18, 18, False)
    assert closed.payloads_erased == 3
    account = await pool.fetchrow("SELECT status, balance FROM accounts WHERE id = $1", account_id)
    assert tuple(account) == ("deleted", 0)
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE account_id = $1 AND payload IS NOT NULL",
                               account_id) == 0
    repeat = await closeout.close_out(pool, account_id)
    assert (repeat.already_deleted, repeat.amount) == (True, -18)
    assert await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE kind = 'closeout'") == 1

    await _settle_again_adds_nothing(pool, pending_id, DeadReason.ACCOUNT_DELETED, 0)
    await _settle_again_adds_nothing(pool, sending_id, DeadReason.ACCOUNT_DELETED, sending.attempt)
    assert await balance(pool, account_id) == 0


async def test_close_out_refuses_while_deliveries_are_live(pool):
    """close_out before bulk settlement raises AccountNotClosable and writes no closeout entry."""
    account_id = await make_account(pool, balance=5)
    await add_endpoint(pool, account_id)
    await one_delivery(pool, account_id)
    with pytest.raises(AccountNotClosable, match="begin closing"):
        await closeout.close_out(pool, account_id)
    with pytest.raises(AccountNotClosable, match="closing"):
        await closeout.bulk_settle(pool, account_id)
    await closeout.begin_closing(pool, account_id)
    with pytest.raises(AccountNotClosable, match="1 live deliveries"):
        await closeout.close_out(pool, account_id)
    assert await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE kind = 'closeout'") == 0
    assert await pool.fetchval("SELECT status FROM accounts WHERE id = $1", account_id) == "closing"


async def test_deleting_an_endpoint_settles_around_a_delivery_whose_ledger_disagrees(pool):
    """One pending delivery without its charge (what the audit reports as stuck) neither stops the
    deletion half way nor keeps the deliveries after it from their refunds: it stays for a repair."""
    account_id = await make_account(pool, balance=10)
    endpoint_id = await add_endpoint(pool, account_id)
    first = await one_delivery(pool, account_id)
    message_id, stuck = ids.new_id(), ids.new_id()
    await pool.execute("INSERT INTO messages (id, account_id, event_type, payload) VALUES ($1, $2, 'e', '{}')",
                       message_id, account_id)
    await pool.execute("INSERT INTO deliveries (id, account_id, message_id, endpoint_id, price, attempts_max)"
                       " VALUES ($1, $2, $3, $4, 1, 3)", stuck, account_id, message_id, endpoint_id)
    last = await one_delivery(pool, account_id)
    assert first < stuck < last

    assert await endpoints.delete_endpoint(pool, account_id, endpoint_id) == 2

    for delivery_id in (first, last):
        await assert_settled_once(pool, delivery_id, "endpoint_deleted")
    assert (await delivery(pool, stuck))["state"] == "pending"
    assert await balance(pool, account_id) == 10
