"""The database itself keeps the ledger append-only (I5), even for a superuser in replica mode."""

from __future__ import annotations

import asyncpg
import pytest

from billing import accounts
from billing.audit import audit
from billing.tables import APPEND_ONLY_FUNCTION
from ledger_helpers import add_endpoint, assert_audit_clean, make_account, one_delivery, recreate_trigger

_REFUSALS = [
    "UPDATE ledger_entries SET amount = amount + 1000",
    "UPDATE ledger_entries SET note = 'edited' WHERE kind = 'topup'",
    "DELETE FROM ledger_entries",
    "DELETE FROM ledger_entries WHERE kind = 'charge'",
    "TRUNCATE ledger_entries",
    "TRUNCATE ledger_entries, accounts CASCADE",
    "TRUNCATE accounts CASCADE",
]


async def _ledger_snapshot(connection) -> list[tuple]:
    rows = await connection.fetch("SELECT id, seq, account_id, delivery_id, kind, amount, note FROM ledger_entries ORDER BY seq")
    return [tuple(row) for row in rows]


@pytest.mark.parametrize("replica", [False, True], ids=["origin", "session_replication_role=replica"])
@pytest.mark.parametrize("statement", _REFUSALS)
async def test_superuser_cannot_rewrite_the_ledger(pool, statement, replica):
    """UPDATE, DELETE and TRUNCATE on ledger_entries fail for a superuser, with or without replica mode; rows stay as they were."""
    account_id = await make_account(pool, balance=10)
    await add_endpoint(pool, account_id)
    await one_delivery(pool, account_id)
    async with pool.acquire() as connection:
        assert await connection.fetchval("SELECT rolsuper FROM pg_roles WHERE rolname = current_user") is True
        before = await _ledger_snapshot(connection)
        assert len(before) == 2
        if replica:
            await connection.execute("SET session_replication_role = replica")
            assert await connection.fetchval("SHOW session_replication_role") == "replica"
        try:
            # TRUNCATE accounts is refused by accounts' own trigger (billing.references) before the ledger's.
            refusal = "TRUNCATE on accounts refused" if statement == "TRUNCATE accounts CASCADE" else "ledger_entries is append-only"
            with pytest.raises((asyncpg.RaiseError, asyncpg.RestrictViolationError), match=refusal):
                await connection.execute(statement)
        finally:
            await connection.execute("RESET session_replication_role")
        assert await _ledger_snapshot(connection) == before
    assert await pool.fetchval("SELECT count(*) FROM accounts") == 1
    await assert_audit_clean(pool)


async def test_inserts_still_work_and_corrections_are_new_entries(pool):
    """Append-only is not read-only: the app keeps appending (a top-up after the refusals lands)."""
    account_id = await make_account(pool, balance=10)
    with pytest.raises(asyncpg.exceptions.RaiseError):
        await pool.execute("UPDATE ledger_entries SET amount = 1")
    await accounts.top_up(pool, account_id, "after-refusal", 5)
    assert await pool.fetchval("SELECT sum(amount) FROM ledger_entries WHERE account_id = $1", account_id) == 15
    await assert_audit_clean(pool, account_id)


@pytest.mark.parametrize("how", ["DISABLE", "ENABLE"])
async def test_audit_reports_a_trigger_that_no_longer_always_fires(pool, how):
    """A superuser who disables a ledger trigger, or re-enables it without ALWAYS (replica mode would skip it), shows up as I5."""
    await make_account(pool, balance=10)
    await pool.execute(f"ALTER TABLE ledger_entries {how} TRIGGER ledger_entries_no_update_delete")
    report = await audit(pool)
    assert [(v.invariant, v.detail) for v in report.violations] == [
        ("I5", "trigger ledger_entries_no_update_delete on ledger_entries is not enabled always")]
    await pool.execute("ALTER TABLE ledger_entries ENABLE ALWAYS TRIGGER ledger_entries_no_update_delete")
    await assert_audit_clean(pool)


async def test_audit_reports_an_append_only_function_that_no_longer_refuses(pool):
    """The triggers still exist and are ENABLE ALWAYS, but their function was replaced by one that lets
    every row through: UPDATE works again, and the audit reports the function (once, for both triggers) as I5."""
    account_id = await make_account(pool, balance=10)
    await pool.execute(
        "CREATE OR REPLACE FUNCTION ledger_entries_append_only() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN IF TG_OP = 'DELETE' THEN RETURN OLD; END IF; RETURN NEW; END; $$")
    await pool.execute("UPDATE ledger_entries SET note = 'edited' WHERE account_id = $1", account_id)  # the harm
    report = await audit(pool)
    assert [v.invariant for v in report.violations] == ["I5"]
    assert report.violations[0].detail.startswith(
        "function ledger_entries_append_only() of trigger ledger_entries_no_update_delete on ledger_entries"
        " is not the one the migrations create: plpgsql source sha256 ")
    await pool.execute(APPEND_ONLY_FUNCTION.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    await assert_audit_clean(pool)


@pytest.mark.parametrize("redefined", [
    "BEFORE DELETE ON ledger_entries FOR EACH ROW",  # UPDATE no longer refused
    "BEFORE UPDATE OR DELETE ON ledger_entries FOR EACH ROW WHEN (false)",  # never fires
    "BEFORE UPDATE OF amount OR DELETE ON ledger_entries FOR EACH ROW",  # other columns editable
])
async def test_audit_reports_an_append_only_trigger_recreated_differently(pool, redefined):
    """The trigger recreated under its own name, ENABLE ALWAYS, firing on less than the migration's: I5, naming it."""
    await make_account(pool, balance=10)
    await recreate_trigger(pool, "ledger_entries", "ledger_entries_no_update_delete",
                           f"{redefined} EXECUTE FUNCTION ledger_entries_append_only()")
    report = await audit(pool)
    assert [v.invariant for v in report.violations] == ["I5"]
    assert report.violations[0].detail.startswith(
        "trigger ledger_entries_no_update_delete on ledger_entries is not the one the migrations create: it is `")
