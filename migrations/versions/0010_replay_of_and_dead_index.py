"""deliveries.replay_of, and the dead deliveries in id order: what a replay replays; the operator's dead pages

A replay is a new delivery. The recovery (GET/POST /v1/endpoints/{id}/recover) and the
operator's bulk replay leave out a dead delivery that was replayed before; they knew that only
by a message keyed `replay:<dead id>`, which a single replay (POST /v1/deliveries/{id}/replay,
under the caller's key or none) does not carry, so a recovery replayed and charged it again.
replay_of names the delivery a replay sends again, whoever made the replay; NULL on every other
delivery, which costs an ordinary create nothing. Its index holds the replays only.

The operator's pages of dead deliveries (GET /v1/dead-deliveries, dead_letters.list_dead) read
newest first by id. Without an index of the dead ones in id order, a page walked the primary key
past every delivered delivery, and past every row newer than its cursor once PostgreSQL kept a
generic plan: a page deep in 300,000 deliveries (600 of them dead) read 295,000 rows, 45-116 ms.
The index holds the dead ones only: an entry is written when a delivery dies, on no other write.

A page filtered by reason (dead_letters.list_dead) asks for state = 'dead' AND dead_reason = $n.
PostgreSQL took the two for independent: 5% dead times 5% with that reason, 0.25% of the rows,
about a page, so it read every dead delivery through a bitmap and sorted them (1,040 rows for a
page of 51). dead_reason is set exactly when a delivery is dead (ck_deliveries_dead_has_reason);
extended statistics on the pair tell PostgreSQL so, and the page walks ix_deliveries_dead.

The replays made before this revision are found by their keys (`replay:<dead id>`, a sequential
read of messages) and marked; a single replay made before it cannot be told from a send.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

_UUID = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"

# The keyed replays made so far: each delivery of a message keyed replay:<id> replays <id>, if
# that is a delivery of the message's own account (a customer's key could start with replay:
# before the API refused such keys). CASE, so that only a well-formed id is cast.
_MARK_KEYED_REPLAYS = f"""
UPDATE deliveries r SET replay_of = k.replayed
FROM (SELECT m.id AS message_id, m.account_id,
             CASE WHEN substr(m.idempotency_key, 8) ~ '{_UUID}' THEN substr(m.idempotency_key, 8)::uuid END AS replayed
      FROM messages m WHERE m.idempotency_key LIKE 'replay:%') k
JOIN deliveries d ON d.id = k.replayed AND d.account_id = k.account_id
WHERE r.message_id = k.message_id AND r.account_id = k.account_id
"""


def upgrade() -> None:
    op.add_column("deliveries", sa.Column("replay_of", pg.UUID(as_uuid=True)))
    op.execute(_MARK_KEYED_REPLAYS)
    op.create_index("ix_deliveries_replay_of", "deliveries", ["replay_of"], postgresql_where="replay_of IS NOT NULL")
    op.create_index("ix_deliveries_dead", "deliveries", ["id"], postgresql_where="state = 'dead'")
    op.execute("CREATE STATISTICS st_deliveries_state_dead_reason (dependencies, mcv) ON state, dead_reason FROM deliveries")


def downgrade() -> None:
    op.execute("DROP STATISTICS st_deliveries_state_dead_reason")
    op.drop_index("ix_deliveries_dead", table_name="deliveries")
    op.drop_index("ix_deliveries_replay_of", table_name="deliveries")
    op.drop_column("deliveries", "replay_of")
