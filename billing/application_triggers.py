"""The database's part of applications (migration 0016): every account has its default
application, and rows that name no application go to it.

An account's default application has the account's own id. A trigger makes it with the account,
whoever inserts the account, so every message and endpoint written without an application (the
routes that name none, and any INSERT that leaves the column out) lands in an application that
exists. On messages and endpoints, a BEFORE INSERT trigger fills a missing application_id with the
account's id; its WHEN clause is evaluated without calling the function, so the create path, which
always names the application, pays only that test.

application_counts holds each account's number of live applications, moved by statement-level
triggers (one upsert per statement, however many rows it wrote), so a create checks the bound in
one probe at 10,000 applications as at one.

Applications are never deleted (messages point at them; an application is closed by deleted_at),
and neither an application's keys nor the application of an endpoint or a message change.
"""

from __future__ import annotations

DEFAULT_APPLICATION_NAME = "default"

_FUNCTIONS = (
    f"""
CREATE FUNCTION accounts_make_default_application() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO applications (id, account_id, name, created_at)
        VALUES (NEW.id, NEW.id, '{DEFAULT_APPLICATION_NAME}', NEW.created_at) ON CONFLICT DO NOTHING;
    RETURN NULL;
END;
$$
""",
    """
CREATE FUNCTION default_application() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.application_id := NEW.account_id;
    RETURN NEW;
END;
$$
""",
)

COUNT_FUNCTIONS = (
    """
CREATE FUNCTION applications_count_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO application_counts (account_id, live)
        SELECT account_id, count(*) FROM inserted WHERE deleted_at IS NULL GROUP BY account_id
        ON CONFLICT (account_id) DO UPDATE SET live = application_counts.live + excluded.live;
    RETURN NULL;
END;
$$
""",
    """
CREATE FUNCTION applications_count_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE application_counts c SET live = c.live + moved.change
    FROM (SELECT n.account_id, sum(CASE WHEN o.deleted_at IS NULL THEN -1 ELSE 1 END)::int AS change
          FROM old_rows o JOIN new_rows n ON n.id = o.id
          WHERE (o.deleted_at IS NULL) <> (n.deleted_at IS NULL) GROUP BY n.account_id) AS moved
    WHERE c.account_id = moved.account_id;
    RETURN NULL;
END;
$$
""",
)

# (table, trigger name, CREATE statement)
_TRIGGERS = (
    ("accounts", "accounts_default_application",
     "CREATE TRIGGER accounts_default_application AFTER INSERT ON accounts"
     " FOR EACH ROW EXECUTE FUNCTION accounts_make_default_application()"),
    ("endpoints", "endpoints_default_application",
     "CREATE TRIGGER endpoints_default_application BEFORE INSERT ON endpoints"
     " FOR EACH ROW WHEN (NEW.application_id IS NULL) EXECUTE FUNCTION default_application()"),
    ("messages", "messages_default_application",
     "CREATE TRIGGER messages_default_application BEFORE INSERT ON messages"
     " FOR EACH ROW WHEN (NEW.application_id IS NULL) EXECUTE FUNCTION default_application()"),
    ("endpoints", "endpoints_application_fixed",
     "CREATE TRIGGER endpoints_application_fixed BEFORE UPDATE OF application_id ON endpoints"
     " FOR EACH ROW WHEN (OLD.application_id IS DISTINCT FROM NEW.application_id)"
     " EXECUTE FUNCTION refuse_history_change()"),
    ("messages", "messages_application_fixed",
     "CREATE TRIGGER messages_application_fixed BEFORE UPDATE OF application_id ON messages"
     " FOR EACH ROW WHEN (OLD.application_id IS DISTINCT FROM NEW.application_id)"
     " EXECUTE FUNCTION refuse_history_change()"),
    ("applications", "applications_keys_fixed",
     "CREATE TRIGGER applications_keys_fixed BEFORE UPDATE OF id, account_id ON applications"
     " FOR EACH ROW WHEN (OLD.id IS DISTINCT FROM NEW.id OR OLD.account_id IS DISTINCT FROM NEW.account_id)"
     " EXECUTE FUNCTION refuse_history_change()"),
    ("applications", "applications_no_delete",
     "CREATE TRIGGER applications_no_delete BEFORE DELETE ON applications"
     " FOR EACH ROW EXECUTE FUNCTION refuse_history_change()"),
    ("applications", "applications_count_inserted",
     "CREATE TRIGGER applications_count_inserted AFTER INSERT ON applications REFERENCING NEW TABLE AS inserted"
     " FOR EACH STATEMENT EXECUTE FUNCTION applications_count_inserted()"),
    ("applications", "applications_count_updated",
     "CREATE TRIGGER applications_count_updated AFTER UPDATE ON applications"
     " REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT"
     " EXECUTE FUNCTION applications_count_updated()"),
    ("applications", "applications_no_truncate",
     "CREATE TRIGGER applications_no_truncate BEFORE TRUNCATE ON applications"
     " FOR EACH STATEMENT EXECUTE FUNCTION refuse_history_change()"),
)


def trigger_names() -> list[tuple[str, str]]:
    return [(table, name) for table, name, _ in _TRIGGERS]


def upgrade_statements() -> list[str]:
    """The functions, then each trigger, ENABLE ALWAYS (they hold in replica mode too)."""
    statements = list(_FUNCTIONS) + list(COUNT_FUNCTIONS)
    for table, name, create in _TRIGGERS:
        statements += [create, f"ALTER TABLE {table} ENABLE ALWAYS TRIGGER {name}"]
    return statements


def downgrade_statements() -> list[str]:
    statements = [f"DROP TRIGGER {name} ON {table}" for table, name, _ in _TRIGGERS]
    return statements + ["DROP FUNCTION default_application()", "DROP FUNCTION accounts_make_default_application()",
                         "DROP FUNCTION applications_count_inserted()", "DROP FUNCTION applications_count_updated()"]
