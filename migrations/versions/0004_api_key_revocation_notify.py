"""api key revocation notify: a trigger that tells every API process at commit that a key was revoked

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""
from alembic import op

from billing.tables import KEY_REVOKED_FUNCTION, KEY_REVOKED_TRIGGER

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(KEY_REVOKED_FUNCTION)
    op.execute(KEY_REVOKED_TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER api_keys_revoked ON api_keys")
    op.execute("DROP FUNCTION api_keys_notify_revoked()")
