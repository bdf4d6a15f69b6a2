"""idempotent responses: the stored answers of keyed creates other than messages

POST /v1/accounts, POST /v1/api-keys, POST /v1/accounts/{id}/api-keys, POST /v1/endpoints and
POST /v1/endpoints/{id}/secret/rotate take an Idempotency-Key: the 2xx answer is kept here,
sealed at rest (it may hold a key or a secret shown once), in the transaction that made what it
shows, so a retry with the key gets it again. The worker's sweep purges rows after 25 hours
through the created_at index.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""
from alembic import op
import sqlalchemy as sa

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('idempotent_responses',
    sa.Column('principal', sa.Text(), nullable=False),
    sa.Column('key', sa.Text(), nullable=False),
    sa.Column('fingerprint', sa.LargeBinary(), nullable=False),
    sa.Column('status', sa.SmallInteger(), nullable=False),
    sa.Column('body', sa.LargeBinary(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('char_length(principal) BETWEEN 1 AND 64', name=op.f('ck_idempotent_responses_principal_length')),
    sa.CheckConstraint('char_length(key) BETWEEN 1 AND 255', name=op.f('ck_idempotent_responses_key_length')),
    sa.CheckConstraint('octet_length(fingerprint) = 32', name=op.f('ck_idempotent_responses_fingerprint_length')),
    sa.CheckConstraint('status BETWEEN 200 AND 299', name=op.f('ck_idempotent_responses_status_success')),
    sa.CheckConstraint('octet_length(body) <= 262144', name=op.f('ck_idempotent_responses_body_size')),
    sa.PrimaryKeyConstraint('principal', 'key', name=op.f('pk_idempotent_responses')),
    comment='The 2xx answer of a keyed create other than a message (account, API key, endpoint, secret rotation),'
            ' sealed at rest: a retry with the same Idempotency-Key gets it again. Purged after 25 h.'
    )
    op.create_index(op.f('ix_idempotent_responses_created_at'), 'idempotent_responses', ['created_at'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_idempotent_responses_created_at'), table_name='idempotent_responses')
    op.drop_table('idempotent_responses')
