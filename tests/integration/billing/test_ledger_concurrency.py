"""Concurrency on a real database, separate pooled connections: no double refund, no drift, no deadlock."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import asyncpg
import pytest

from billing import accounts, closeout, ids, messages
from billing.errors import AccountNotActive, InsufficientBalance
from billing.settle import DeadReason, Outcome, settle
from delivery.engine import claims, results
from ledger_helpers import (
    LEASE_MS_LONG,
    add_endpoint,
    assert_audit_clean,
    balance,
    entries_of,
    ledger_sum,
    make_account,
    order_id,
)

REPETITIONS = 200
SETTLERS = 32
REASONS = list(DeadReason)


def _no_exceptions(outcomes: list) -> None:
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert not any(isinstance(e, asyncpg.exceptions.DeadlockDetectedError) for e in errors), errors
    assert errors == [], errors


async def test_settle_storm_and_a_success_refund_at_most_once(pool):
    """32 concurrent settles (mixed reasons, quoting the current attempt, none, or an old one) and one success, 200 times:

    at most one refund, a reclaim only after a refund and at most once, the end state matches the
    ledger, the balance equals the ledger sum, and no error (deadlock or other) escapes.
    """
    rng = random.Random(20260601)
    price = 2
    account_id = await make_account(pool, balance=price * REPETITIONS, price=price)
    await add_endpoint(pool, account_id)
    created = await messages.create_messages(
        pool, [messages.MessageRequest(account_id, "storm", str(n).encode()) for n in range(REPETITIONS)],
        attempts_max=3,
    )
    claimed = await claims.claim_ids(pool, [claims.DeliveryKey(account_id, c.deliveries[0].id) for c in created],
                                     lease_ms=LEASE_MS_LONG)
    assert len(claimed) == REPETITIONS and {c.attempt for c in claimed} == {1}
    paths = Counter()
    started = time.perf_counter()

    for item in claimed:
        calls = [
            settle(pool, item.id, REASONS[n % len(REASONS)], account_id=item.account_id, attempt=(item.attempt, None, item.attempt - 1)[n % 3])
            for n in range(SETTLERS)
        ]
        success = results.AttemptResult(item.id, item.attempt, account_id, True, 3, status_code=200)
        calls.insert(rng.randrange(len(calls) + 1), results.record_results(pool, [success]))
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        _no_exceptions(outcomes)

        summary = next(o for o in outcomes if isinstance(o, results.RecordSummary))
        settled = Counter(o.outcome for o in outcomes if not isinstance(o, results.RecordSummary))
        entries = await entries_of(pool, item.id)
        refunds = int(ids.refund_id(item.id) in entries)
        reclaims = int(ids.reclaim_id(item.id) in entries)
        assert settled[Outcome.REFUNDED] == refunds <= 1, (settled, entries)
        assert len(summary.reclaimed) == reclaims <= refunds, (summary, entries)
        state = await pool.fetchval("SELECT state FROM deliveries WHERE id = $1", item.id)
        net = sum(entries.values())
        assert (state, net) in {("delivered", -price), ("dead", 0)}, (state, entries)
        # The success always wins in the end: first (delivered, no refund) or by reclaiming the refund.
        assert state == "delivered", (state, entries, summary)
        assert (summary.delivered == [item.id]) == (refunds == 0), (summary, entries)
        paths["reclaimed" if reclaims else "delivered first"] += 1

    elapsed = time.perf_counter() - started
    print(f"\nsettle storm: {REPETITIONS} x ({SETTLERS} settles + 1 success) in {elapsed:.1f} s; paths {dict(paths)}")
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == 0
    await assert_audit_clean(pool, account_id)


async def _run_account_race(pool, rng: random.Random) -> Counter:
    """Creators, settlers and a claim/record worker on one account while it is closed and bulk-settled."""
    account_id = await make_account(pool, balance=60, price=1)
    await add_endpoint(pool, account_id)
    await add_endpoint(pool, account_id, event_types=["a"])
    closing = asyncio.Event()
    stats = Counter()

    async def creator(number: int) -> None:
        for n in range(6):
            was_closing = closing.is_set()
            try:
                await messages.create_message(
                    pool, messages.MessageRequest(account_id, rng.choice("ab"), f"{number}-{n}".encode()),
                    attempts_max=2)
                assert not was_closing, "a create that started after the account turned closing committed"
                stats["created"] += 1
            except AccountNotActive:
                stats["refused closing"] += 1
            except InsufficientBalance:
                stats["refused balance"] += 1
            await asyncio.sleep(0)

    async def live_ids() -> list:
        rows = await pool.fetch(
            "SELECT id FROM deliveries WHERE account_id = $1 AND state IN ('pending', 'sending')", account_id)
        return [row["id"] for row in rows]

    async def settler() -> None:
        for _ in range(8):
            live = await live_ids()
            if live:
                outcome = await settle(pool, rng.choice(live), rng.choice(REASONS), account_id=account_id)
                stats[f"settle {outcome.outcome}"] += 1
            await asyncio.sleep(0)

    async def worker() -> None:
        for _ in range(8):
            live = await live_ids()
            taken = await claims.claim_ids(
                pool, [claims.DeliveryKey(account_id, delivery_id) for delivery_id in live[:4]], lease_ms=LEASE_MS_LONG
            ) if live else []
            if taken:
                summary = await results.record_results(pool, [
                    results.AttemptResult(c.id, c.attempt, account_id, ok, 1, 200 if ok else 500,
                                          None if ok else "HTTP 500", retry_delay_seconds=0.0)
                    for c in taken for ok in [rng.random() < 0.5]])
                stats["recorded"] += len(taken)
                stats["reclaimed"] += len(summary.reclaimed)
            await asyncio.sleep(0)

    async def closer() -> None:
        # Close in the middle of the traffic: after a random number of creates went through.
        target = rng.randint(1, 12)
        for _ in range(500):
            if stats["created"] >= target:
                break
            await asyncio.sleep(0.001)
        await closeout.begin_closing(pool, account_id)
        closing.set()
        bulk = await closeout.bulk_settle(pool, account_id)
        stats["bulk settled"] += bulk.refunded

    async def top_upper() -> None:
        try:
            await accounts.top_up(pool, account_id, order_id(account_id), 5)
        except AccountNotActive:
            stats["top-up refused closing"] += 1

    tasks = [creator(n) for n in range(4)] + [settler(), settler(), worker(), closer(), top_upper()]
    _no_exceptions(await asyncio.gather(*tasks, return_exceptions=True))

    # Whatever raced, nothing is live once the bulk settlement committed.
    assert await live_ids() == []
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id)
    await assert_audit_clean(pool, account_id)

    # A create now, on the closing account, fails and writes nothing.
    messages_before = await pool.fetchval("SELECT count(*) FROM messages WHERE account_id = $1", account_id)
    entries_before = await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE account_id = $1", account_id)
    with pytest.raises(AccountNotActive):
        await messages.create_message(pool, messages.MessageRequest(account_id, "a", b"late"), attempts_max=2)
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE account_id = $1", account_id) == messages_before
    assert await pool.fetchval(
        "SELECT count(*) FROM ledger_entries WHERE account_id = $1", account_id) == entries_before

    closed = await closeout.close_out(pool, account_id)
    assert await balance(pool, account_id) == await ledger_sum(pool, account_id) == 0
    assert closed.owed_to_customer >= 0
    await assert_audit_clean(pool, account_id)
    return stats


async def test_creates_settles_and_bulk_settle_race_on_one_account(pool):
    """Concurrent creates, settles, claims/results and a closing + bulk settle on one account, 20 times:

    no deadlock or other error escapes, the balance always equals the ledger sum, the audit is
    clean, nothing is live after the bulk settlement, and creates after closing write nothing.
    """
    rng = random.Random(7)
    started = time.perf_counter()
    totals = Counter()
    for _ in range(20):
        totals.update(await _run_account_race(pool, rng))
    print(f"\naccount race: 20 runs in {time.perf_counter() - started:.1f} s; {dict(totals)}")
    # The race must actually have exercised both sides of the closing line.
    assert totals["created"] > 0 and totals["refused closing"] > 0 and totals["bulk settled"] > 0
    await assert_audit_clean(pool)


async def test_one_order_raced_onto_two_accounts_applies_once(pool):
    """The same order id topped up on two accounts at once: one applies, the other gets TopupConflict, never a driver error."""
    outcomes = Counter()
    for round_number in range(20):
        first = await make_account(pool)
        second = await make_account(pool)
        order = f"raced-{round_number}"
        both = await asyncio.gather(
            accounts.top_up(pool, first, order, 10), accounts.top_up(pool, second, order, 10), return_exceptions=True)
        kinds = sorted(type(o).__name__ for o in both)
        outcomes[tuple(kinds)] += 1
        assert kinds == ["TopupConflict", "TopupResult"], both
        assert sorted([await balance(pool, first), await balance(pool, second)]) == [0, 10]
        assert await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE id = $1", ids.topup_id(order)) == 1
    await assert_audit_clean(pool)
