"""endpoints.rate_limit_per_second: the most requests per second every worker together sends to one endpoint

NULL (every endpoint so far) is no limit. The workers share one token bucket per endpoint in
Redis (delivery.engine.throttle); a delivery the limit holds back stays pending and spends no
attempt.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("endpoints", sa.Column("rate_limit_per_second", sa.Integer()))
    op.create_check_constraint(op.f("ck_endpoints_rate_limit_range"), "endpoints",
                               "rate_limit_per_second BETWEEN 1 AND 10000")


def downgrade() -> None:
    op.drop_constraint(op.f("ck_endpoints_rate_limit_range"), "endpoints", type_="check")
    op.drop_column("endpoints", "rate_limit_per_second")
