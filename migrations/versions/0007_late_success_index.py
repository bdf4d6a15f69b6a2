"""late success index: find the 2xx answers that came back after their attempt was fenced off

A late 2xx on a delivery that died and was refunded takes the refund back (reclaim) right after
its result is recorded; if that step is lost (the worker killed, the connection gone), the
sweep finds the answer again through this index and reclaims then. Such answers are rare, so
the index stays small.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_delivery_attempts_late_success", "delivery_attempts", ["finished_at"],
        postgresql_where="stale AND status_code BETWEEN 200 AND 299",
    )


def downgrade() -> None:
    op.drop_index("ix_delivery_attempts_late_success", table_name="delivery_attempts")
