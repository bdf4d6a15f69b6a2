"""The W3C trace context of the request that created a message, kept with it.

messages.trace_context (nullable) holds the `traceparent` of the API request's span when tracing
is on (delivery.tracing): every attempt of every delivery of the message, however much later,
joins that trace. NULL when tracing was off, and for every message written before this revision.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A nullable column without a default: PostgreSQL adds it without rewriting the table.
    op.add_column("messages", sa.Column("trace_context", sa.Text))
    op.create_check_constraint(op.f("ck_messages_trace_context_length"), "messages",
                               "trace_context IS NULL OR char_length(trace_context) BETWEEN 1 AND 128")


def downgrade() -> None:
    op.drop_constraint(op.f("ck_messages_trace_context_length"), "messages", type_="check")
    op.drop_column("messages", "trace_context")
