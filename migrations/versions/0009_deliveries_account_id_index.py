"""deliveries by account in id order: the index an account's pages of deliveries are read through

GET /v1/deliveries reads an account's deliveries newest first by id. Without an index on
(account_id, id) a page either walks the primary key backwards past every other account's newer
rows, or reads and sorts every delivery of the account; PostgreSQL's generic plan for the page
statement, which it keeps after five runs on a connection, did the second for a big account.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(op.f("ix_deliveries_account_id_id"), "deliveries", ["account_id", "id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_deliveries_account_id_id"), table_name="deliveries")
