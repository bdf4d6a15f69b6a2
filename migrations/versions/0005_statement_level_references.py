"""statement-level references: the hot tables' foreign keys become one check per INSERT statement

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""
from alembic import op

from billing.references import downgrade_statements, upgrade_statements

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in upgrade_statements():
        op.execute(statement)


def downgrade() -> None:
    for statement in downgrade_statements():
        op.execute(statement)
