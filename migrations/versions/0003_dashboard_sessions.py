"""dashboard sessions: server-side sign-ins of the web dashboard (token stored as a hash)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-08
"""
from alembic import op
import sqlalchemy as sa

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('dashboard_sessions',
    sa.Column('token_hash', sa.LargeBinary(), nullable=False),
    sa.Column('role', sa.Text(), nullable=False),
    sa.Column('account_id', sa.UUID(), nullable=True),
    sa.Column('api_key_id', sa.UUID(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint('octet_length(token_hash) = 32', name=op.f('ck_dashboard_sessions_token_hash_length')),
    sa.CheckConstraint("role IN ('account', 'operator')", name=op.f('ck_dashboard_sessions_role')),
    sa.CheckConstraint("(role = 'account') = (account_id IS NOT NULL) AND (account_id IS NULL) = (api_key_id IS NULL)",
                       name=op.f('ck_dashboard_sessions_role_identity')),
    sa.CheckConstraint('expires_at > created_at', name=op.f('ck_dashboard_sessions_expires_after_created')),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_dashboard_sessions_account_id')),
    sa.ForeignKeyConstraint(['api_key_id'], ['api_keys.id'], name=op.f('fk_dashboard_sessions_api_key_id')),
    sa.PrimaryKeyConstraint('token_hash', name=op.f('pk_dashboard_sessions')),
    comment='Web dashboard sign-ins. Only a SHA-256 hash of the session token is kept; the token lives in the browser\'s cookie.'
    )
    op.create_index(op.f('ix_dashboard_sessions_account_id'), 'dashboard_sessions', ['account_id'], unique=False)
    op.create_index(op.f('ix_dashboard_sessions_expires_at'), 'dashboard_sessions', ['expires_at'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_dashboard_sessions_expires_at'), table_name='dashboard_sessions')
    op.drop_index(op.f('ix_dashboard_sessions_account_id'), table_name='dashboard_sessions')
    op.drop_table('dashboard_sessions')
