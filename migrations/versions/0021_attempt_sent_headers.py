"""attempt sent headers: each attempt keeps the custom headers it was sent with

delivery_attempts.sent_headers holds the endpoint's custom headers (delivery.store.endpoint_headers)
as that attempt sent them, a JSON object of name -> value; NULL when the endpoint had none, so the
attempts of endpoints without custom headers (nearly all) store nothing more. The attempts already
there stay NULL: what they were sent with was not recorded.

The values are the customer's (a gateway's token, a tenant name), so they are erased with the
response excerpts: by retention and expunge, and at account deletion. The trigger of 0018, which
drops the excerpt of a stale attempt recorded after its message was erased, drops its headers too.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None

_FUNCTION = """
CREATE OR REPLACE FUNCTION delivery_attempts_no_excerpt_once_erased() RETURNS trigger LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM deliveries d JOIN messages m ON m.id = d.message_id
               WHERE d.id = NEW.delivery_id AND m.payload_erased_at IS NOT NULL) THEN
        NEW.response_excerpt := NULL;{extra}
    END IF;
    RETURN NEW;
END;
$$
"""
_TRIGGER = (
    "CREATE TRIGGER delivery_attempts_erased_message BEFORE INSERT OR UPDATE OF {columns}"
    " ON delivery_attempts FOR EACH ROW WHEN (NEW.stale AND ({condition}))"
    " EXECUTE FUNCTION delivery_attempts_no_excerpt_once_erased()"
)


def upgrade() -> None:
    op.add_column("delivery_attempts", sa.Column("sent_headers", pg.JSONB()))
    op.create_check_constraint(
        op.f("ck_delivery_attempts_sent_headers_size"), "delivery_attempts",
        "sent_headers IS NULL OR (jsonb_typeof(sent_headers) = 'object' AND octet_length(sent_headers::text) <= 16384)")
    op.execute("DROP TRIGGER delivery_attempts_erased_message ON delivery_attempts")
    op.execute(_FUNCTION.format(extra="\n        NEW.sent_headers := NULL;"))
    op.execute(_TRIGGER.format(columns="response_excerpt, sent_headers",
                               condition="NEW.response_excerpt IS NOT NULL OR NEW.sent_headers IS NOT NULL"))


def downgrade() -> None:
    op.execute("DROP TRIGGER delivery_attempts_erased_message ON delivery_attempts")
    op.execute(_FUNCTION.format(extra=""))
    op.execute(_TRIGGER.format(columns="response_excerpt", condition="NEW.response_excerpt IS NOT NULL"))
    op.drop_constraint(op.f("ck_delivery_attempts_sent_headers_size"), "delivery_attempts", type_="check")
    op.drop_column("delivery_attempts", "sent_headers")
