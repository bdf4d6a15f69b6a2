"""deliveries.webhook_id for replays; endpoints.signing_key_type (Ed25519) and endpoints.headers

A replay is a new delivery, with its own id, attempts and charge, but Standard Webhooks makes
webhook-id the receiver's idempotency key: the same however often one webhook is sent. A replay
sent under its own id was a new webhook to every receiver, so one whose original had in fact
been processed (its answer lost to a timeout) was processed twice. webhook_id holds the id a
replay is sent under, set at insert to the one the delivery it replays was sent under
(coalesce(replayed.webhook_id, replayed.id)): a chain of replays keeps the first one's. NULL on
every other delivery, whose webhook-id is its own id; the column costs an ordinary create
nothing. The replays made before this revision went out under their own ids, and keep them: a
live one must not change its webhook-id between two attempts.

An endpoint may sign with an Ed25519 key (v1a) instead of an HMAC secret (v1); signing_key_type
says which kind its current key is ('hmac' for every endpoint so far), so that a list of
endpoints says it without opening every sealed key.

An endpoint may carry custom headers, sent with every request outside the signature: a JSON
object, NULL when none (delivery.store.endpoint_headers checks names and values).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("deliveries", sa.Column("webhook_id", pg.UUID(as_uuid=True)))
    op.add_column("endpoints", sa.Column("signing_key_type", sa.Text(), server_default="hmac", nullable=False))
    op.add_column("endpoints", sa.Column("headers", pg.JSONB()))
    op.create_check_constraint(op.f("ck_endpoints_signing_key_type"), "endpoints",
                               "signing_key_type IN ('hmac', 'ed25519')")
    op.create_check_constraint(op.f("ck_endpoints_headers_size"), "endpoints",
                               "jsonb_typeof(headers) = 'object' AND octet_length(headers::text) <= 16384")


def downgrade() -> None:
    op.drop_constraint(op.f("ck_endpoints_headers_size"), "endpoints", type_="check")
    op.drop_constraint(op.f("ck_endpoints_signing_key_type"), "endpoints", type_="check")
    op.drop_column("endpoints", "headers")
    op.drop_column("endpoints", "signing_key_type")
    op.drop_column("deliveries", "webhook_id")
