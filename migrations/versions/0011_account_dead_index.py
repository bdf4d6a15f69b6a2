"""An account's dead deliveries in id order: its pages of GET /v1/deliveries?state=dead

An account's deliveries page newest first by id (ix_deliveries_account_id_id, 0009), and its live
ones (pending, sending) have ix_deliveries_account_live. Its dead ones had no index of their own:
a page of them walked the account's deliveries past every delivered one (twenty rows for each
dead one kept, at one in twenty dead), or walked ix_deliveries_dead (every account's dead ones,
0010) past another account's; in a generic plan, where the state was a parameter, every row of
the account (30,000 for a page of 50). This index holds the dead ones only: an entry is written
when a delivery dies, on no other write, as ix_deliveries_dead's.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04
"""
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_deliveries_account_dead", "deliveries", ["account_id", "id"], postgresql_where="state = 'dead'")


def downgrade() -> None:
    op.drop_index("ix_deliveries_account_dead", table_name="deliveries")
