"""erased message late excerpts: an attempt recorded after its message was erased keeps no response excerpt

A worker whose lease expired can still be waiting on a receiver while the sweep ends the delivery
and the message is expunged or erased by retention; its answer is then recorded as a stale attempt
(an insert, or the update of the lease expiry's placeholder row), and the receiver's text would
stay beside an erased payload. This trigger drops it: for a stale attempt with an excerpt (only a
stale attempt can arrive for a finished delivery, and only a finished one's message is erased),
BEFORE the row is written, it looks the message up with a fresh snapshot (a volatile function), so an
erasure that committed while the recorder waited on the delivery's lock is seen. An erasure that
commits later erases the excerpt itself: it locks the deliveries, which the recorder holds until
it commits, and reads the attempts after. A live delivery's attempts are never stale-and-erased, and
the hot path (attempts not stale) does not fire it.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06
"""
from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None

_FUNCTION = """
CREATE FUNCTION delivery_attempts_no_excerpt_once_erased() RETURNS trigger LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM deliveries d JOIN messages m ON m.id = d.message_id
               WHERE d.id = NEW.delivery_id AND m.payload_erased_at IS NOT NULL) THEN
        NEW.response_excerpt := NULL;
    END IF;
    RETURN NEW;
END;
$$
"""
_TRIGGER = (
    "CREATE TRIGGER delivery_attempts_erased_message BEFORE INSERT OR UPDATE OF response_excerpt"
    " ON delivery_attempts FOR EACH ROW WHEN (NEW.stale AND NEW.response_excerpt IS NOT NULL)"
    " EXECUTE FUNCTION delivery_attempts_no_excerpt_once_erased()"
)


def upgrade() -> None:
    op.execute(_FUNCTION)
    op.execute(_TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER delivery_attempts_erased_message ON delivery_attempts")
    op.execute("DROP FUNCTION delivery_attempts_no_excerpt_once_erased()")
