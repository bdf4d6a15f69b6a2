"""Applications: an account's customers, each with its own endpoints; a message goes to one.
The event catalog, wildcard subscriptions and channels.

Every account gets its default application, whose id is the account's own, and every existing
endpoint and message moves to it (nothing else changes: deliveries follow their message and
endpoint, the ledger is untouched). A trigger makes the default application of each new account,
and rows inserted without an application go to it (billing.application_triggers). The reference
checks of messages and deliveries are made again so that a message names an application of its
account and a delivery's message and endpoint belong to one application (billing.references).

The event catalog: event_types (name, description, an optional JSON Schema, archived), one set
per account. endpoints.event_type_prefixes holds the prefixes of an endpoint's wildcard
subscriptions ("invoice.*"), generated from event_types by event_type_prefixes(). Messages may
carry up to 10 channels, and an endpoint may take only messages of some channels.

The downgrade refuses while any account has an application besides its default (merging their
endpoints into one set per account would send every message to all of them), or while an
endpoint has a wildcard subscription or channels (it would receive other messages than now).
It drops the event catalog and messages' channels.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

from billing import application_triggers, references, tables

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None

_COMMENT = ("One customer of an account's app: its endpoints, and the messages sent to it."
            " The account pays; usage per application is a sum over the ledger.")


def upgrade() -> None:
    op.create_table(
        "applications",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("account_id", pg.UUID(as_uuid=True), sa.ForeignKey("accounts.id", name="fk_applications_account_id"),
                  nullable=False),
        sa.Column("uid", sa.Text),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("metadata", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("rate_limit_per_second", sa.Integer),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("deleted_at", sa.DateTime(timezone=True)),
        sa.PrimaryKeyConstraint("id", name="pk_applications"),
        sa.CheckConstraint("char_length(name) BETWEEN 1 AND 200", name="ck_applications_name_length"),
        sa.CheckConstraint("uid IS NULL OR char_length(uid) BETWEEN 1 AND 256", name="ck_applications_uid_length"),
        sa.CheckConstraint("jsonb_typeof(metadata) = 'object' AND octet_length(metadata::text) <= 16384",
                           name="ck_applications_metadata_size"),
        sa.CheckConstraint("rate_limit_per_second BETWEEN 1 AND 100000", name="ck_applications_rate_limit_range"),
        sa.CheckConstraint("deleted_at IS NULL OR id <> account_id", name="ck_applications_default_not_deleted"),
        sa.UniqueConstraint("account_id", "id", name="uq_applications_account_id_id"),
        comment=_COMMENT,
    )
    op.create_index("uq_applications_live_uid", "applications", ["account_id", "uid"], unique=True,
                    postgresql_where="deleted_at IS NULL AND uid IS NOT NULL")
    op.execute("INSERT INTO applications (id, account_id, name, created_at)"
               f" SELECT id, id, '{application_triggers.DEFAULT_APPLICATION_NAME}', created_at FROM accounts")

    op.add_column("endpoints", sa.Column("application_id", pg.UUID(as_uuid=True)))
    op.execute("UPDATE endpoints SET application_id = account_id")
    op.alter_column("endpoints", "application_id", nullable=False)
    op.create_foreign_key("fk_endpoints_application", "endpoints", "applications",
                          ["account_id", "application_id"], ["account_id", "id"])
    op.create_index("ix_endpoints_application_id_account_id", "endpoints", ["application_id", "account_id"])

    op.add_column("messages", sa.Column("application_id", pg.UUID(as_uuid=True)))
    op.execute("UPDATE messages SET application_id = account_id")
    op.alter_column("messages", "application_id", nullable=False)

    op.create_table(
        "application_counts",
        sa.Column("account_id", pg.UUID(as_uuid=True), sa.ForeignKey("accounts.id", name="fk_application_counts_account_id"),
                  primary_key=True),
        sa.Column("live", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("account_id", name="pk_application_counts"),
        sa.CheckConstraint("live >= 0", name="ck_application_counts_live_non_negative"),
        comment="How many live applications each account has (0016), kept by triggers on applications: what the"
                " per-account bound is checked against, in one probe however many there are.",
    )
    op.execute("INSERT INTO application_counts (account_id, live)"
               " SELECT account_id, count(*) FROM applications WHERE deleted_at IS NULL GROUP BY account_id")
    for statement in application_triggers.upgrade_statements() + references.application_check_statements():
        op.execute(statement)

    op.create_table(
        "event_types",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("account_id", pg.UUID(as_uuid=True), sa.ForeignKey("accounts.id", name="fk_event_types_account_id"),
                  nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("description", sa.Text, nullable=False, server_default=""),
        sa.Column("schema", pg.JSONB),
        sa.Column("archived", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.PrimaryKeyConstraint("id", name="pk_event_types"),
        sa.CheckConstraint("char_length(name) BETWEEN 1 AND 256", name="ck_event_types_name_length"),
        sa.CheckConstraint("char_length(description) BETWEEN 0 AND 1000", name="ck_event_types_description_length"),
        sa.CheckConstraint("jsonb_typeof(schema) IN ('object', 'boolean') AND octet_length(schema::text) <= 65536",
                           name="ck_event_types_schema_size"),
        sa.UniqueConstraint("account_id", "name", name="uq_event_types_account_id_name"),
        comment="An account's catalog of event types (0016): what each means and, with a schema, what its payload must be.",
    )
    op.execute(tables.EVENT_TYPE_PREFIXES_FUNCTION)
    op.add_column("endpoints", sa.Column("channels", pg.ARRAY(sa.Text)))
    op.add_column("endpoints", sa.Column("event_type_prefixes", pg.ARRAY(sa.Text),
                                         sa.Computed("event_type_prefixes(event_types)", persisted=True)))
    op.create_check_constraint("ck_endpoints_channels_count", "endpoints", "cardinality(channels) BETWEEN 1 AND 100")
    op.add_column("messages", sa.Column("channels", pg.ARRAY(sa.Text)))
    op.create_check_constraint("ck_messages_channels_count", "messages", "cardinality(channels) BETWEEN 1 AND 10")

    for table, comment in (
        ("portal_links", "Single-use magic links into an application's portal (0016); only the token's SHA-256 is kept."),
        ("portal_sessions", "Portal sign-ins (0016): one application's customer, for at most 8 hours; only the token's"
                            " SHA-256 is kept."),
    ):
        op.create_table(
            table,
            sa.Column("token_hash", sa.LargeBinary, primary_key=True),
            sa.Column("account_id", pg.UUID(as_uuid=True), nullable=False),
            sa.Column("application_id", pg.UUID(as_uuid=True), nullable=False),
            sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
            sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
            *([sa.Column("used_at", sa.DateTime(timezone=True))] if table == "portal_links" else []),
            sa.PrimaryKeyConstraint("token_hash", name=f"pk_{table}"),
            sa.CheckConstraint("octet_length(token_hash) = 32", name=f"ck_{table}_token_hash_length"),
            sa.CheckConstraint("expires_at > created_at", name=f"ck_{table}_expires_after_created"),
            sa.ForeignKeyConstraint(["account_id", "application_id"], ["applications.account_id", "applications.id"],
                                    name=f"fk_{table}_application"),
            comment=comment,
        )
        op.create_index(f"ix_{table}_expires_at", table, ["expires_at"])


def downgrade() -> None:
    op.execute(
        "DO $$ BEGIN IF EXISTS (SELECT FROM applications WHERE id <> account_id) THEN"
        " RAISE EXCEPTION 'applications other than the accounts'' defaults exist: downgrading would merge their"
        " endpoints into one set per account'; END IF;"
        " IF EXISTS (SELECT FROM endpoints WHERE event_type_prefixes IS NOT NULL OR channels IS NOT NULL) THEN"
        " RAISE EXCEPTION 'endpoints with wildcard subscriptions or channels exist: downgraded, they would"
        " receive other messages than now'; END IF; END $$"
    )
    op.drop_table("portal_sessions")
    op.drop_table("portal_links")
    op.drop_constraint("ck_messages_channels_count", "messages", type_="check")
    op.drop_column("messages", "channels")
    op.drop_constraint("ck_endpoints_channels_count", "endpoints", type_="check")
    op.drop_column("endpoints", "event_type_prefixes")
    op.drop_column("endpoints", "channels")
    op.execute("DROP FUNCTION event_type_prefixes(text[])")
    op.drop_table("event_types")
    for statement in references.application_check_reset_statements() + application_triggers.downgrade_statements():
        op.execute(statement)
    op.drop_table("application_counts")
    op.drop_column("messages", "application_id")
    op.drop_index("ix_endpoints_application_id_account_id", table_name="endpoints")
    op.drop_constraint("fk_endpoints_application", "endpoints", type_="foreignkey")
    op.drop_column("endpoints", "application_id")
    op.drop_index("uq_applications_live_uid", table_name="applications")
    op.drop_table("applications")
