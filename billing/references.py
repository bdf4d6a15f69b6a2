"""Referential integrity of the high-volume tables, checked once per statement instead of per row.

A foreign key checks each inserted row on its own: one query through the executor per row and
per key. The create path writes a message, a delivery per endpoint and a charge per delivery, so
at fan-out 1 that was five such checks per message, about a third of PostgreSQL's CPU on ingest
(`scripts/bench_ingest.py` prints that CPU; see README, Performance). Here each INSERT statement
runs one check over all its rows (an AFTER ... FOR EACH STATEMENT trigger over the inserted rows),
and the checks say more than the foreign keys did: a child row's account must be its parent's
(which a composite foreign key could say only with one more unique index on each parent).

  messages.account_id          names an account
  deliveries                   its message and its endpoint belong to its own account
  ledger_entries               an entry for a delivery names that delivery, of its own account;
                               any other entry names an account
  delivery_attempts            its delivery belongs to its own account

(An account that a delivery or a ledger entry names exists because its message's account was
checked, and accounts are never deleted.)

A foreign key also stops a referenced row from being deleted or re-keyed while rows point at it.
The referenced rows here are never deleted: the history is what the ledger proves. So instead of
that check, triggers refuse DELETE and TRUNCATE on accounts, endpoints, messages and deliveries,
and refuse an UPDATE that changes an id or a reference (an account is closed by its status, an
endpoint by deleted_at, a message's payload is erased by setting it to NULL). The triggers are
ENABLE ALWAYS, so unlike foreign keys they hold even under session_replication_role = replica.

Violations raise SQLSTATE 23503 (foreign_key_violation, asyncpg.ForeignKeyViolationError) as the
foreign keys did; refused deletes and key changes raise 23001 (restrict_violation).
"""

from __future__ import annotations

# The tables whose foreign keys these checks replace, with the constraint names the migration drops.
REPLACED_FOREIGN_KEYS = (
    ("messages", "fk_messages_account_id", "account_id", "accounts"),
    ("deliveries", "fk_deliveries_account_id", "account_id", "accounts"),
    ("deliveries", "fk_deliveries_message_id", "message_id", "messages"),
    ("deliveries", "fk_deliveries_endpoint_id", "endpoint_id", "endpoints"),
    ("ledger_entries", "fk_ledger_entries_account_id", "account_id", "accounts"),
    ("delivery_attempts", "fk_delivery_attempts_delivery_id", "delivery_id", "deliveries"),
)

# Each check is a scalar subquery per inserted row: an index probe of the parent's primary key,
# whatever the planner thinks of the transition table's size (NOT EXISTS let it choose a hash
# anti-join that read all of messages: slower than the foreign keys).
_CHECKS = {
    "messages": (
        "(SELECT a.id FROM accounts a WHERE a.id = n.account_id) IS NULL",
        "message % names no account (%)",
        ("id", "account_id"),
    ),
    "deliveries": (
        "(SELECT m.account_id FROM messages m WHERE m.id = n.message_id) IS DISTINCT FROM n.account_id"
        " OR (SELECT e.account_id FROM endpoints e WHERE e.id = n.endpoint_id) IS DISTINCT FROM n.account_id",
        "delivery %: message % and endpoint % must exist and belong to its account %",
        ("id", "message_id", "endpoint_id", "account_id"),
    ),
    "ledger_entries": (
        "CASE WHEN n.delivery_id IS NULL"
        " THEN (SELECT a.id FROM accounts a WHERE a.id = n.account_id) IS NULL"
        " ELSE (SELECT d.account_id FROM deliveries d WHERE d.id = n.delivery_id) IS DISTINCT FROM n.account_id END",
        "ledger entry %: its account % must exist, and its delivery % (if any) must belong to it",
        ("id", "account_id", "delivery_id"),
    ),
    "delivery_attempts": (
        "(SELECT d.account_id FROM deliveries d WHERE d.id = n.delivery_id) IS DISTINCT FROM n.account_id",
        "attempt % of delivery %: the delivery must exist and belong to its account %",
        ("attempt", "delivery_id", "account_id"),
    ),
}

# What may never change once a row exists: its id and what it points at.
_KEYS = {
    "accounts": ("id",),
    "endpoints": ("id", "account_id"),
    "messages": ("id", "account_id"),
    "deliveries": ("id", "account_id", "message_id", "endpoint_id"),
    "delivery_attempts": ("delivery_id", "attempt", "account_id"),
}
NEVER_DELETED = ("accounts", "endpoints", "messages", "deliveries")


def _check_function(table: str, checks: dict = _CHECKS) -> str:
    condition, message, columns = checks[table]
    assert message.count("%") == len(columns), f"{table}: the message's placeholders and columns differ"
    return f"""
CREATE FUNCTION {table}_check_references() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    bad record;
BEGIN
    SELECT {", ".join(f"n.{column}" for column in columns)} INTO bad FROM inserted n WHERE {condition} LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION '{message}', {", ".join(f"bad.{column}" for column in columns)}
            USING ERRCODE = 'foreign_key_violation', TABLE = '{table}';
    END IF;
    RETURN NULL;
END;
$$
"""


REFUSE_FUNCTION = """
CREATE FUNCTION refuse_history_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% on % refused: its rows are referenced and are never deleted or re-keyed', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'restrict_violation', TABLE = TG_TABLE_NAME,
              HINT = 'close an account by its status, an endpoint by deleted_at';
END;
$$
"""


def _triggers() -> list[tuple[str, str, str]]:
    """(table, trigger name, CREATE statement) for every trigger, in order."""
    statements = []
    for table in _CHECKS:
        statements.append((table, f"{table}_references", (
            f"CREATE TRIGGER {table}_references AFTER INSERT ON {table} REFERENCING NEW TABLE AS inserted"
            f" FOR EACH STATEMENT EXECUTE FUNCTION {table}_check_references()"
        )))
    for table, columns in _KEYS.items():
        changed = " OR ".join(f"OLD.{column} IS DISTINCT FROM NEW.{column}" for column in columns)
        statements.append((table, f"{table}_keys_fixed", (
            f"CREATE TRIGGER {table}_keys_fixed BEFORE UPDATE OF {', '.join(columns)} ON {table}"
            f" FOR EACH ROW WHEN ({changed}) EXECUTE FUNCTION refuse_history_change()"
        )))
    for table in NEVER_DELETED:
        statements.append((table, f"{table}_no_delete", (
            f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table}"
            " FOR EACH ROW EXECUTE FUNCTION refuse_history_change()"
        )))
        statements.append((table, f"{table}_no_truncate", (
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table}"
            " FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change()"
        )))
    return statements


def trigger_names() -> list[tuple[str, str]]:
    """(table, trigger) for every trigger here; the audit checks each exists and is ENABLE ALWAYS (I8)."""
    return [(table, name) for table, name, _ in _triggers()]


# A check's plan is made once per session and kept (PL/pgSQL caches it) until the parent's
# statistics change. Planned while a parent looked empty (ANALYZEd before its first rows, and
# autovacuum off or not yet round), a probe became a sequential scan of the parent, and a create
# then cost time in proportion to every message ever written: measured, a batch of 22 creates at
# fan-out 4 went from 7 ms to 180 ms after 6,600 messages, and kept growing. Inside the check
# functions sequential scans are off, so every probe is an index probe whatever the statistics
# say (the transition table has no index and is scanned either way).
PROBE_SETTING = ("enable_seqscan", "off")


def probe_setting_statements() -> list[str]:
    """Pin the check functions to index probes (migration 0006)."""
    name, value = PROBE_SETTING
    return [f"ALTER FUNCTION {table}_check_references() SET {name} = {value}" for table in _CHECKS]


def probe_setting_reset_statements() -> list[str]:
    name, _ = PROBE_SETTING
    return [f"ALTER FUNCTION {table}_check_references() RESET {name}" for table in _CHECKS]


def upgrade_statements() -> list[str]:
    """Drop the replaced foreign keys; create the functions and the triggers, each ENABLE ALWAYS."""
    statements = [f"ALTER TABLE {table} DROP CONSTRAINT {name}" for table, name, _, _ in REPLACED_FOREIGN_KEYS]
    statements += [_check_function(table) for table in _CHECKS]
    statements.append(REFUSE_FUNCTION)
    for table, name, create in _triggers():
        statements.append(create)
        statements.append(f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {name}")
    return statements


def downgrade_statements() -> list[str]:
    """Put the foreign keys back and drop the triggers and functions."""
    statements = [f"DROP TRIGGER {name} ON {table}" for table, name, _ in _triggers()]
    statements += [f"DROP FUNCTION {table}_check_references()" for table in _CHECKS]
    statements.append("DROP FUNCTION refuse_history_change()")
    statements += [
        f"ALTER TABLE {table} ADD CONSTRAINT {name} FOREIGN KEY ({column}) REFERENCES {parent} (id)"
        for table, name, column, parent in REPLACED_FOREIGN_KEYS
    ]
    return statements


# Applications (0016): a message names an application of its own account, and a delivery's message
# and endpoint belong to one application, so a message to one application can never make a
# delivery to another's endpoint, whatever writes it. These replace the messages and deliveries
# checks above from 0016 on (the migrations before it still make those: no applications table
# exists before it). Each still probes one index per parent: the application's key stands for its
# account, which the application's own foreign key guarantees.
APPLICATION_CHECKS = {
    "messages": (
        "NOT coalesce((SELECT ap.account_id = n.account_id FROM applications ap WHERE ap.id = n.application_id), false)",
        "message % names no application % of its account %",
        ("id", "application_id", "account_id"),
    ),
    "deliveries": (
        "NOT coalesce((SELECT m.application_id FROM messages m WHERE m.id = n.message_id AND m.account_id = n.account_id)"
        " = (SELECT e.application_id FROM endpoints e WHERE e.id = n.endpoint_id AND e.account_id = n.account_id), false)",
        "delivery %: message % and endpoint % must exist, belong to its account % and to one application",
        ("id", "message_id", "endpoint_id", "account_id"),
    ),
}


def _replace_checks(checks: dict) -> list[str]:
    """Drop the messages and deliveries checks and make them again from `checks`, ENABLE ALWAYS
    and pinned to index probes, as 0005 and 0006 made them."""
    name, value = PROBE_SETTING
    statements = []
    for table in APPLICATION_CHECKS:
        trigger = f"{table}_references"
        statements += [
            f"DROP TRIGGER {trigger} ON {table}",
            f"DROP FUNCTION {table}_check_references()",
            _check_function(table, checks),
            f"CREATE TRIGGER {trigger} AFTER INSERT ON {table} REFERENCING NEW TABLE AS inserted"
            f" FOR EACH STATEMENT EXECUTE FUNCTION {table}_check_references()",
            f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {trigger}",
            f"ALTER FUNCTION {table}_check_references() SET {name} = {value}",
        ]
    return statements


def application_check_statements() -> list[str]:
    """The messages and deliveries checks that know applications (migration 0016)."""
    return _replace_checks(APPLICATION_CHECKS)


def application_check_reset_statements() -> list[str]:
    """The checks as they were before 0016 (its downgrade)."""
    return _replace_checks(_CHECKS)


# Migration 0024: the checks that probed a parent by its bare id name the child's account too, so
# that on tables distributed (or hash-partitioned) by account_id each probe goes to the one shard
# of that account, and every key probed leads with account_id. Their meaning is unchanged: a row
# of (account_id, id) exists exactly when the parent exists and belongs to that account. The
# deliveries check already names the account in both of its probes.
ACCOUNT_NAMED_CHECKS = {
    "messages": (
        "(SELECT true FROM applications ap WHERE ap.account_id = n.account_id AND ap.id = n.application_id) IS NULL",
        APPLICATION_CHECKS["messages"][1],
        APPLICATION_CHECKS["messages"][2],
    ),
    "ledger_entries": (
        "CASE WHEN n.delivery_id IS NULL"
        " THEN (SELECT a.id FROM accounts a WHERE a.id = n.account_id) IS NULL"
        " ELSE (SELECT true FROM deliveries d WHERE d.account_id = n.account_id AND d.id = n.delivery_id) IS NULL END",
        _CHECKS["ledger_entries"][1],
        _CHECKS["ledger_entries"][2],
    ),
    "delivery_attempts": (
        "(SELECT true FROM deliveries d WHERE d.account_id = n.account_id AND d.id = n.delivery_id) IS NULL",
        _CHECKS["delivery_attempts"][1],
        _CHECKS["delivery_attempts"][2],
    ),
}
# What 0024 replaces, as 0005 and 0016 left them (its downgrade).
_CHECKS_BEFORE_ACCOUNT_NAMED = {
    "messages": APPLICATION_CHECKS["messages"],
    "ledger_entries": _CHECKS["ledger_entries"],
    "delivery_attempts": _CHECKS["delivery_attempts"],
}


def _replace_functions(checks: dict) -> list[str]:
    """CREATE OR REPLACE each check function (its trigger and ENABLE ALWAYS stay as they are), then
    pin it to index probes again: replacing a function resets its SET clauses."""
    name, value = PROBE_SETTING
    statements = []
    for table in checks:
        statements.append(_check_function(table, checks).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
        statements.append(f"ALTER FUNCTION {table}_check_references() SET {name} = {value}")
    return statements


def account_named_check_statements() -> list[str]:
    """The checks that name the account in every probe (migration 0024)."""
    return _replace_functions(ACCOUNT_NAMED_CHECKS)


def account_named_check_reset_statements() -> list[str]:
    """The checks as they were before 0024 (its downgrade)."""
    return _replace_functions(_CHECKS_BEFORE_ACCOUNT_NAMED)
