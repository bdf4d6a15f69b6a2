"""The database checks references of the hot tables once per statement (billing.references).

Every refusal below is a raw SQL write around the app: the app never makes one, and the
database must refuse it whoever sends it, a superuser in replica mode included (where foreign
keys would not have fired).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import asyncpg
import pytest

from billing import ids, messages, references
from billing.audit import audit
from billing.references import probe_setting_reset_statements, trigger_names, upgrade_statements
from ledger_helpers import add_endpoint, assert_audit_clean, create, make_account, recreate_trigger, row_counts


@dataclass
class World:
    """Two accounts, each with an endpoint and one created message (one delivery, one charge)."""

    a: uuid.UUID
    b: uuid.UUID
    endpoint_a: uuid.UUID
    endpoint_b: uuid.UUID
    message_a: uuid.UUID
    message_b: uuid.UUID
    delivery_a: uuid.UUID
    delivery_b: uuid.UUID


@pytest.fixture
async def world(pool) -> World:
    a, b = await make_account(pool, balance=10), await make_account(pool, balance=10)
    endpoint_a, endpoint_b = await add_endpoint(pool, a), await add_endpoint(pool, b)
    created_a, created_b = await create(pool, a), await create(pool, b)
    return World(a, b, endpoint_a, endpoint_b, created_a.message_id, created_b.message_id,
                  created_a.deliveries[0].id, created_b.deliveries[0].id)


_MESSAGE = "INSERT INTO messages (id, account_id, event_type, payload) VALUES ($1, $2, 'raw', '\\x00')"
_DELIVERY = ("INSERT INTO deliveries (id, account_id, message_id, endpoint_id, price, attempts_max)"
             " VALUES ($1, $2, $3, $4, 1, 3)")
_CHARGE = "INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount) VALUES ($1, $2, $3, 'charge', -1)"
_REFUND = "INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount) VALUES ($1, $2, $3, 'refund', 1)"
_TOPUP = "INSERT INTO ledger_entries (id, account_id, kind, amount) VALUES ($1, $2, 'topup', 5)"
_ATTEMPT = ("INSERT INTO delivery_attempts (delivery_id, attempt, account_id, started_at, status_code)"
            " VALUES ($1, 1, $2, now(), 500)")


# Each case: the statement and its arguments, from the world, a fresh id and an id nothing has.
_REFUSED_INSERTS = {
    "message of an unknown account": lambda w, new, unknown: (_MESSAGE, new, unknown),
    "delivery of an unknown message": lambda w, new, unknown: (_DELIVERY, new, w.a, unknown, w.endpoint_a),
    "delivery to an unknown endpoint": lambda w, new, unknown: (_DELIVERY, new, w.a, w.message_a, unknown),
    "delivery of another account's message": lambda w, new, unknown: (_DELIVERY, new, w.a, w.message_b, w.endpoint_a),
    "delivery to another account's endpoint": lambda w, new, unknown: (_DELIVERY, new, w.a, w.message_a, w.endpoint_b),
    "delivery of an unknown account": lambda w, new, unknown: (_DELIVERY, new, unknown, w.message_a, w.endpoint_a),
    "charge of an unknown delivery": lambda w, new, unknown: (_CHARGE, ids.charge_id(new), w.a, new),
    "refund on another account than its delivery's":
        lambda w, new, unknown: (_REFUND, ids.refund_id(w.delivery_b), w.a, w.delivery_b),
    "top-up of an unknown account": lambda w, new, unknown: (_TOPUP, f"topup:{new}", unknown),
    "attempt of an unknown delivery": lambda w, new, unknown: (_ATTEMPT, unknown, w.a),
    "attempt on another account than its delivery's": lambda w, new, unknown: (_ATTEMPT, w.delivery_b, w.a),
}


@pytest.mark.parametrize("replica", [False, True], ids=["origin", "replica"])
@pytest.mark.parametrize("case", list(_REFUSED_INSERTS))
async def test_a_write_with_a_broken_reference_is_refused_and_writes_nothing(pool, world, case, replica):
    statement, *arguments = _REFUSED_INSERTS[case](world, ids.new_id(), uuid.uuid4())
    before = await row_counts(pool)
    async with pool.acquire() as connection:
        if replica:
            await connection.execute("SET session_replication_role = replica")
        try:
            with pytest.raises(asyncpg.ForeignKeyViolationError):
                await connection.execute(statement, *arguments)
        finally:
            await connection.execute("RESET session_replication_role")
    assert await row_counts(pool) == before
    await assert_audit_clean(pool)


async def test_the_same_rows_with_sound_references_are_accepted(pool, world):
    """The refusals above are about the references alone: fixed, each write goes in (and the audit
    then sees a hand-written history, which is not what this test is about)."""
    message, delivery = ids.new_id(), ids.new_id()
    async with pool.acquire() as connection, connection.transaction():
        await connection.execute(_MESSAGE, message, world.a)
        await connection.execute(_DELIVERY, delivery, world.a, message, world.endpoint_a)
        await connection.execute(_CHARGE, ids.charge_id(delivery), world.a, delivery)
        await connection.execute(_TOPUP, f"topup:{ids.new_id()}", world.a)
        await connection.execute(_ATTEMPT, world.delivery_a, world.a)
    assert await pool.fetchval("SELECT count(*) FROM deliveries WHERE id = $1", delivery) == 1


async def test_one_bad_row_refuses_the_whole_statement(pool, world):
    """A multi-row insert with one broken reference among good rows writes none of them."""
    good = [ids.new_id() for _ in range(50)]
    bad = ids.new_id()
    async with pool.acquire() as connection:
        for offender in (0, 25, 50):
            rows = good[:offender] + [bad] + good[offender:]
            accounts = [world.a] * len(rows)
            accounts[offender] = world.b  # the message of b, claimed by a's delivery below
            with pytest.raises(asyncpg.ForeignKeyViolationError, match="belong to its account"):
                async with connection.transaction():
                    await connection.execute(
                        "INSERT INTO messages (id, account_id, event_type, payload)"
                        " SELECT unnest($1::uuid[]), unnest($2::uuid[]), 'raw', '\\x00'", rows, accounts)
                    await connection.execute(
                        "INSERT INTO deliveries (id, account_id, message_id, endpoint_id, price, attempts_max)"
                        " SELECT m, $2, m, $3, 1, 3 FROM unnest($1::uuid[]) AS m", rows, world.a, world.endpoint_a)
    assert await pool.fetchval("SELECT count(*) FROM messages WHERE id = ANY($1::uuid[])", good + [bad]) == 0


_REFUSED_CHANGES = [
    "DELETE FROM accounts",
    "DELETE FROM endpoints",
    "DELETE FROM messages",
    "DELETE FROM deliveries",
    "TRUNCATE accounts CASCADE",
    "TRUNCATE endpoints CASCADE",
    "TRUNCATE messages CASCADE",
    "TRUNCATE deliveries CASCADE",
    "UPDATE accounts SET id = gen_random_uuid()",
    "UPDATE endpoints SET account_id = (SELECT max(id::text)::uuid FROM accounts)",
    "UPDATE messages SET account_id = (SELECT max(id::text)::uuid FROM accounts)",
    "UPDATE deliveries SET endpoint_id = (SELECT max(id::text)::uuid FROM endpoints)",
    "UPDATE deliveries SET message_id = (SELECT max(id::text)::uuid FROM messages)",
    "UPDATE deliveries SET account_id = (SELECT max(id::text)::uuid FROM accounts)",
    "UPDATE delivery_attempts SET account_id = gen_random_uuid()",
]


async def _snapshot(connection) -> dict:
    tables = ("accounts", "endpoints", "messages", "deliveries", "delivery_attempts", "ledger_entries")
    return {table: sorted(map(tuple, await connection.fetch(f"SELECT * FROM {table}")), key=repr) for table in tables}


@pytest.mark.parametrize("replica", [False, True], ids=["origin", "replica"])
@pytest.mark.parametrize("statement", _REFUSED_CHANGES)
async def test_referenced_rows_are_never_deleted_or_rekeyed(pool, world, statement, replica):
    await pool.execute(_ATTEMPT, world.delivery_a, world.a)
    async with pool.acquire() as connection:
        before = await _snapshot(connection)
        if replica:
            await connection.execute("SET session_replication_role = replica")
        try:
            with pytest.raises((asyncpg.RestrictViolationError, asyncpg.RaiseError)):
                await connection.execute(statement)
        finally:
            await connection.execute("RESET session_replication_role")
        assert await _snapshot(connection) == before


async def test_updates_that_keep_the_keys_still_work(pool, world):
    """The app's own updates (balances, soft deletes, erasing a payload) and a no-op key update pass."""
    await pool.execute("UPDATE accounts SET balance = balance WHERE id = $1", world.a)
    await pool.execute("UPDATE endpoints SET deleted_at = now() WHERE id = $1", world.endpoint_b)
    await pool.execute("UPDATE messages SET payload = NULL WHERE id = $1", world.message_b)
    await pool.execute("UPDATE deliveries SET account_id = account_id, message_id = message_id")
    assert await pool.fetchval("SELECT payload FROM messages WHERE id = $1", world.message_b) is None


@pytest.mark.parametrize("how", ["DISABLE", "ENABLE"])
async def test_audit_reports_a_reference_trigger_that_no_longer_always_fires(pool, how):
    """Each reference trigger disabled, or enabled without ALWAYS, is I8, naming it."""
    await make_account(pool, balance=1)
    await assert_audit_clean(pool)
    for table, name in trigger_names():
        await pool.execute(f"ALTER TABLE {table} {how} TRIGGER {name}")
        report = await audit(pool)
        assert [(v.invariant, v.detail) for v in report.violations] == [("I8", f"trigger {name} on {table} is not enabled always")]
        await pool.execute(f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {name}")
    await assert_audit_clean(pool)


async def _sequential_scans_by_creates(connection, account_id: uuid.UUID, batches: int) -> dict[str, int]:
    """Sequential scans of messages and deliveries (the parents that only the reference checks read
    on this path) by `batches` creates of ten messages each, counted inside one transaction on
    this one connection, so the check functions' cached plans are the ones reused."""
    # Summed over each table's partitions when it has them (HOOKLEDGER_ACCOUNT_PARTITIONS, 0023).
    query = ("SELECT t.name, sum(s.seq_scan)::int FROM unnest(ARRAY['messages', 'deliveries']) AS t(name)"
             " JOIN pg_stat_xact_user_tables s ON s.relid = t.name::regclass"
             "   OR s.relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = t.name::regclass)"
             " GROUP BY t.name ORDER BY t.name")
    transaction = connection.transaction()
    await transaction.start()
    try:
        before = dict(await connection.fetch(query))
        for _ in range(batches):
            requests = [messages.MessageRequest(account_id, "invoice.paid", b"{}") for _ in range(10)]
            results = await messages.create_messages(connection, requests, attempts_max=3)
            assert all(isinstance(result, messages.MessageCreated) for result in results), results
        after = dict(await connection.fetch(query))
    finally:
        await transaction.rollback()  # the tables are empty again for the next measurement
    return {table: after[table] - before.get(table, 0) for table in after}


async def test_reference_checks_probe_indexes_even_when_planned_on_empty_statistics(pool):
    """ANALYZE while the tables are empty (a fresh install, autovacuum not yet round): the check
    functions plan their probes once per session, and with those statistics a sequential scan of
    the parent looks cheapest. Pinned to index probes, creates read no parent sequentially; with
    the pin reset, the same creates scan a parent for every row they insert, and would slow down
    with every message written."""
    account = await make_account(pool, balance=1_000)
    await add_endpoint(pool, account)
    await pool.execute("ANALYZE")
    async with pool.acquire() as connection:
        assert await _sequential_scans_by_creates(connection, account, batches=20) == {"deliveries": 0, "messages": 0}
    for statement in probe_setting_reset_statements():
        await pool.execute(statement)
    await pool.execute("ANALYZE")
    async with pool.acquire() as connection:
        unpinned = await _sequential_scans_by_creates(connection, account, batches=20)
    assert unpinned["messages"] >= 20 and unpinned["deliveries"] >= 20, unpinned


def _installed_function(name: str) -> str:
    """The last statement the migrations run that makes `name` (0005's, or 0016's or 0024's that
    replace it), as CREATE OR REPLACE."""
    made = [s.lstrip() for s in (*upgrade_statements(), *references.application_check_statements(),
                                 *references.account_named_check_statements())]
    statement = [s for s in made if s.replace("CREATE OR REPLACE FUNCTION", "CREATE FUNCTION", 1)
                 .startswith(f"CREATE FUNCTION {name}()")][-1]
    return statement.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)


@pytest.mark.parametrize("function, blamed", [
    ("ledger_entries_check_references", "trigger ledger_entries_references on ledger_entries"),
    # One function behind thirteen triggers: reported once, with the first trigger that calls it.
    ("refuse_history_change", "trigger accounts_keys_fixed on accounts"),
])
async def test_audit_reports_a_reference_function_made_a_no_op(pool, function, blamed):
    """A check function replaced by one that lets every row through, its triggers untouched: I8, naming the function."""
    account_id = await make_account(pool, balance=1)
    await pool.execute(f"CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$"
                       " BEGIN RETURN NULL; END; $$")
    if function == "ledger_entries_check_references":  # the harm: an entry on no account now goes in
        await pool.execute("INSERT INTO ledger_entries (id, account_id, kind, amount) VALUES ('topup:ghost', $1,"
                           " 'topup', 5)", uuid.uuid4())
    report = await audit(pool, account_id)
    assert [v.invariant for v in report.violations] == ["I8"]
    assert report.violations[0].detail.startswith(
        f"function {function}() of {blamed} is not the one the migrations create: plpgsql source sha256 ")
    await pool.execute(_installed_function(function))
    assert (await audit(pool, account_id)).clean


async def test_audit_reports_a_reference_trigger_recreated_differently(pool):
    """A keep-history trigger recreated under its name, ENABLE ALWAYS, with a WHEN that never holds: I8, naming it."""
    await make_account(pool, balance=1)
    await recreate_trigger(pool, "deliveries", "deliveries_keys_fixed",
                           "BEFORE UPDATE OF id, account_id, message_id, endpoint_id ON deliveries FOR EACH ROW"
                           " WHEN (OLD.id IS DISTINCT FROM OLD.id) EXECUTE FUNCTION refuse_history_change()")
    report = await audit(pool)
    assert [v.invariant for v in report.violations] == ["I8"]
    assert report.violations[0].detail.startswith(
        "trigger deliveries_keys_fixed on deliveries is not the one the migrations create: it is `")
