"""account deletions: one row per account deletion job (progress, status, report)

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('account_deletions',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('account_id', sa.UUID(), nullable=False),
    sa.Column('status', sa.Text(), server_default='running', nullable=False),
    sa.Column('step', sa.Text(), server_default='queued', nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('report', postgresql.JSONB(astext_type=sa.Text()), server_default=sa.text("'{}'::jsonb"), nullable=False),
    sa.CheckConstraint("status IN ('running', 'waiting_repair', 'done', 'failed')", name=op.f('ck_account_deletions_status')),
    sa.CheckConstraint("step IN ('queued', 'begin_closing', 'bulk_settle', 'close_out', 'report')", name=op.f('ck_account_deletions_step')),
    sa.CheckConstraint('octet_length(report::text) <= 1048576', name=op.f('ck_account_deletions_report_size')),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_account_deletions_account_id')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_account_deletions')),
    sa.UniqueConstraint('account_id', name=op.f('uq_account_deletions_account_id')),
    comment='One deletion job per account (a second request shares the row): its progress, status and report.'
    )


def downgrade() -> None:
    op.drop_table('account_deletions')
