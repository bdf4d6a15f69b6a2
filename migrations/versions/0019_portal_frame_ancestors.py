"""portal frame ancestors: the origins an account lets embed its customer portal in an iframe

The portal's Content-Security-Policy lists them as frame-ancestors ('none' when the list is empty,
the default), and its session cookie becomes SameSite=None; Secure so that it is sent inside the
embedding page's iframe. At most 10 https origins, each scheme://host[:port] (checked by the API).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None

ANCESTORS_MAX = 10  # billing.tables.PORTAL_FRAME_ANCESTORS_MAX (a migration keeps its own copy)


def upgrade() -> None:
    op.add_column("accounts", sa.Column("portal_frame_ancestors", pg.ARRAY(sa.Text), nullable=False,
                                        server_default=sa.text("'{}'::text[]")))
    op.create_check_constraint(op.f("ck_accounts_portal_frame_ancestors_max"), "accounts",
                               f"cardinality(portal_frame_ancestors) <= {ANCESTORS_MAX}")


def downgrade() -> None:
    op.drop_constraint(op.f("ck_accounts_portal_frame_ancestors_max"), "accounts", type_="check")
    op.drop_column("accounts", "portal_frame_ancestors")
