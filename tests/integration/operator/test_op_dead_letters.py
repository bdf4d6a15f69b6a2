"""Dead letters: list with filters and cursors, inspect, replay one, and bulk replay with a confirmed total."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta, timezone

import pytest

from billing.messages import MessageRequest, create_messages
from delivery.engine import claims
from delivery.platform import config
from delivery.operations import dead_letters
from delivery.engine import results
from engine_helpers import add_account, add_endpoint, fast_environment, running_worker, wait_for
from operator_helpers import assert_audit_clean

PRICE = 5


async def _dead_deliveries(pool, database_url, redis_url, keyring, receiver_factory):
    """Two endpoints answering 500; one attempt allowed: 6 + 2 deliveries die out_of_retries through the worker."""
    settings = config.load(fast_environment(database_url, redis_url, keyring))
    failing, other = await receiver_factory(lambda n: 500), await receiver_factory(lambda n: 503)
    account_id = await add_account(pool, balance=1000, price=PRICE)
    endpoint_id = await add_endpoint(pool, account_id, failing, keyring)
    other_id = await add_endpoint(pool, account_id, other, keyring)
    requests = [MessageRequest(account_id, "order.created", b'{"n": %d}' % n, endpoint_ids=(endpoint_id,)) for n in range(6)]
    requests += [MessageRequest(account_id, "order.created", b"{}", endpoint_ids=(other_id,)) for _ in range(2)]
    await create_messages(pool, requests, attempts_max=1)
    async with running_worker(settings, pool):
        await wait_for(lambda: pool.fetchval(
            "SELECT count(*) = 8 FROM deliveries WHERE account_id = $1 AND state = 'dead'", account_id))
    return account_id, endpoint_id, other_id


async def test_list_inspect_and_replay_one(pool, database_url, redis_url, keyring, receiver_factory):
    """Listing filters by account, endpoint, reason and time and pages with a cursor; inspect shows the 500
    attempt and the charge+refund; a replay is a new delivery with a new charge, the old refund stays; a
    repeated replay says it was replayed before (no charge); --again makes another."""
    account_id, endpoint_id, other_id = await _dead_deliveries(pool, database_url, redis_url, keyring, receiver_factory)
    everything = await dead_letters.list_dead(pool, dead_letters.DeadFilter(account_id=account_id), limit=500)
    assert len(everything.rows) == 8 and everything.next_cursor is None
    seen, cursor = [], None
    while True:
        page = await dead_letters.list_dead(pool, dead_letters.DeadFilter(endpoint_id=endpoint_id), cursor=cursor, limit=4)
        seen += [row["id"] for row in page.rows]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 6 and seen == sorted(seen, reverse=True)
    assert not (await dead_letters.list_dead(pool, dead_letters.DeadFilter(reason="endpoint_disabled"))).rows
    future = datetime.now(timezone.utc) + timedelta(hours=1)
    assert not (await dead_letters.list_dead(pool, dead_letters.DeadFilter(died_after=future))).rows

    old_id = seen[0]
    found = await dead_letters.inspect(pool, old_id)
    assert found["delivery"]["dead_reason"] == "out_of_retries"
    assert [(a["attempt"], a["status_code"]) for a in found["attempts"]] == [(1, 500)]
    assert found["attempts"][0]["latency_ms"] is not None
    assert [(e["kind"], e["amount"]) for e in found["ledger"]] == [("charge", -PRICE), ("refund", PRICE)]

    balance = await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id)
    replayed = await dead_letters.replay(pool, old_id, attempts_max=3)
    (new_id,) = replayed.created.values()
    assert new_id != old_id and replayed.charged == PRICE
    row = await pool.fetchrow("SELECT state, endpoint_id FROM deliveries WHERE id = $1", new_id)
    assert (row["state"], row["endpoint_id"]) == ("pending", endpoint_id)
    assert [(e["kind"], e["amount"]) for e in (await dead_letters.inspect(pool, old_id))["ledger"]] == [
        ("charge", -PRICE), ("refund", PRICE)]
    again = await dead_letters.replay(pool, old_id, attempts_max=3)
    assert again.already == {old_id: new_id} and again.charged == 0
    forced = await dead_letters.replay(pool, old_id, attempts_max=3, again=True)
    assert len(forced.created) == 1 and forced.created[old_id] != new_id
    assert await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id) == balance - 2 * PRICE
    with pytest.raises(dead_letters.ReplayRefused):
        await dead_letters.replay(pool, new_id, attempts_max=3)  # not dead
    await assert_audit_clean(pool)


async def test_bulk_replay_needs_the_right_total(pool, database_url, redis_url, keyring, receiver_factory):
    """The plan shows the total charge; a wrong confirm_total replays nothing and writes nothing; the right
    one creates one new delivery per dead one on that endpoint only (new charges, old refunds stay); a
    second call finds nothing left; the audit is clean."""
    account_id, endpoint_id, other_id = await _dead_deliveries(pool, database_url, redis_url, keyring, receiver_factory)
    start, end = datetime.now(timezone.utc) - timedelta(hours=1), datetime.now(timezone.utc) + timedelta(minutes=1)
    plan = await dead_letters.plan_bulk_replay(pool, endpoint_id, start, end)
    assert len(plan.delivery_ids) == 6 and plan.total_charge == 6 * PRICE and not plan.more
    rows_before = await pool.fetchval("SELECT count(*) FROM ledger_entries")
    with pytest.raises(dead_letters.ReplayTotalMismatch):
        await dead_letters.bulk_replay(pool, endpoint_id, start, end, confirm_total=plan.total_charge - 1, attempts_max=3)
    assert await pool.fetchval("SELECT count(*) FROM ledger_entries") == rows_before
    assert await pool.fetchval("SELECT count(*) FROM deliveries WHERE account_id = $1", account_id) == 8

    limited = await dead_letters.plan_bulk_replay(pool, endpoint_id, start, end, limit=4)
    assert limited.more and limited.total_charge == 4 * PRICE
    first = await dead_letters.bulk_replay(pool, endpoint_id, start, end, confirm_total=4 * PRICE, attempts_max=3, limit=4)
    rest = await dead_letters.plan_bulk_replay(pool, endpoint_id, start, end)
    second = await dead_letters.bulk_replay(pool, endpoint_id, start, end, confirm_total=rest.total_charge, attempts_max=3)
    assert len(first.created) == 4 and len(second.created) == 2 and first.created.keys().isdisjoint(second.created)
    assert set(first.created) | set(second.created) == set(plan.delivery_ids)
    assert (await dead_letters.plan_bulk_replay(pool, endpoint_id, start, end)).delivery_ids == ()
    new_ids = list(first.created.values()) + list(second.created.values())
    targets = await pool.fetch("SELECT DISTINCT endpoint_id FROM deliveries WHERE id = ANY($1::uuid[])", new_ids)
    assert [row["endpoint_id"] for row in targets] == [endpoint_id]
    refunds = await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE id = ANY($1::text[])",
                                  [f"refund:{old}" for old in plan.delivery_ids])
    assert refunds == 6
    assert await pool.fetchval("SELECT count(*) FROM ledger_entries WHERE id = ANY($1::text[])",
                               [f"charge:{new}" for new in new_ids]) == 6
    await assert_audit_clean(pool)


async def test_cli_bulk_replay(pool, database_url, redis_url, keyring, receiver_factory, monkeypatch):
    """`hookledger deliveries replay --endpoint` (on PostgreSQL): a wrong --confirm-total refused (exit 1,
    nothing written), the right one replays. (`deliveries dead|show` go through the API: tests/integration/cli.)"""
    from typer.testing import CliRunner

    from delivery.cli.main import app

    account_id, endpoint_id, _ = await _dead_deliveries(pool, database_url, redis_url, keyring, receiver_factory)
    monkeypatch.setenv("DATABASE_URL", database_url)
    runner = CliRunner()

    async def cli(*arguments):
        return await asyncio.to_thread(runner.invoke, app, list(arguments))

    rows = (await dead_letters.list_dead(pool, dead_letters.DeadFilter(endpoint_id=endpoint_id))).rows
    assert len(rows) == 6
    since = (datetime.now(timezone.utc) - timedelta(hours=1)).isoformat()
    wrong = await cli("deliveries", "replay", "--endpoint", str(endpoint_id), "--since", since, "--confirm-total", "1")
    assert wrong.exit_code == 1 and "nothing was replayed" in wrong.output, wrong.output
    assert await pool.fetchval("SELECT count(*) FROM deliveries WHERE account_id = $1", account_id) == 8
    right = await cli("deliveries", "replay", "--endpoint", str(endpoint_id), "--since", since,
                      "--confirm-total", str(6 * PRICE))
    assert right.exit_code == 0 and "6 new deliveries" in right.output, right.output
    await assert_audit_clean(pool)



@pytest.mark.parametrize("again", [False, True])
async def test_cli_replay_cut_at_its_commit_says_what_is_in_doubt(pool, database_url, redis_url, keyring,
                                                                  receiver_factory, monkeypatch, again):
    """The connection breaks at the replay's write and the database cannot tell in time whether it was
    written (the write is held, the database unreachable meanwhile): one error line naming the dead
    delivery in doubt and its would-be replay, exit 3, no traceback. Once the write goes through, that
    replay exists exactly once; a keyed replay run again then says it was replayed before and charges
    nothing."""
    async with _cli_through_cutter(pool, database_url, redis_url, keyring, receiver_factory, monkeypatch) as (
            cutter, account_id, old_id, balance, replay):
        cutter.arm("blackout")
        cut = await replay(again)
        assert cut.exit_code == 3, cut.output
        assert cut.exception is None or isinstance(cut.exception, SystemExit), repr(cut.exception)
        text = " ".join(cut.output.split())
        assert "could not be asked in time whether they were written" in text, text
        assert ("running the same command again replays each at most once" in text) != again, text
        assert f"in doubt: {old_id}, replayed as " in text, text
        new_id = text.split(f"in doubt: {old_id}, replayed as ")[1].split()[0]
        assert cutter.cuts == 1
        cutter.release()  # the held write goes through: the replay is written, once
        await wait_for(lambda: pool.fetchval("SELECT count(*) = 1 FROM deliveries WHERE id = $1::uuid", new_id))
        assert await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id) == balance - PRICE
        if not again:
            repeated = await replay(again)
            assert repeated.exit_code == 0 and "was replayed before as" in repeated.output, repeated.output
            assert new_id in " ".join(repeated.output.split())
        assert await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id) == balance - PRICE
        await assert_audit_clean(pool)


async def test_cli_replay_cut_before_its_commit_took_effect_says_run_it_again(pool, database_url, redis_url, keyring,
                                                                              receiver_factory, monkeypatch):
    """The write never reached the server: the database says so, and the command says PostgreSQL went
    away and to run it again (exit 3, no traceback); nothing was written, and running it again replays."""
    async with _cli_through_cutter(pool, database_url, redis_url, keyring, receiver_factory, monkeypatch) as (
            cutter, account_id, old_id, balance, replay):
        cutter.arm("before")
        cut = await replay(False)
        assert cut.exit_code == 3 and cutter.cuts == 1, cut.output
        assert cut.exception is None or isinstance(cut.exception, SystemExit), repr(cut.exception)
        assert "PostgreSQL went away during the command" in " ".join(cut.output.split()), cut.output
        assert await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id) == balance
        again = await replay(False)
        assert again.exit_code == 0 and "1 new deliveries" in again.output, again.output
        assert await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id) == balance - PRICE
        await assert_audit_clean(pool)


@contextlib.asynccontextmanager
async def _cli_through_cutter(pool, database_url, redis_url, keyring, receiver_factory, monkeypatch):
    """Dead deliveries, and `hookledger deliveries replay` run against PostgreSQL through a CommitCutter."""
    from typer.testing import CliRunner

    from billing.message_plan import GATED_WRITE_REPLAYS
    from commit_cutter import CommitCutter
    from delivery.cli.main import app

    account_id, endpoint_id, _ = await _dead_deliveries(pool, database_url, redis_url, keyring, receiver_factory)
    old_id = (await dead_letters.list_dead(pool, dead_letters.DeadFilter(endpoint_id=endpoint_id))).rows[0]["id"]
    balance = await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id)
    cutter = await CommitCutter(database_url, statements=(GATED_WRITE_REPLAYS,)).start()
    monkeypatch.setenv("DATABASE_URL", cutter.url())
    monkeypatch.setenv("HOOKLEDGER_COMMIT_OUTCOME_WAIT_SECONDS", "1")
    runner = CliRunner()

    async def replay(again: bool):
        arguments = ["deliveries", "replay", str(old_id)] + (["--again"] if again else [])
        return await asyncio.to_thread(runner.invoke, app, arguments)

    try:
        yield cutter, account_id, old_id, balance, replay
    finally:
        await cutter.close()


async def test_a_delivered_delivery_is_replayed_as_the_api_replays_it(pool, receiver_factory, keyring):
    """`hookledger deliveries replay` takes a delivered delivery too (the API does): a new delivery, charged."""
    receiver = await receiver_factory(lambda n: 200)
    account_id = await add_account(pool, balance=100, price=PRICE)
    endpoint_id = await add_endpoint(pool, account_id, receiver, keyring)
    (created,) = await create_messages(pool, [MessageRequest(account_id, "order.created", b"{}")], attempts_max=3)
    (delivered,) = [delivery.id for delivery in created.deliveries]
    (claimed,) = await claims.claim_ids(pool, [claims.DeliveryKey(account_id, delivered)], lease_ms=60_000)
    await results.record_results(pool, [results.AttemptResult(delivered, claimed.attempt, account_id, True, 5, 200)])
    assert await pool.fetchval("SELECT state FROM deliveries WHERE id = $1", delivered) == "delivered"
    replayed = await dead_letters.replay(pool, delivered, attempts_max=3)
    (new_id,) = replayed.created.values()
    assert replayed.charged == PRICE
    row = await pool.fetchrow("SELECT state, endpoint_id FROM deliveries WHERE id = $1", new_id)
    assert (row["state"], row["endpoint_id"]) == ("pending", endpoint_id)
    assert await pool.fetchval("SELECT balance FROM accounts WHERE id = $1", account_id) == 100 - 2 * PRICE
    await assert_audit_clean(pool)
