"""Retention and expunge on real PostgreSQL: exactly what is past the period and finished is erased,
never a live delivery's payload (also while claims run concurrently), never a ledger row; account
deletion erases the response excerpts and sign-ins too; the audit stays clean throughout."""

from __future__ import annotations

import asyncio
import hashlib
import random
import uuid

import pytest

from billing import accounts
from billing.settle import settle
from delivery.engine import claims, presend
from delivery.operations import deletion, retention
from operator_helpers import add_endpoint, assert_audit_clean, claim, create_many, make_account

LEASE_MS = 60_000


async def _finish(pool, delivery_ids, state: str = "delivered") -> None:
    """Record each delivery's attempt with a response excerpt and the custom headers it was sent with,
    and end it: delivered (keeping its charge) by SQL, or dead through billing.settle (refunded once)."""
    await pool.execute(
        "INSERT INTO delivery_attempts (delivery_id, attempt, account_id, started_at, status_code, response_excerpt,"
        "   sent_headers)"
        " SELECT id, greatest(attempt, 1), account_id, now(), 200, 'thank you, ' || id,"
        "   jsonb_build_object('X-Customer', id::text) FROM deliveries"
        " WHERE id = ANY($1::uuid[]) ON CONFLICT DO NOTHING", list(delivery_ids))
    if state == "dead":
        await pool.execute("UPDATE deliveries SET attempt = greatest(attempt, 1) WHERE id = ANY($1::uuid[])",
                           list(delivery_ids))
        for delivery_id in delivery_ids:
            owner = await pool.fetchval("SELECT account_id FROM deliveries WHERE id = $1", delivery_id)
            await settle(pool, delivery_id, "out_of_retries", account_id=owner)
        return
    await pool.execute(
        "UPDATE deliveries SET state = 'delivered', leased_until = NULL, finished_at = now(),"
        " attempt = greatest(attempt, 1) WHERE id = ANY($1::uuid[])", list(delivery_ids))


async def _age(pool, delivery_ids, days: float) -> None:
    await pool.execute(
        "UPDATE messages SET created_at = now() - $2 * interval '1 day'"
        " WHERE id IN (SELECT message_id FROM deliveries WHERE id = ANY($1::uuid[]))", list(delivery_ids), days)


async def _ledger(pool) -> list:
    return [tuple(row) for row in await pool.fetch("SELECT id, amount, created_at FROM ledger_entries ORDER BY seq")]


async def _payloads(pool, delivery_ids) -> dict:
    rows = await pool.fetch(
        "SELECT d.id, m.payload, m.payload_erased_by, (SELECT count(response_excerpt) FROM delivery_attempts a"
        " WHERE a.delivery_id = d.id) AS excerpts, (SELECT count(sent_headers) FROM delivery_attempts a"
        " WHERE a.delivery_id = d.id) AS headers FROM deliveries d JOIN messages m ON m.id = d.message_id"
        " WHERE d.id = ANY($1::uuid[])", list(delivery_ids))
    return {row["id"]: row for row in rows}


async def test_retention_erases_exactly_what_is_past_the_period_and_finished(pool):
    """Of an account with 7 days' retention: old finished messages lose payload and excerpts; old live
    ones, young finished ones and another account's (365 days) keep theirs; every row and the ledger stay."""
    account_id = await make_account(pool, balance=10_000)
    await accounts.update_settings(pool, account_id, payload_retention_days=7)
    endpoint_id = await add_endpoint(pool, account_id)
    other_id = await make_account(pool, balance=10_000)
    await accounts.update_settings(pool, other_id, payload_retention_days=365)
    other_endpoint = await add_endpoint(pool, other_id)
    old_finished = await create_many(pool, account_id, endpoint_id, 30)
    old_dead = await create_many(pool, account_id, endpoint_id, 5)
    old_pending = await create_many(pool, account_id, endpoint_id, 5)
    old_sending = await create_many(pool, account_id, endpoint_id, 5)
    young = await create_many(pool, account_id, endpoint_id, 5)
    others = await create_many(pool, other_id, other_endpoint, 5)
    await claim(pool, old_sending)
    await _finish(pool, old_finished + young + others)
    await _finish(pool, old_dead, "dead")
    await _age(pool, old_finished + old_dead + old_pending + old_sending + others, 8)
    await _age(pool, young, 6)
    ledger_before = await _ledger(pool)
    counts_before = await pool.fetchval("SELECT (SELECT count(*) FROM messages) + (SELECT count(*) FROM deliveries)"
                                        " + (SELECT count(*) FROM delivery_attempts)")
    assert await retention.backlog(pool) == 45

    run = await retention.run_retention(pool, batch_size=7)
    assert run.erased == 35
    rows = await _payloads(pool, old_finished + old_dead + old_pending + old_sending + young + others)
    for delivery_id in old_finished + old_dead:
        assert rows[delivery_id]["payload"] is None and rows[delivery_id]["excerpts"] == rows[delivery_id]["headers"] == 0
        assert rows[delivery_id]["payload_erased_by"] == "retention"
    for delivery_id in old_pending + old_sending + young + others:
        assert rows[delivery_id]["payload"] is not None and rows[delivery_id]["payload_erased_by"] is None
    for delivery_id in young + others:
        assert rows[delivery_id]["excerpts"] == rows[delivery_id]["headers"] == 1
    assert await _ledger(pool) == ledger_before
    assert counts_before == await pool.fetchval(
        "SELECT (SELECT count(*) FROM messages) + (SELECT count(*) FROM deliveries) + (SELECT count(*) FROM delivery_attempts)")
    assert await retention.backlog(pool) == 10  # the old live ones, until they finish
    assert (await retention.run_retention(pool)).erased == 0
    await _finish(pool, old_pending + old_sending)
    assert (await retention.run_retention(pool)).erased == 10
    assert await retention.backlog(pool) == 0
    await assert_audit_clean(pool)


async def test_expunge_refuses_live_and_unknown_and_answers_the_same_twice(pool):
    """404 for a bad id and another account's message; MessageLive while a delivery is sending; then the
    erasure, and a second call gives the same time and author."""
    account_id = await make_account(pool, balance=1000)
    endpoint_id = await add_endpoint(pool, account_id)
    other_id = await make_account(pool, balance=1000)
    (delivery_id,) = await create_many(pool, account_id, endpoint_id, 1)
    message_id = await pool.fetchval("SELECT message_id FROM deliveries WHERE id = $1", delivery_id)
    for account, message in ((account_id, uuid.uuid4()), (other_id, message_id)):
        with pytest.raises(retention.MessageNotFound):
            await retention.expunge(pool, account, message, "test")
    await claim(pool, [delivery_id])
    with pytest.raises(retention.MessageLive) as live:
        await retention.expunge(pool, account_id, message_id, "test")
    assert live.value.live == 1 and live.value.next_change_at is not None
    await _finish(pool, [delivery_id])
    first = await retention.expunge(pool, account_id, message_id, "api_key:one")
    second = await retention.expunge(pool, account_id, message_id, "api_key:two")
    assert first == second and first.payload_erased_by == "api_key:one"
    row = (await _payloads(pool, [delivery_id]))[delivery_id]
    assert row["payload"] is None and row["excerpts"] == row["headers"] == 0
    await assert_audit_clean(pool)


@pytest.mark.parametrize("round_", range(3))
async def test_claims_and_erasure_concurrently_never_send_an_erased_body(pool, round_):
    """Claims (with the pre-send check), results, expunges of random messages and retention batches run
    at once over the same old messages: every claimed delivery carries its payload, none dies for want of
    it, every erased message's deliveries had all finished, and the ledger only grows by what settles."""
    rng = random.Random(round_)
    account_id = await make_account(pool, balance=100_000)
    await accounts.update_settings(pool, account_id, payload_retention_days=1)
    endpoint_id = await add_endpoint(pool, account_id)
    delivery_ids = await create_many(pool, account_id, endpoint_id, 400)
    await _age(pool, delivery_ids, 2)
    await _finish(pool, rng.sample(delivery_ids, 100))
    message_of = {row["id"]: row["message_id"] for row in await pool.fetch(
        "SELECT id, message_id FROM deliveries WHERE id = ANY($1::uuid[])", delivery_ids)}
    claimed_payloads: list = []
    done = asyncio.Event()

    async def claimer() -> None:
        while True:
            loaded = await claims.claim_due_for_send(pool, batch_size=rng.randint(1, 20), lease_ms=LEASE_MS)
            if not loaded:
                if await pool.fetchval("SELECT count(*) FROM deliveries WHERE account_id = $1 AND state = 'pending'",
                                       account_id) == 0:
                    done.set()
                    return
                await asyncio.sleep(0)
                continue
            outgoing, settled = await presend.check_loaded(pool, loaded)
            assert not settled
            claimed_payloads.extend(item.payload for item in outgoing)
            await asyncio.sleep(0)
            await _finish(pool, [item.claimed.id for item in outgoing])

    async def expunger() -> int:
        erased = 0
        while not done.is_set():
            delivery_id = rng.choice(delivery_ids)
            try:
                await retention.expunge(pool, account_id, message_of[delivery_id], "test")
                erased += 1
            except retention.MessageLive:
                pass
            await asyncio.sleep(0)
        return erased

    async def retainer() -> None:
        while not done.is_set():
            await retention.erase_batch(pool, batch_size=rng.randint(1, 30))
            await asyncio.sleep(0)

    results = await asyncio.gather(claimer(), claimer(), expunger(), retainer(), retainer())
    assert results[2] > 0
    assert len(claimed_payloads) == 300 and all(isinstance(payload, bytes) and payload for payload in claimed_payloads)
    assert await pool.fetchval("SELECT count(*) FROM deliveries WHERE account_id = $1 AND state = 'dead'", account_id) == 0
    await retention.run_retention(pool)
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE account_id = $1 AND payload IS NOT NULL",
                               account_id) == 0
    assert await pool.fetchval("SELECT count(*) FROM delivery_attempts WHERE account_id = $1"
                               " AND response_excerpt IS NOT NULL", account_id) == 0
    await assert_audit_clean(pool)


async def test_account_deletion_erases_excerpts_sessions_and_stored_answers(pool):
    """The deletion job's close_out step erases payloads, response excerpts and the custom headers each
    attempt was sent with, stored idempotent answers and dashboard sign-ins with the rest; every
    attempt row stays; the audit is clean."""
    account_id = await make_account(pool, balance=1000)
    endpoint_id = await add_endpoint(pool, account_id)
    delivery_ids = await create_many(pool, account_id, endpoint_id, 10)
    await _finish(pool, delivery_ids[:6])
    key_id = uuid.uuid4()
    await pool.execute("INSERT INTO api_keys (id, account_id, key_hash, prefix) VALUES ($1, $2, $3, 'hl_live_x')",
                       key_id, account_id, hashlib.sha256(key_id.bytes).digest())
    await pool.execute("INSERT INTO dashboard_sessions (token_hash, role, account_id, api_key_id, expires_at)"
                       " VALUES ($1, 'account', $2, $3, now() + interval '1 hour')",
                       hashlib.sha256(b"session").digest(), account_id, key_id)
    await pool.execute("INSERT INTO idempotent_responses (principal, key, fingerprint, status, body)"
                       " VALUES ($1, 'k', $2, 201, 'sealed')", str(account_id), bytes(32))
    state = await deletion.run_deletion(pool, account_id)
    assert state.status == "done"
    assert state.report["response_excerpts_erased"] == 6 and state.report["sessions_ended"] == 1
    row = await pool.fetchrow(
        "SELECT (SELECT count(*) FROM delivery_attempts WHERE account_id = $1) AS attempts,"
        " (SELECT count(response_excerpt) FROM delivery_attempts WHERE account_id = $1) AS excerpts,"
        " (SELECT count(sent_headers) FROM delivery_attempts WHERE account_id = $1) AS headers,"
        " (SELECT count(*) FROM dashboard_sessions WHERE account_id = $1) AS sessions,"
        " (SELECT count(*) FROM idempotent_responses WHERE principal = $1::text) AS answers,"
        " (SELECT count(*) FROM messages WHERE account_id = $1 AND payload IS NOT NULL) AS payloads,"
        " (SELECT count(*) FROM messages WHERE account_id = $1 AND payload_erased_by = 'account_deletion') AS marked",
        account_id)
    assert dict(row) == {"attempts": 6, "excerpts": 0, "headers": 0, "sessions": 0, "answers": 0, "payloads": 0, "marked": 10}
    await retention.run_retention(pool)
    await assert_audit_clean(pool)


async def test_a_run_stops_at_its_batch_and_time_bounds_and_the_next_goes_on(pool):
    """A run with no time left does one batch; one with one batch allowed does one; runs without
    those bounds go on until nothing is due. Nothing is erased twice or skipped."""
    account_id = await make_account(pool, balance=10_000)
    await accounts.update_settings(pool, account_id, payload_retention_days=1)
    endpoint_id = await add_endpoint(pool, account_id)
    delivery_ids = await create_many(pool, account_id, endpoint_id, 25)
    await _finish(pool, delivery_ids)
    await _age(pool, delivery_ids, 2)
    first = await retention.run_retention(pool, batch_size=5, seconds_max=0)
    second = await retention.run_retention(pool, batch_size=5, batches_max=1)
    assert (first.batches, first.erased, second.batches, second.erased) == (1, 5, 1, 5)
    rest = await retention.run_retention(pool, batch_size=5)
    assert rest.erased == 15 and await retention.backlog(pool) == 0
    assert (await retention.run_retention(pool, batch_size=5)).erased == 0
    await assert_audit_clean(pool)


@pytest.mark.parametrize("settings", [{"payload_retention_days": 0}, {"payload_retention_days": 3651},
                                      {"payload_retention_days": True}, {"set_threshold": True, "low_balance_threshold": 0},
                                      {"set_threshold": True, "low_balance_threshold": 2**63}])
async def test_update_settings_refuses_out_of_range_values_and_changes_nothing(pool, settings):
    """billing.accounts.update_settings checks what the API's validation also checks, for every
    caller: out of range, or a bool for a number, is InvalidInput naming the setting; the row stays."""
    from billing.errors import InvalidInput

    account_id = await make_account(pool, balance=10)
    before = await pool.fetchrow("SELECT payload_retention_days, low_balance_threshold, low_balance_armed"
                                 " FROM accounts WHERE id = $1", account_id)
    with pytest.raises(InvalidInput, match="payload_retention_days|low_balance_threshold"):
        await accounts.update_settings(pool, account_id, **settings)
    assert await pool.fetchrow("SELECT payload_retention_days, low_balance_threshold, low_balance_armed"
                               " FROM accounts WHERE id = $1", account_id) == before
