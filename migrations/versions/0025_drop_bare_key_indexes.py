"""drop bare key indexes: the plain indexes on an old key go where every statement names the account

Migration 0022 added a plain index on each old key (ix_<table>_id, and delivery_attempts'
(delivery_id, attempt)) for the statements that still found a row by a bare id. Each costs a
write per row, on the hottest tables too: deliveries, delivery_attempts, ledger_entries and
messages take a row (or several) per delivery created. Now every statement on those rows names
the account, so their primary keys (account_id, ...) serve them, and these indexes go:

- ix_applications_id, ix_delivery_attempts_delivery_id_attempt, ix_messages_id, and the
  operational tables' ix_operational_deliveries_id, ix_operational_endpoints_id and
  ix_operational_events_id (the operational sender's dispatch, claim and lease expiry join by
  (account_id, id));
- ix_ledger_entries_id, replaced by ix_ledger_entries_topup_id, on the ids of the top-ups only:
  a top-up reads its order's entry on any account by the bare id (billing.accounts.top_up, under a
  lock named by the order), which is what keeps an order to one account. Top-ups are few; the
  charges and refunds of every delivery skip a partial index whose predicate they fail.

- messages' idempotency key, UNIQUE (account_id, idempotency_key), becomes a unique index of the
  messages that have a key (WHERE idempotency_key IS NOT NULL): the same rule (NULLs never
  conflicted), one index write fewer for every message sent without a key, and no index that
  leads with the account but cannot find a message by its id. With ix_messages_id gone, PostgreSQL
  took that index for the reference checks' probe of a message by (account_id, id) when a
  partition's statistics were stale (a new hot account: every probe then read all of the
  account's messages, 3 times slower creates after a few thousand); the primary key is now the
  only index a probe by id can use.

Statements that had only a bare id now find the account first: the operator's look-up and replay of
a delivery by id read it from the delivery's ledger entries (ix_ledger_entries_delivery_id), and a
job of the previous version (bare delivery ids) is claimed by one condition on all its ids, which
needs no index on bare ids (without ix_deliveries_id, a walk of the live deliveries' partial index).

Kept, each for statements that still need it:
- ix_deliveries_id: the reference checks of ledger entries (and the excerpt check of attempts)
  probe a delivery by (account_id, id) from a trigger function, whose plan each connection keeps.
  Without this index, on the partition of a new hot account planned before its first ANALYZE, that
  plan took ix_deliveries_account_id_created_at (account_id only as its condition) and read all
  the account's deliveries per probe: measured with scripts/bench_ingest.py --partitions 8, one
  hot account, PostgreSQL's CPU per message 3 times main's. It can go once those probes cannot
  fall to another index (planned per statement, or the account's other indexes made unfit).
- ix_endpoints_id: the operator switches an endpoint off by its id alone
  (delivery.store.endpoints.disable_by_operator); endpoints are few and rarely written.

With HOOKLEDGER_ACCOUNT_PARTITIONS (migration 0023) the tables are partitioned: dropping an index
drops its partitions' copies, and an index made here is made on every partition, its copies named
<index>_p<k> as 0023 names them. The downgrade makes the dropped indexes again (and drops the
top-ups' one).

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06
"""
from alembic import op

from migrations import account_partitions

revision = '0025'
down_revision = '0024'
branch_labels = None
depends_on = None

# The plain indexes on an old key that no statement needs any more, with their columns (0022's names).
_DROPPED = {
    "ix_applications_id": ("applications", "id"),
    "ix_delivery_attempts_delivery_id_attempt": ("delivery_attempts", "delivery_id, attempt"),
    "ix_ledger_entries_id": ("ledger_entries", "id"),
    "ix_messages_id": ("messages", "id"),
    "ix_operational_deliveries_id": ("operational_deliveries", "id"),
    "ix_operational_endpoints_id": ("operational_endpoints", "id"),
    "ix_operational_events_id": ("operational_events", "id"),
}
_TOPUP_INDEX = "ix_ledger_entries_topup_id"
_IDEMPOTENCY_KEY = "uq_messages_account_id_idempotency_key"


def _create(name: str, table: str, definition: str, unique: bool = False) -> None:
    op.execute(f"CREATE {'UNIQUE ' if unique else ''}INDEX {name} ON {table} {definition}")
    _name_copies(table)


def _name_copies(table: str) -> None:
    bind = op.get_bind()
    if account_partitions.partitions_of(bind, table) > 0:
        account_partitions.name_partition_indexes(bind, table)


def upgrade() -> None:
    for name in _DROPPED:
        op.execute(f"DROP INDEX {name}")
    _create(_TOPUP_INDEX, "ledger_entries", "(id) WHERE kind = 'topup'")
    op.execute(f"ALTER TABLE messages DROP CONSTRAINT {_IDEMPOTENCY_KEY}")
    _create(_IDEMPOTENCY_KEY, "messages", "(account_id, idempotency_key) WHERE idempotency_key IS NOT NULL", unique=True)


def downgrade() -> None:
    op.execute(f"DROP INDEX {_IDEMPOTENCY_KEY}")
    op.execute(f"ALTER TABLE messages ADD CONSTRAINT {_IDEMPOTENCY_KEY} UNIQUE (account_id, idempotency_key)")
    _name_copies("messages")
    op.execute(f"DROP INDEX {_TOPUP_INDEX}")
    for name, (table, columns) in _DROPPED.items():
        _create(name, table, f"({columns})")
