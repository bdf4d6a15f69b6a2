"""reference checks probe indexes: sequential scans off inside the check functions

A check function's plan is cached per session; planned while a parent table looked empty, each
probe was a sequential scan and creates slowed down with every message written. See
billing.references.PROBE_SETTING.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""
from alembic import op

from billing.references import probe_setting_reset_statements, probe_setting_statements

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in probe_setting_statements():
        op.execute(statement)


def downgrade() -> None:
    for statement in probe_setting_reset_statements():
        op.execute(statement)
