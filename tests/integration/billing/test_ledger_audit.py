"""The audit: clean on a healthy history; names the invariant and the offender for each corruption; scopes by account.

Every corruption here BYPASSES THE APP with raw SQL: that is the only way to break the ledger.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from datetime import datetime, timedelta, timezone

import asyncpg
import pytest

from billing import accounts, closeout, ids, references, tables
from billing.audit import audit
from billing.settle import DeadReason, settle
from delivery.engine import claims, presend, results
from delivery.platform.config import ApiSettings
from ledger_helpers import (
    add_endpoint,
    assert_audit_clean,
    claim,
    execute_unchecked,
    expire_lease,
    insert_raw_delivery,
    make_account,
    one_delivery,
    order_id,
    recreate_trigger,
)


async def _healthy_history(pool):
    """Every state the app can reach: live, delivered, each death, a reclaim, reversals, a deleted account."""
    account_id = await make_account(pool, balance=50, price=2)
    await add_endpoint(pool, account_id)
    topup = order_id(account_id)
    await accounts.top_up(pool, account_id, topup, 10)
    await accounts.reverse_top_up(pool, account_id, topup)
    await one_delivery(pool, account_id)  # stays pending
    await claim(pool, await one_delivery(pool, account_id))  # stays sending
    delivered = await claim(pool, await one_delivery(pool, account_id))
    await results.record_results(pool, [results.AttemptResult(delivered.id, 1, account_id, True, 1, 200)])
    failed = await claim(pool, await one_delivery(pool, account_id, attempts_max=1))
    await results.record_results(pool, [results.AttemptResult(failed.id, 1, account_id, False, 1, 500, "HTTP 500")])
    await settle(pool, await one_delivery(pool, account_id), DeadReason.ENDPOINT_DELETED, account_id=account_id)
    late = await claim(pool, await one_delivery(pool, account_id, attempts_max=1))
    await expire_lease(pool, late.id)
    await results.expire_leases(pool, batch_size=10, delay_seconds=lambda attempt: 0.0)
    await claims.settle_exhausted(pool, batch_size=10)
    await results.record_results(pool, [results.AttemptResult(late.id, 1, account_id, True, 1, 200)])  # reclaim

    gone_id = await make_account(pool, balance=5)
    await add_endpoint(pool, gone_id)
    sending = await claim(pool, await one_delivery(pool, gone_id))
    await one_delivery(pool, gone_id)
    await closeout.begin_closing(pool, gone_id)
    await presend.load_for_send(pool, [sending])
    await closeout.bulk_settle(pool, gone_id)
    await closeout.close_out(pool, gone_id)
    return account_id, gone_id


async def test_audit_is_clean_on_a_healthy_history(pool):
    """A history through every path the app has passes every check, and the report counts what it read."""
    account_id, gone_id = await _healthy_history(pool)
    report = await audit(pool)
    assert report.clean and report.violations == [] and report.notices == [], report.to_json()
    assert (report.accounts, report.deliveries) == (2, 8)
    assert report.ledger_entries == await pool.fetchval("SELECT count(*) FROM ledger_entries")
    scoped = await audit(pool, gone_id)
    assert scoped.clean and (scoped.accounts, scoped.deliveries) == (1, 2)
    assert report.to_json()["clean"] is True


def _named(report, invariant: str, *, delivery_id=None, account_id=None) -> list[str]:
    """The details of the violations of one invariant that name this delivery (or account)."""
    return [
        v.detail for v in report.violations
        if v.invariant == invariant
        and (delivery_id is None or v.delivery_id == delivery_id)
        and (account_id is None or v.account_id == account_id)
    ]


async def test_extra_refund_on_a_live_delivery(pool):
    """A refund:<id> inserted for a live delivery (balance moved with it) is I3 and I2 for that delivery, and nothing else."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    delivery_id = await one_delivery(pool, account_id)
    await pool.execute(
        "INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount) VALUES ($1, $2, $3, 'refund', 1)",
        ids.refund_id(delivery_id), account_id, delivery_id,
    )
    await pool.execute("UPDATE accounts SET balance = balance + 1 WHERE id = $1", account_id)
    report = await audit(pool)
    assert _named(report, "I3", delivery_id=delivery_id, account_id=account_id) == ["refund on a live delivery"]
    assert _named(report, "I2", delivery_id=delivery_id) == ["net 0 for a pending delivery, expected -1"]
    assert {v.invariant for v in report.violations} == {"I2", "I3"}


async def test_charge_with_a_wrong_amount(pool):
    """A delivery written by raw SQL with a charge of -2 at price 1 is I1 (and I2), naming that delivery."""
    account_id = await make_account(pool, balance=10)
    endpoint_id = await add_endpoint(pool, account_id)
    delivery_id = await insert_raw_delivery(pool, account_id, endpoint_id, price=1, charge_amount=-2)
    report = await audit(pool)
    assert _named(report, "I1", delivery_id=delivery_id, account_id=account_id) == ["charge is -2, expected -1"]
    assert _named(report, "I2", delivery_id=delivery_id) == ["net -2 for a pending delivery, expected -1"]
    assert {v.invariant for v in report.violations} == {"I1", "I2"}


async def test_missing_charge_and_charge_on_another_account(pool):
    """A delivery without a charge, and one whose charge sits on another account, are both I1 with their ids."""
    account_id = await make_account(pool, balance=10)
    other_id = await make_account(pool, balance=10)
    endpoint_id = await add_endpoint(pool, account_id)
    uncharged = await insert_raw_delivery(pool, account_id, endpoint_id, charge_amount=None)
    elsewhere = await insert_raw_delivery(pool, account_id, endpoint_id, charge_amount=-1, charge_account_id=other_id)
    report = await audit(pool)
    assert _named(report, "I1", delivery_id=uncharged) == ["0 charge entries"]
    assert _named(report, "I1", delivery_id=elsewhere) == ["an entry is on another account"]


async def test_balance_changed_directly(pool):
    """accounts.balance edited by hand is I4 for exactly that account, with both numbers in the detail."""
    account_id = await make_account(pool, balance=10)
    await make_account(pool, balance=10)
    await pool.execute("UPDATE accounts SET balance = 1000 WHERE id = $1", account_id)
    report = await audit(pool)
    assert [(v.invariant, v.account_id, v.delivery_id, v.detail) for v in report.violations] == [
        ("I4", account_id, None, "balance 1000 but the ledger sums to 10")]


async def test_charge_below_zero(pool):
    """A charge that took the running balance below zero (written around the app) is I7, naming the delivery."""
    account_id = await make_account(pool, balance=0)
    endpoint_id = await add_endpoint(pool, account_id)
    delivery_id = await insert_raw_delivery(pool, account_id, endpoint_id, price=1, charge_amount=-1)
    report = await audit(pool)
    assert [(v.invariant, v.account_id, v.delivery_id, v.detail) for v in report.violations] == [
        ("I7", account_id, delivery_id, "charge took the balance to -1")]


async def test_reclaim_without_refund_and_orphan_entry(pool):
    """A reclaim with no refund before it is I3; a ledger entry for a delivery that does not exist is I1."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    delivery_id = await one_delivery(pool, account_id)
    ghost_id = ids.new_id()
    insert = "INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount) VALUES ($1, $2, $3, $4, $5)"
    await pool.execute(insert, ids.reclaim_id(delivery_id), account_id, delivery_id, "reclaim", -1)
    ghost = (ids.refund_id(ghost_id), account_id, ghost_id, "refund", 1)
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await pool.execute(insert, *ghost)  # the database refuses it (billing.references) ...
    async with pool.acquire() as connection, connection.transaction():
        await execute_unchecked(connection, "ledger_entries", insert, *ghost)  # ... unless its check is off
    report = await audit(pool)  # the two entries cancel out: no I4, only the two findings below
    assert "reclaim without a refund" in _named(report, "I3", delivery_id=delivery_id)
    assert _named(report, "I1", delivery_id=ghost_id, account_id=account_id) == [
        "ledger entries for a delivery that does not exist"]
    assert _named(report, "I4") == []


async def test_delivered_without_a_success_on_record(pool):
    """A delivery marked delivered by hand, with no 2xx attempt recorded, is I6."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    delivery_id = await one_delivery(pool, account_id)
    await pool.execute("UPDATE deliveries SET state = 'delivered' WHERE id = $1", delivery_id)
    report = await audit(pool)
    assert _named(report, "I6", delivery_id=delivery_id) == ["delivered without a 2xx attempt on record"]


async def test_audit_scopes_by_account(pool):
    """Corrupting one account shows in its own audit and the global one, never in another account's audit."""
    broken = await make_account(pool, balance=10)
    healthy = await make_account(pool, balance=10)
    for account_id in (broken, healthy):
        await add_endpoint(pool, account_id)
        await one_delivery(pool, account_id)
    live_id = await one_delivery(pool, broken)
    await pool.execute(
        "INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount) VALUES ($1, $2, $3, 'refund', 1)",
        ids.refund_id(live_id), broken, live_id,
    )  # balance not moved: I4 as well

    await assert_audit_clean(pool, healthy)
    scoped = await audit(pool, broken)
    everything = await audit(pool)
    expected = {("I2", live_id), ("I3", live_id), ("I4", None)}
    assert {(v.invariant, v.delivery_id) for v in scoped.violations} == expected
    assert {(v.invariant, v.delivery_id) for v in everything.violations} == expected
    assert {v.account_id for v in everything.violations} == {broken}
    assert (scoped.accounts, scoped.deliveries, scoped.ledger_entries) == (1, 2, 4)


@pytest.mark.parametrize("invariant", ["I2", "I3"])
async def test_to_json_names_the_offender(pool, invariant):
    """The JSON report (what the CLI prints) carries the invariant, the account and the delivery as strings."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    delivery_id = await one_delivery(pool, account_id)
    await pool.execute(
        "INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount) VALUES ($1, $2, $3, 'refund', 1)",
        ids.refund_id(delivery_id), account_id, delivery_id,
    )
    data = (await audit(pool, account_id)).to_json()
    assert data["clean"] is False
    assert {"invariant": invariant, "account_id": str(account_id), "delivery_id": str(delivery_id)}.items() <= next(
        v for v in data["violations"] if v["invariant"] == invariant).items()


async def test_since_covers_an_old_delivery_that_died_since_without_a_refund(pool):
    """An incremental run covers a delivery created (and charged) long ago that was marked dead since,
    with no refund: no ledger entry is new, only its finished_at shows it changed. I2 for it, as in a full run."""
    account_id = await make_account(pool, balance=10)
    endpoint_id = await add_endpoint(pool, account_id)
    hour_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    old = await insert_raw_delivery(pool, account_id, endpoint_id, created_at=hour_ago)
    untouched = await insert_raw_delivery(pool, account_id, endpoint_id, created_at=hour_ago)
    since = datetime.now(timezone.utc) - timedelta(minutes=5)
    assert (await audit(pool, since=since)).clean
    await pool.execute("UPDATE deliveries SET state = 'dead', dead_reason = 'out_of_retries', finished_at = now()"
                       " WHERE id = $1", old)  # BYPASSES THE APP: dead, never refunded
    for report in (await audit(pool), await audit(pool, since=since), await audit(pool, account_id, since=since)):
        assert _named(report, "I2", delivery_id=old, account_id=account_id) == [
            "net -1 for a dead delivery, expected 0"]
        assert {v.invariant for v in report.violations} == {"I2"}
    assert untouched not in {v.delivery_id for v in (await audit(pool, since=since)).violations}


@pytest.mark.parametrize("shape", ["dashes", "no delivery", "upper case", "unknown reason"])
async def test_an_adjustment_id_that_ties_to_no_delivery_is_reported_not_raised(pool, shape):
    """An adjustment whose id is not adjustment:<delivery id>:<reason> (written by raw SQL, past the app's
    billing.adjustments) is I1 on its account, in a full run and an incremental one, and never stops the audit:
    36 dashes once made its ::uuid cast raise for every audit."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    delivery_id = await one_delivery(pool, account_id)
    adjustment_id = {
        "dashes": "adjustment:" + "-" * 36 + ":missing_charge",
        "no delivery": "adjustment:free-money",
        "upper case": f"adjustment:{str(delivery_id).upper()}:missing_charge",
        "unknown reason": f"adjustment:{delivery_id}:goodwill",
    }[shape]
    await pool.execute("INSERT INTO ledger_entries (id, account_id, kind, amount) VALUES ($1, $2, 'adjustment', 0)",
                       adjustment_id, account_id)  # 0 credits: the id alone is wrong
    detail = (f"adjustment {adjustment_id} has a reason the audit does not know"
              " (missing_charge, charge_difference, refund_on_live)" if shape == "unknown reason" else
              f"adjustment {adjustment_id} is tied to no delivery: its id is not adjustment:<delivery id>:<reason>")
    since = datetime.now(timezone.utc) - timedelta(minutes=5)
    for report in (await audit(pool), await audit(pool, account_id), await audit(pool, since=since)):
        assert [(v.invariant, v.account_id, v.delivery_id, v.detail) for v in report.violations] == [
            ("I1", account_id, None, detail)]
    assert (await audit(pool, since=datetime.now(timezone.utc) + timedelta(minutes=1))).clean  # written before


async def test_ledger_entries_on_an_account_that_does_not_exist(pool):
    """Entries on an account id with no accounts row (their reference check bypassed) are I4 on that id, in
    every run that covers it, and the report counts them: the ledger's count comes from the ledger."""
    account_id = await make_account(pool, balance=10)
    ghost_id = ids.new_id()
    async with pool.acquire() as connection, connection.transaction():
        await execute_unchecked(
            connection, "ledger_entries",
            "INSERT INTO ledger_entries (id, account_id, kind, amount) VALUES ($1, $2, 'topup', 1000000)",
            f"topup:{order_id(ghost_id)}", ghost_id)
    report = await audit(pool)
    expected = [("I4", ghost_id, None, "no such account, yet the ledger has 1 entry on it, summing to 1000000")]
    assert [(v.invariant, v.account_id, v.delivery_id, v.detail) for v in report.violations] == expected
    assert report.ledger_entries == await pool.fetchval("SELECT count(*) FROM ledger_entries") == 2
    assert (report.accounts, [s.account_id for s in report.summaries]) == (1, [account_id])
    since = await audit(pool, since=datetime.now(timezone.utc))
    assert [(v.invariant, v.account_id) for v in since.violations] == [("I4", ghost_id)]
    assert [(v.invariant, v.account_id) for v in (await audit(pool, ghost_id)).violations] == [("I4", ghost_id)]
    await assert_audit_clean(pool, account_id)


async def test_a_reclaim_written_before_its_refund(pool):
    """I3 says a reclaim only *after* a refund: a delivered delivery with a reclaim and then a refund (by seq), the
    counts and the net all as a refund-then-reclaim would leave them, is I3 and nothing else."""
    account_id = await make_account(pool, balance=10, price=2)
    await add_endpoint(pool, account_id)
    delivered = await claim(pool, await one_delivery(pool, account_id))
    await results.record_results(pool, [results.AttemptResult(delivered.id, 1, account_id, True, 1, 200)])
    insert = "INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount) VALUES ($1, $2, $3, $4, $5)"
    async with pool.acquire() as connection, connection.transaction():  # the balance moves by -2 + 2
        await connection.execute(insert, ids.reclaim_id(delivered.id), account_id, delivered.id, "reclaim", -2)
        await connection.execute(insert, ids.refund_id(delivered.id), account_id, delivered.id, "refund", 2)
    seqs = dict(await pool.fetch("SELECT kind, seq FROM ledger_entries WHERE delivery_id = $1", delivered.id))
    report = await audit(pool)
    assert [(v.invariant, v.account_id, v.delivery_id, v.detail) for v in report.violations] == [
        ("I3", account_id, delivered.id,
         f"reclaim (seq {seqs['reclaim']}) written before the refund (seq {seqs['refund']})")]


# The guards the migrations create that keep no money right: the probe setting of the reference check
# functions (0006) and the key revocation trigger (0004). Broken, each is a notice: the audit stays clean.

_CHECK_FUNCTIONS = [statement.split()[2] for statement in references.probe_setting_statements()]


def _guard_notices(report) -> list[str]:
    """The notices that name no account and no delivery (about the schema), after checking that the
    report has nothing else: no violation, no other notice."""
    assert report.clean and report.violations == [], report.to_json()
    assert all((n.invariant, n.account_id, n.delivery_id) == ("notice", None, None) for n in report.notices)
    return [n.detail for n in report.notices]


async def test_a_fresh_database_has_no_guard_notices(pool):
    """As the migrations leave it, every check function has its probe setting and the key revocation trigger is
    their own: no notice, for a full run, an incremental one and a one-account one."""
    account_id = await make_account(pool, balance=1)
    assert len(_CHECK_FUNCTIONS) == 4 and all(f.endswith("_check_references()") for f in _CHECK_FUNCTIONS)
    for report in (await audit(pool), await audit(pool, since=datetime.now(timezone.utc)),
                   await audit(pool, account_id)):
        assert _guard_notices(report) == []


_PROBE_COST = "its reference probes are no longer pinned to index probes"


@pytest.mark.parametrize("function", _CHECK_FUNCTIONS)
async def test_a_check_function_without_its_probe_setting_is_a_notice(pool, function):
    """`ALTER FUNCTION ... RESET enable_seqscan` on one check function: one notice naming it, what it runs with, what
    the migrations give it, what it costs and the statement that puts it back; clean, and no I8 (its trigger and
    source are untouched). The migration's own statement puts it back."""
    await make_account(pool, balance=1)
    await pool.execute(f"ALTER FUNCTION {function} RESET enable_seqscan")
    [detail] = _guard_notices(await audit(pool))
    assert detail.startswith(f"function {function} runs with no settings, the migrations give it enable_seqscan=off: "
                             f"{_PROBE_COST}"), detail
    assert f"`ALTER FUNCTION {function} SET enable_seqscan = off`" in detail and "the ledger stays right" in detail
    await pool.execute(f"ALTER FUNCTION {function} SET enable_seqscan = off")
    assert _guard_notices(await audit(pool)) == []


@pytest.mark.parametrize("change, runs_with, cost", [
    ("SET enable_seqscan = on", "enable_seqscan=on", _PROBE_COST),
    ("SET enable_indexscan = off", "enable_seqscan=off, enable_indexscan=off",
     "enable_indexscan may change the plans of its reference probes"),
])
async def test_a_check_function_with_other_settings_is_a_notice(pool, change, runs_with, cost):
    """The probe setting turned the other way, or a setting the migrations do not give (one that could push the probes
    off their indexes): a notice naming what the function runs with."""
    await make_account(pool, balance=1)
    await pool.execute(f"ALTER FUNCTION messages_check_references() {change}")
    [detail] = _guard_notices(await audit(pool))
    assert detail.startswith(f"function messages_check_references() runs with {runs_with},"
                             f" the migrations give it enable_seqscan=off: {cost}"), detail


async def test_a_check_function_recreated_from_its_own_source_loses_its_probe_setting(pool):
    """CREATE OR REPLACE with the migration's own source (say a hand-run hotfix) keeps the function I8 wants, but
    drops the settings ALTER FUNCTION gave it: no violation, a notice. Spelling the setting another way that
    PostgreSQL reads the same (`false` for `off`) is the migration's setting."""
    await make_account(pool, balance=1)
    # The function as the migrations leave it: 0016 makes it again, knowing applications.
    create = [s for s in (*references.upgrade_statements(), *references.application_check_statements())
              if s.lstrip().startswith("CREATE FUNCTION deliveries_check_references()")][-1]
    await pool.execute(create.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    [detail] = _guard_notices(await audit(pool))
    assert detail.startswith("function deliveries_check_references() runs with no settings"), detail
    await pool.execute("ALTER FUNCTION deliveries_check_references() SET enable_seqscan = 'false'")
    assert _guard_notices(await audit(pool)) == []


async def _key(pool, account_id) -> bytes:
    """A live API key of the account (its hash), written by raw SQL."""
    digest = os.urandom(32)
    await pool.execute("INSERT INTO api_keys (id, account_id, key_hash, prefix) VALUES ($1, $2, $3, 'hl_live_test')",
                       ids.new_id(), account_id, digest)
    return digest


async def _revocation_heard(pool, account_id) -> bool:
    """Revoke a new key of the account: did a LISTENer on the revocation channel hear it (its hash)?"""
    digest = await _key(pool, account_id)
    heard: asyncio.Queue[str] = asyncio.Queue()

    def callback(_connection, _pid, _channel, payload):
        heard.put_nowait(payload)

    async with pool.acquire() as listener:
        await listener.add_listener(tables.KEY_REVOKED_CHANNEL, callback)
        await pool.execute("UPDATE api_keys SET revoked_at = now() WHERE key_hash = $1", digest)
        payloads = []
        with contextlib.suppress(asyncio.TimeoutError):  # a NOTIFY comes at commit: well within the wait
            payloads.append(await asyncio.wait_for(heard.get(), 0.5))
        await listener.remove_listener(tables.KEY_REVOKED_CHANNEL, callback)
    payloads += [heard.get_nowait() for _ in range(heard.qsize())]
    assert payloads in ([], [digest.hex()]), payloads
    return payloads == [digest.hex()]


_KEY_COST = ("a revocation may not reach the API processes' auth caches, so a revoked API key can keep working for up"
             " to the cache's TTL (HOOKLEDGER_AUTH_CACHE_TTL_MS,")


async def test_a_missing_key_revocation_trigger_is_a_notice(pool):
    """DROP TRIGGER api_keys_revoked: revocations are no longer announced to the API processes (the harm), and the
    audit says so in a notice that says what it costs, with the cache's real default TTL; clean. The migration's
    statement puts it back."""
    account_id = await make_account(pool, balance=1)
    assert await _revocation_heard(pool, account_id)
    await pool.execute("DROP TRIGGER api_keys_revoked ON api_keys")
    assert not await _revocation_heard(pool, account_id)  # the harm
    [detail] = _guard_notices(await audit(pool))
    assert detail.startswith(f"trigger api_keys_revoked on api_keys does not exist: {_KEY_COST}"), detail
    assert f"{ApiSettings.auth_cache_ttl_ms // 1000} s by default)" in detail and "the ledger is unaffected" in detail
    await pool.execute(tables.KEY_REVOKED_TRIGGER)
    assert _guard_notices(await audit(pool)) == []
    assert await _revocation_heard(pool, account_id)


@pytest.mark.parametrize("how, state", [
    ("DISABLE", "disabled"),
    ("ENABLE REPLICA", "ENABLE REPLICA (fires only under session_replication_role = replica"),
])
async def test_a_key_revocation_trigger_that_does_not_fire_is_a_notice(pool, how, state):
    """Disabled, or ENABLE REPLICA (so it fires only where revocations never happen): a notice, comparing with what the
    migration leaves (plain ENABLE)."""
    await make_account(pool, balance=1)
    await pool.execute(f"ALTER TABLE api_keys {how} TRIGGER api_keys_revoked")
    [detail] = _guard_notices(await audit(pool))
    assert detail.startswith(f"trigger api_keys_revoked on api_keys is {state}"), detail
    assert "the migrations leave it plain ENABLE (fires unless session_replication_role = replica):" in detail
    assert _KEY_COST in detail


@pytest.mark.parametrize("how", ["ENABLE", "ENABLE ALWAYS"])
async def test_a_key_revocation_trigger_that_fires_at_least_as_created_is_no_notice(pool, how):
    """The migration leaves the trigger plain ENABLE; ENABLE ALWAYS fires in every case that does (and under replica
    too), so neither is a notice."""
    await make_account(pool, balance=1)
    await pool.execute(f"ALTER TABLE api_keys {how} TRIGGER api_keys_revoked")
    assert _guard_notices(await audit(pool)) == []


async def test_a_key_revocation_trigger_recreated_differently_is_a_notice(pool):
    """Recreated under its name with a WHEN that never holds: it exists and is enabled, yet never fires. A notice
    quoting what it is and what the migration creates."""
    await make_account(pool, balance=1)
    await recreate_trigger(pool, "api_keys", "api_keys_revoked", "AFTER UPDATE OF revoked_at ON api_keys FOR EACH ROW"
                           " WHEN (false) EXECUTE FUNCTION api_keys_notify_revoked()")
    [detail] = _guard_notices(await audit(pool))
    assert detail.startswith(
        "trigger api_keys_revoked on api_keys is not the one the migrations create: it is `"), detail
    assert f"expected `{tables.KEY_REVOKED_TRIGGER}`: {_KEY_COST}" in detail


async def test_a_key_revocation_function_replaced_is_a_notice(pool):
    """The function replaced by one that NOTIFYs another channel (no API process hears it): the trigger is untouched,
    the function is a notice; the migration's own source puts it back."""
    account_id = await make_account(pool, balance=1)
    await pool.execute(tables.KEY_REVOKED_FUNCTION.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
                       .replace(tables.KEY_REVOKED_CHANNEL, "elsewhere"))
    assert not await _revocation_heard(pool, account_id)  # the harm
    [detail] = _guard_notices(await audit(pool))
    assert detail.startswith("function api_keys_notify_revoked() of trigger api_keys_revoked on api_keys is not the"
                             " one the migrations create: plpgsql source sha256 "), detail
    assert _KEY_COST in detail
    await pool.execute(tables.KEY_REVOKED_FUNCTION.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    assert _guard_notices(await audit(pool)) == []
