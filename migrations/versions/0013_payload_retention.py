"""Payload retention and erasure: each account's retention period, who erased a payload and when.

accounts.payload_retention_days (default 30, 1 to 3,650) is how long a finished message's payload
and its attempts' response excerpts are kept; delivery.operations.retention erases them after
that, and POST /v1/messages/{id}/expunge at once. messages.payload_erased_at and _by record the
erasure (not what was erased). ix_messages_retained holds only the payloads still kept, by account
and age: the retention job reads the oldest of each account from it, and an erased payload leaves
it. A payload erased by an account deletion before this revision is marked erased at the
account's deletion time.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-10
"""
import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

_MESSAGES_COMMENT = ("An event an app enqueued. payload is the exact body bytes sent; erased (NULL) by an expunge,"
                     " by retention once its deliveries finished, or when the account is deleted.")
_MESSAGES_COMMENT_BEFORE = ("An event an app enqueued. payload is the exact body bytes sent; erased (NULL) when the"
                            " account is deleted.")


def upgrade() -> None:
    op.add_column("accounts", sa.Column("payload_retention_days", sa.Integer, nullable=False, server_default="30"))
    op.create_check_constraint(op.f("ck_accounts_payload_retention_days_range"), "accounts",
                               "payload_retention_days BETWEEN 1 AND 3650")
    op.add_column("messages", sa.Column("payload_erased_at", sa.DateTime(timezone=True)))
    op.add_column("messages", sa.Column("payload_erased_by", sa.Text))
    op.execute(
        "UPDATE messages m SET payload_erased_at = coalesce(a.deleted_at, now()), payload_erased_by = 'account_deletion'"
        " FROM accounts a WHERE a.id = m.account_id AND m.payload IS NULL"
    )
    op.create_check_constraint(op.f("ck_messages_payload_erased_by_length"), "messages",
                               "payload_erased_by IS NULL OR char_length(payload_erased_by) BETWEEN 1 AND 100")
    op.create_check_constraint(op.f("ck_messages_erased_payload_is_null"), "messages", "payload_erased_at IS NULL OR payload IS NULL")
    op.create_index("ix_messages_retained", "messages", ["account_id", "created_at"],
                    postgresql_where="payload IS NOT NULL")
    op.create_table_comment("messages", _MESSAGES_COMMENT, existing_comment=_MESSAGES_COMMENT_BEFORE)


def downgrade() -> None:
    op.create_table_comment("messages", _MESSAGES_COMMENT_BEFORE, existing_comment=_MESSAGES_COMMENT)
    op.drop_index("ix_messages_retained", table_name="messages")
    op.drop_constraint(op.f("ck_messages_erased_payload_is_null"), "messages", type_="check")
    op.drop_constraint(op.f("ck_messages_payload_erased_by_length"), "messages", type_="check")
    op.drop_column("messages", "payload_erased_by")
    op.drop_column("messages", "payload_erased_at")
    op.drop_constraint(op.f("ck_accounts_payload_retention_days_range"), "accounts", type_="check")
    op.drop_column("accounts", "payload_retention_days")
