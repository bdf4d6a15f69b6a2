"""Operational events: an outbox written by the changes that cause them, endpoints to send them to.

operational_endpoints: where an account wants its operational events (its own whsec_ secret,
sealed at rest, an event type filter). operational_events: the outbox, one row per event,
written in the transaction of its cause by the triggers of billing.operational_outbox (on
endpoints, deliveries, ledger_entries and accounts) or by its functions. operational_deliveries:
one per event and subscribed operational endpoint, sent by the worker, retried on the schedule,
never charged. accounts gains low_balance_threshold (NULL: off) and the two flags that make
balance.low once per crossing and balance.exhausted once per run of refusals.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

from billing import operational_outbox
from billing.tables import OPERATIONAL_DEAD_BATCH_MAX, OPERATIONAL_EVENT_TYPES

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def _in(column: str, values) -> str:
    return f"{column} IN ({', '.join(repr(value) for value in values)})"


def upgrade() -> None:
    op.add_column("accounts", sa.Column("low_balance_threshold", sa.BigInteger))
    op.add_column("accounts", sa.Column("low_balance_armed", sa.Boolean, nullable=False, server_default=sa.true()))
    op.add_column("accounts", sa.Column("balance_exhausted_armed", sa.Boolean, nullable=False,
                                        server_default=sa.true()))
    op.create_check_constraint(op.f("ck_accounts_low_balance_threshold_positive"), "accounts",
                               "low_balance_threshold IS NULL OR low_balance_threshold > 0")
    op.create_table(
        "operational_endpoints",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("account_id", pg.UUID(as_uuid=True), sa.ForeignKey("accounts.id", name=op.f("fk_operational_endpoints_account_id")),
                  nullable=False),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("description", sa.Text, nullable=False, server_default=""),
        sa.Column("event_types", pg.ARRAY(sa.Text)),
        sa.Column("secret", sa.LargeBinary),
        sa.Column("enabled", sa.Boolean, nullable=False, server_default=sa.true()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("deleted_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("char_length(url) BETWEEN 1 AND 2048", name=op.f("ck_operational_endpoints_url_length")),
        sa.CheckConstraint("char_length(description) BETWEEN 0 AND 1000",
                           name=op.f("ck_operational_endpoints_description_length")),
        sa.CheckConstraint(f"cardinality(event_types) BETWEEN 1 AND {len(OPERATIONAL_EVENT_TYPES)}",
                           name=op.f("ck_operational_endpoints_event_types_count")),
        sa.CheckConstraint("octet_length(secret) <= 1024", name=op.f("ck_operational_endpoints_secret_length")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_operational_endpoints")),
        comment="Where an account's operational events go (its own whsec_ secret, encrypted at rest). Free of charge;"
                " event_types NULL means every type.",
    )
    op.create_index(op.f("ix_operational_endpoints_account_id"), "operational_endpoints", ["account_id"])
    op.create_table(
        "operational_events",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("seq", sa.BigInteger, sa.Identity(always=True), nullable=False),
        sa.Column("account_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("data", pg.JSONB, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("dispatched_at", sa.DateTime(timezone=True)),
        sa.Column("batch_key", sa.Text),
        sa.Column("batch_size", sa.Integer, nullable=False, server_default="1"),
        sa.Column("dedupe_key", sa.Text),
        sa.CheckConstraint(_in("type", OPERATIONAL_EVENT_TYPES), name=op.f("ck_operational_events_type")),
        sa.CheckConstraint("octet_length(data::text) <= 262144", name=op.f("ck_operational_events_data_size")),
        sa.CheckConstraint(f"batch_size BETWEEN 1 AND {OPERATIONAL_DEAD_BATCH_MAX}",
                           name=op.f("ck_operational_events_batch_size_range")),
        sa.CheckConstraint("batch_key IS NULL OR char_length(batch_key) BETWEEN 1 AND 200",
                           name=op.f("ck_operational_events_batch_key_length")),
        sa.CheckConstraint("dedupe_key IS NULL OR char_length(dedupe_key) BETWEEN 1 AND 300",
                           name=op.f("ck_operational_events_dedupe_key_length")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_operational_events")),
        sa.UniqueConstraint("seq", name=op.f("uq_operational_events_seq")),
        sa.UniqueConstraint("account_id", "dedupe_key", name=op.f("uq_operational_events_account_id_dedupe_key")),
        comment="The outbox of operational events: each written in the transaction of the change that causes it"
                " (billing.operational_outbox), never charged, never in the ledger.",
    )
    op.create_index(op.f("ix_operational_events_account_id_seq"), "operational_events", ["account_id", "seq"])
    op.create_index("ix_operational_events_undispatched", "operational_events", ["seq"],
                    postgresql_where=sa.text("dispatched_at IS NULL"))
    op.create_index("ix_operational_events_open_batch", "operational_events", ["batch_key"],
                    postgresql_where=sa.text("dispatched_at IS NULL AND batch_key IS NOT NULL"))
    op.create_table(
        "operational_deliveries",
        sa.Column("id", pg.UUID(as_uuid=True), primary_key=True),
        sa.Column("account_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("event_id", pg.UUID(as_uuid=True),
                  sa.ForeignKey("operational_events.id", name=op.f("fk_operational_deliveries_event_id")), nullable=False),
        sa.Column("endpoint_id", pg.UUID(as_uuid=True),
                  sa.ForeignKey("operational_endpoints.id", name=op.f("fk_operational_deliveries_endpoint_id")),
                  nullable=False),
        sa.Column("state", sa.Text, nullable=False, server_default="pending"),
        sa.Column("attempt", sa.Integer, nullable=False, server_default="0"),
        sa.Column("attempts_max", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("leased_until", sa.DateTime(timezone=True)),
        sa.Column("last_status_code", sa.Integer),
        sa.Column("last_error", sa.Text),
        sa.Column("dead_reason", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("state IN ('pending', 'sending', 'delivered', 'dead')",
                           name=op.f("ck_operational_deliveries_state")),
        sa.CheckConstraint("dead_reason IS NULL OR dead_reason IN ('out_of_retries', 'endpoint_disabled',"
                           " 'endpoint_deleted', 'attempts_exhausted', 'account_closed')", name=op.f("ck_operational_deliveries_dead_reason")),
        sa.CheckConstraint("(state = 'dead') = (dead_reason IS NOT NULL)",
                           name=op.f("ck_operational_deliveries_dead_has_reason")),
        sa.CheckConstraint("attempt >= 0 AND attempt <= attempts_max", name=op.f("ck_operational_deliveries_attempt_range")),
        sa.CheckConstraint("attempts_max BETWEEN 1 AND 50", name=op.f("ck_operational_deliveries_attempts_max_range")),
        sa.CheckConstraint("(state = 'sending') = (leased_until IS NOT NULL)",
                           name=op.f("ck_operational_deliveries_lease_only_when_sending")),
        sa.CheckConstraint("last_status_code IS NULL OR last_status_code BETWEEN 100 AND 599",
                           name=op.f("ck_operational_deliveries_status_code_range")),
        sa.CheckConstraint("last_error IS NULL OR char_length(last_error) BETWEEN 1 AND 1000",
                           name=op.f("ck_operational_deliveries_last_error_length")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_operational_deliveries")),
        sa.UniqueConstraint("event_id", "endpoint_id", name=op.f("uq_operational_deliveries_event_id_endpoint_id")),
        comment="One operational event to one operational endpoint: signed, retried on the schedule, dead after the last"
                " attempt, free (no price, no ledger entry).",
    )
    op.create_index("ix_operational_deliveries_due", "operational_deliveries", ["next_attempt_at"],
                    postgresql_where=sa.text("state = 'pending'"))
    op.create_index("ix_operational_deliveries_lease", "operational_deliveries", ["leased_until"],
                    postgresql_where=sa.text("state = 'sending'"))
    op.create_index(op.f("ix_operational_deliveries_account_id"), "operational_deliveries", ["account_id"])
    for statement in operational_outbox.CREATE_STATEMENTS:
        op.execute(statement)


def downgrade() -> None:
    for statement in operational_outbox.DROP_STATEMENTS:
        op.execute(statement)
    op.drop_table("operational_deliveries")
    op.drop_table("operational_events")
    op.drop_table("operational_endpoints")
    op.drop_constraint(op.f("ck_accounts_low_balance_threshold_positive"), "accounts", type_="check")
    op.drop_column("accounts", "balance_exhausted_armed")
    op.drop_column("accounts", "low_balance_armed")
    op.drop_column("accounts", "low_balance_threshold")
