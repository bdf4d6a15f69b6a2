"""account-named triggers: every statement a trigger function runs names the account

The trigger functions that looked a row up by a bare id, or locked rows by a key of their own,
name the account of the row that fired them: the reference checks of messages (its application),
ledger entries and attempts (their delivery) (billing.references); the operational outbox's
endpoint, dead-delivery and ledger triggers (billing.operational_outbox); and the check that drops
a late excerpt of an erased message (0018, 0021). On tables distributed (or hash-partitioned) by
account_id each of their statements then goes to that account's shard, and every key probed leads
with account_id. What the functions accept, refuse and write is unchanged. The functions are
replaced in place (their triggers, and ENABLE ALWAYS, stay); the reference checks are pinned to
index probes again, which replacing a function resets.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06
"""
from alembic import op

from billing import operational_outbox, references

revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None

_EXCERPT_FUNCTION = """
CREATE OR REPLACE FUNCTION delivery_attempts_no_excerpt_once_erased() RETURNS trigger LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM deliveries d JOIN messages m ON {messages}
               WHERE {deliveries} AND m.payload_erased_at IS NOT NULL) THEN
        NEW.response_excerpt := NULL;
        NEW.sent_headers := NULL;
    END IF;
    RETURN NEW;
END;
$$
"""
_EXCERPT_NAMED = _EXCERPT_FUNCTION.format(
    messages="m.account_id = d.account_id AND m.id = d.message_id",
    deliveries="d.account_id = NEW.account_id AND d.id = NEW.delivery_id")
_EXCERPT_BEFORE = _EXCERPT_FUNCTION.format(messages="m.id = d.message_id", deliveries="d.id = NEW.delivery_id")


def upgrade() -> None:
    for statement in (*references.account_named_check_statements(), *operational_outbox.ACCOUNT_NAMED_FUNCTIONS,
                      _EXCERPT_NAMED):
        op.execute(statement)


def downgrade() -> None:
    for statement in (*references.account_named_check_reset_statements(), *operational_outbox.ACCOUNT_NAMED_RESET,
                      _EXCERPT_BEFORE):
        op.execute(statement)
