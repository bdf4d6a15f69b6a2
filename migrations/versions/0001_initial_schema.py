"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-30
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from billing.tables import APPEND_ONLY_ENABLE_ALWAYS, APPEND_ONLY_FUNCTION, APPEND_ONLY_TRIGGERS

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('accounts',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('status', sa.Text(), server_default='active', nullable=False),
    sa.Column('balance', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('price_per_delivery', sa.BigInteger(), server_default='1', nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("status IN ('active', 'closing', 'deleted')", name=op.f('ck_accounts_status')),
    sa.CheckConstraint('char_length(name) BETWEEN 1 AND 200', name=op.f('ck_accounts_name_length')),
    sa.CheckConstraint('price_per_delivery >= 0', name=op.f('ck_accounts_price_non_negative')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_accounts')),
    comment='A sender. balance is a cached sum of its ledger entries, updated in the same transaction as each entry.'
    )
    op.create_table('api_keys',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('account_id', sa.UUID(), nullable=False),
    sa.Column('key_hash', sa.LargeBinary(), nullable=False),
    sa.Column('prefix', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint('char_length(prefix) BETWEEN 4 AND 32', name=op.f('ck_api_keys_prefix_length')),
    sa.CheckConstraint('octet_length(key_hash) = 32', name=op.f('ck_api_keys_key_hash_length')),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_api_keys_account_id')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_keys')),
    sa.UniqueConstraint('key_hash', name=op.f('uq_api_keys_key_hash')),
    comment='Account API keys, stored only as SHA-256 hashes; the prefix lets a person tell keys apart.'
    )
    op.create_index(op.f('ix_api_keys_account_id'), 'api_keys', ['account_id'], unique=False)
    op.create_table('endpoints',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('account_id', sa.UUID(), nullable=False),
    sa.Column('url', sa.Text(), nullable=False),
    sa.Column('description', sa.Text(), server_default='', nullable=False),
    sa.Column('event_types', postgresql.ARRAY(sa.Text()), nullable=True),
    sa.Column('secret', sa.LargeBinary(), nullable=True),
    sa.Column('previous_secret', sa.LargeBinary(), nullable=True),
    sa.Column('previous_secret_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('timeout_ms', sa.Integer(), server_default='15000', nullable=False),
    sa.Column('enabled', sa.Boolean(), server_default=sa.text('true'), nullable=False),
    sa.Column('disabled_reason', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint('cardinality(event_types) BETWEEN 1 AND 100', name=op.f('ck_endpoints_event_types_count')),
    sa.CheckConstraint('char_length(description) BETWEEN 0 AND 1000', name=op.f('ck_endpoints_description_length')),
    sa.CheckConstraint('char_length(url) BETWEEN 1 AND 2048', name=op.f('ck_endpoints_url_length')),
    sa.CheckConstraint('disabled_reason IS NULL OR char_length(disabled_reason) BETWEEN 1 AND 500', name=op.f('ck_endpoints_disabled_reason_length')),
    sa.CheckConstraint('octet_length(secret) <= 1024 AND octet_length(previous_secret) <= 1024', name=op.f('ck_endpoints_secret_length')),
    sa.CheckConstraint('timeout_ms BETWEEN 1000 AND 60000', name=op.f('ck_endpoints_timeout_range')),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_endpoints_account_id')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_endpoints')),
    comment="Where an account's webhooks go. Secrets are encrypted at rest (signing.at_rest); event_types NULL means every type."
    )
    op.create_index(op.f('ix_endpoints_account_id'), 'endpoints', ['account_id'], unique=False)
    op.create_table('ledger_entries',
    sa.Column('id', sa.Text(), nullable=False),
    sa.Column('seq', sa.BigInteger(), sa.Identity(always=True), nullable=False),
    sa.Column('account_id', sa.UUID(), nullable=False),
    sa.Column('delivery_id', sa.UUID(), nullable=True),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('amount', sa.BigInteger(), nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("(kind IN ('charge', 'refund', 'reclaim')) = (delivery_id IS NOT NULL) AND (delivery_id IS NULL OR id = kind || ':' || delivery_id::text)", name=op.f('ck_ledger_entries_delivery_entry_id')),
    sa.CheckConstraint("CASE kind WHEN 'charge' THEN amount <= 0 WHEN 'reclaim' THEN amount <= 0 WHEN 'refund' THEN amount >= 0 WHEN 'topup' THEN amount > 0 WHEN 'topup_reversal' THEN amount < 0 ELSE true END", name=op.f('ck_ledger_entries_amount_sign')),
    sa.CheckConstraint("kind IN ('charge', 'refund', 'reclaim', 'topup', 'topup_reversal', 'closeout', 'adjustment')", name=op.f('ck_ledger_entries_kind')),
    sa.CheckConstraint("kind NOT IN ('topup', 'topup_reversal', 'closeout') OR id LIKE kind || ':%'", name=op.f('ck_ledger_entries_derived_id')),
    sa.CheckConstraint('char_length(id) BETWEEN 3 AND 300', name=op.f('ck_ledger_entries_id_length')),
    sa.CheckConstraint('note IS NULL OR char_length(note) BETWEEN 1 AND 1000', name=op.f('ck_ledger_entries_note_length')),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_ledger_entries_account_id')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_ledger_entries')),
    sa.UniqueConstraint('seq', name=op.f('uq_ledger_entries_seq')),
    comment='Append-only ledger. Every credit moves through here; a trigger refuses UPDATE, DELETE and TRUNCATE.'
    )
    op.create_index(op.f('ix_ledger_entries_account_id_seq'), 'ledger_entries', ['account_id', 'seq'], unique=False)
    op.create_index(op.f('ix_ledger_entries_delivery_id'), 'ledger_entries', ['delivery_id'], unique=False, postgresql_where=sa.text('delivery_id IS NOT NULL'))
    op.create_table('messages',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('account_id', sa.UUID(), nullable=False),
    sa.Column('event_type', sa.Text(), nullable=False),
    sa.Column('payload', sa.LargeBinary(), nullable=True),
    sa.Column('idempotency_key', sa.Text(), nullable=True),
    sa.Column('request_hash', sa.LargeBinary(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint('char_length(event_type) BETWEEN 1 AND 256', name=op.f('ck_messages_event_type_length')),
    sa.CheckConstraint('idempotency_key IS NULL OR char_length(idempotency_key) BETWEEN 1 AND 255', name=op.f('ck_messages_idempotency_key_length')),
    sa.CheckConstraint('octet_length(payload) <= 1048576', name=op.f('ck_messages_payload_size')),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_messages_account_id')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_messages')),
    sa.UniqueConstraint('account_id', 'idempotency_key', name=op.f('uq_messages_account_id_idempotency_key')),
    comment='An event an app enqueued. payload is the exact body bytes sent; erased (NULL) when the account is deleted.'
    )
    op.create_table('deliveries',
    sa.Column('id', sa.UUID(), nullable=False),
    sa.Column('account_id', sa.UUID(), nullable=False),
    sa.Column('message_id', sa.UUID(), nullable=False),
    sa.Column('endpoint_id', sa.UUID(), nullable=False),
    sa.Column('price', sa.BigInteger(), nullable=False),
    sa.Column('state', sa.Text(), server_default='pending', nullable=False),
    sa.Column('attempt', sa.Integer(), server_default='0', nullable=False),
    sa.Column('attempts_max', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('leased_until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('dead_reason', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("(state = 'dead') = (dead_reason IS NOT NULL) OR state = 'delivered'", name=op.f('ck_deliveries_dead_has_reason')),
    sa.CheckConstraint("(state = 'sending') = (leased_until IS NOT NULL)", name=op.f('ck_deliveries_lease_only_when_sending')),
    sa.CheckConstraint("dead_reason IS NULL OR dead_reason IN ('out_of_retries', 'endpoint_deleted', 'account_closed', 'endpoint_disabled', 'attempts_exhausted', 'account_deleted')", name=op.f('ck_deliveries_dead_reason')),
    sa.CheckConstraint("state IN ('pending', 'sending', 'delivered', 'dead')", name=op.f('ck_deliveries_state')),
    sa.CheckConstraint('attempt >= 0 AND attempt <= attempts_max', name=op.f('ck_deliveries_attempt_range')),
    sa.CheckConstraint('attempts_max BETWEEN 1 AND 50', name=op.f('ck_deliveries_attempts_max_range')),
    sa.CheckConstraint('price >= 0', name=op.f('ck_deliveries_price_non_negative')),
    sa.ForeignKeyConstraint(['account_id'], ['accounts.id'], name=op.f('fk_deliveries_account_id')),
    sa.ForeignKeyConstraint(['endpoint_id'], ['endpoints.id'], name=op.f('fk_deliveries_endpoint_id')),
    sa.ForeignKeyConstraint(['message_id'], ['messages.id'], name=op.f('fk_deliveries_message_id')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_deliveries')),
    comment='One message to one endpoint. Charged when created; ends delivered or dead (refunded once by billing.settle).'
    )
    op.create_index(op.f('ix_deliveries_account_id_created_at'), 'deliveries', ['account_id', 'created_at'], unique=False)
    op.create_index('ix_deliveries_account_live', 'deliveries', ['account_id', 'id'], unique=False, postgresql_where=sa.text("state IN ('pending', 'sending')"))
    op.create_index('ix_deliveries_due', 'deliveries', ['next_attempt_at'], unique=False, postgresql_where=sa.text("state = 'pending'"))
    op.create_index(op.f('ix_deliveries_endpoint_id_state'), 'deliveries', ['endpoint_id', 'state'], unique=False)
    op.create_index('ix_deliveries_lease', 'deliveries', ['leased_until'], unique=False, postgresql_where=sa.text("state = 'sending'"))
    op.create_index(op.f('ix_deliveries_message_id'), 'deliveries', ['message_id'], unique=False)
    op.create_table('delivery_attempts',
    sa.Column('delivery_id', sa.UUID(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('account_id', sa.UUID(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.Column('status_code', sa.Integer(), nullable=True),
    sa.Column('latency_ms', sa.Integer(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('response_excerpt', sa.Text(), nullable=True),
    sa.Column('stale', sa.Boolean(), server_default=sa.text('false'), nullable=False),
    sa.CheckConstraint('attempt >= 1', name=op.f('ck_delivery_attempts_attempt_positive')),
    sa.CheckConstraint('error IS NULL OR char_length(error) BETWEEN 1 AND 1000', name=op.f('ck_delivery_attempts_error_length')),
    sa.CheckConstraint('latency_ms IS NULL OR latency_ms >= 0', name=op.f('ck_delivery_attempts_latency_non_negative')),
    sa.CheckConstraint('response_excerpt IS NULL OR char_length(response_excerpt) <= 4096', name=op.f('ck_delivery_attempts_excerpt_length')),
    sa.CheckConstraint('status_code IS NULL OR status_code BETWEEN 100 AND 599', name=op.f('ck_delivery_attempts_status_code_range')),
    sa.ForeignKeyConstraint(['delivery_id'], ['deliveries.id'], name=op.f('fk_delivery_attempts_delivery_id')),
    sa.PrimaryKeyConstraint('delivery_id', 'attempt', name=op.f('pk_delivery_attempts')),
    comment='What each send did. stale marks a result that arrived after its attempt was fenced off.'
    )
    op.create_index(op.f('ix_delivery_attempts_account_id_finished_at'), 'delivery_attempts', ['account_id', 'finished_at'], unique=False)
    # The ledger is append-only, enforced by the database itself (invariant I5).
    op.execute(APPEND_ONLY_FUNCTION)
    for statement in APPEND_ONLY_TRIGGERS + APPEND_ONLY_ENABLE_ALWAYS:
        op.execute(statement)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS ledger_entries_no_update_delete ON ledger_entries")
    op.execute("DROP TRIGGER IF EXISTS ledger_entries_no_truncate ON ledger_entries")
    op.execute("DROP FUNCTION IF EXISTS ledger_entries_append_only()")
    op.drop_index(op.f('ix_delivery_attempts_account_id_finished_at'), table_name='delivery_attempts')
    op.drop_table('delivery_attempts')
    op.drop_index(op.f('ix_deliveries_message_id'), table_name='deliveries')
    op.drop_index('ix_deliveries_lease', table_name='deliveries', postgresql_where=sa.text("state = 'sending'"))
    op.drop_index(op.f('ix_deliveries_endpoint_id_state'), table_name='deliveries')
    op.drop_index('ix_deliveries_due', table_name='deliveries', postgresql_where=sa.text("state = 'pending'"))
    op.drop_index('ix_deliveries_account_live', table_name='deliveries', postgresql_where=sa.text("state IN ('pending', 'sending')"))
    op.drop_index(op.f('ix_deliveries_account_id_created_at'), table_name='deliveries')
    op.drop_table('deliveries')
    op.drop_table('messages')
    op.drop_index(op.f('ix_ledger_entries_delivery_id'), table_name='ledger_entries', postgresql_where=sa.text('delivery_id IS NOT NULL'))
    op.drop_index(op.f('ix_ledger_entries_account_id_seq'), table_name='ledger_entries')
    op.drop_table('ledger_entries')
    op.drop_index(op.f('ix_endpoints_account_id'), table_name='endpoints')
    op.drop_table('endpoints')
    op.drop_index(op.f('ix_api_keys_account_id'), table_name='api_keys')
    op.drop_table('api_keys')
    op.drop_table('accounts')
