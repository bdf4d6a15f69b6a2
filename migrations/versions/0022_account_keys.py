"""account keys: every key of an account-scoped table includes account_id

On a distributed (Citus) or hash-partitioned table every primary key and unique constraint must
include the distribution column. For each table of billing.distribution.DISTRIBUTED (but accounts,
whose id is its account) the primary key becomes (account_id, <old key>); derived ledger ids
stay as they are, unique together with the account.

- ledger_entries' and operational_events' UNIQUE (seq) go: seq is an identity column, so its
  values stay unique. ledger_entries keeps a plain index on seq (the audit and the chaos run
  read the ledger by seq alone); operational_events' undispatched index already covers its reads.
- operational_deliveries' one-delivery-per-event-and-endpoint key becomes (account_id, event_id,
  endpoint_id), and its foreign keys reference operational_events and operational_endpoints by
  (account_id, id).
- applications had both PRIMARY KEY (id) and UNIQUE (account_id, id): the primary key becomes
  (account_id, id) and the unique constraint, now the same key, goes; the foreign keys of
  endpoints, portal_links and portal_sessions reference the primary key.
- deliveries' index (account_id, id) is the new primary key: it goes.
- A plain (non-unique) index on the old key is added where statements still look a row up by a
  bare id (ix_<table>_id, and delivery_attempts' (delivery_id, attempt)), so that they stay fast
  until every statement names the account; a later migration may drop those nothing needs.

The downgrade restores the old keys; it fails (and changes nothing) if two accounts came to
share an id meanwhile, which the old keys cannot hold.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06
"""
from alembic import op

revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None

# Each table whose primary key gains account_id, with its old key columns.
_OLD_KEYS = {
    "account_deletions": ("id",),
    "applications": ("id",),
    "deliveries": ("id",),
    "delivery_attempts": ("delivery_id", "attempt"),
    "endpoints": ("id",),
    "event_types": ("id",),
    "ledger_entries": ("id",),
    "messages": ("id",),
    "operational_deliveries": ("id",),
    "operational_endpoints": ("id",),
    "operational_events": ("id",),
}
# The plain indexes on an old key that statements still use without the account.
_BARE_KEY_INDEXES = {
    "applications": ("id",),
    "deliveries": ("id",),
    "delivery_attempts": ("delivery_id", "attempt"),
    "endpoints": ("id",),
    "ledger_entries": ("id",),
    "messages": ("id",),
    "operational_deliveries": ("id",),
    "operational_endpoints": ("id",),
    "operational_events": ("id",),
}
# Foreign keys that reference applications (account_id, id): dropped while its keys change.
_APPLICATION_REFERENCES = ("endpoints", "portal_links", "portal_sessions")
_OPERATIONAL_FOREIGN_KEYS = {
    "fk_operational_deliveries_event_id": ("event_id", "operational_events"),
    "fk_operational_deliveries_endpoint_id": ("endpoint_id", "operational_endpoints"),
}


def _columns(columns: tuple[str, ...]) -> str:
    return ", ".join(columns)


def _index_name(table: str, columns: tuple[str, ...]) -> str:
    return f"ix_{table}_{'_'.join(columns)}"


def _drop_dependent_foreign_keys() -> None:
    for name in _OPERATIONAL_FOREIGN_KEYS:
        op.execute(f"ALTER TABLE operational_deliveries DROP CONSTRAINT {name}")
    for table in _APPLICATION_REFERENCES:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT fk_{table}_application")


def _add_application_references() -> None:
    for table in _APPLICATION_REFERENCES:
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT fk_{table}_application FOREIGN KEY (account_id, application_id)"
                   " REFERENCES applications (account_id, id)")


def upgrade() -> None:
    _drop_dependent_foreign_keys()
    op.execute("ALTER TABLE applications DROP CONSTRAINT uq_applications_account_id_id")
    op.execute("ALTER TABLE operational_deliveries DROP CONSTRAINT uq_operational_deliveries_event_id_endpoint_id")
    op.execute("ALTER TABLE ledger_entries DROP CONSTRAINT uq_ledger_entries_seq")
    op.execute("ALTER TABLE operational_events DROP CONSTRAINT uq_operational_events_seq")
    op.execute("DROP INDEX ix_deliveries_account_id_id")
    for table, columns in _OLD_KEYS.items():
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT pk_{table},"
                   f" ADD CONSTRAINT pk_{table} PRIMARY KEY (account_id, {_columns(columns)})")
    for table, columns in _BARE_KEY_INDEXES.items():
        op.execute(f"CREATE INDEX {_index_name(table, columns)} ON {table} ({_columns(columns)})")
    op.execute("CREATE INDEX ix_ledger_entries_seq ON ledger_entries (seq)")
    op.execute("ALTER TABLE operational_deliveries ADD CONSTRAINT uq_operational_deliveries_account_id_event_id_endpoint_id"
               " UNIQUE (account_id, event_id, endpoint_id)")
    for name, (column, referenced) in _OPERATIONAL_FOREIGN_KEYS.items():
        op.execute(f"ALTER TABLE operational_deliveries ADD CONSTRAINT {name} FOREIGN KEY (account_id, {column})"
                   f" REFERENCES {referenced} (account_id, id)")
    _add_application_references()


def downgrade() -> None:
    _drop_dependent_foreign_keys()
    op.execute("ALTER TABLE operational_deliveries DROP CONSTRAINT uq_operational_deliveries_account_id_event_id_endpoint_id")
    op.execute("DROP INDEX ix_ledger_entries_seq")
    for table, columns in _BARE_KEY_INDEXES.items():
        op.execute(f"DROP INDEX {_index_name(table, columns)}")
    for table, columns in _OLD_KEYS.items():
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT pk_{table},"
                   f" ADD CONSTRAINT pk_{table} PRIMARY KEY ({_columns(columns)})")
    op.execute("CREATE INDEX ix_deliveries_account_id_id ON deliveries (account_id, id)")
    op.execute("ALTER TABLE operational_events ADD CONSTRAINT uq_operational_events_seq UNIQUE (seq)")
    op.execute("ALTER TABLE ledger_entries ADD CONSTRAINT uq_ledger_entries_seq UNIQUE (seq)")
    op.execute("ALTER TABLE operational_deliveries ADD CONSTRAINT uq_operational_deliveries_event_id_endpoint_id"
               " UNIQUE (event_id, endpoint_id)")
    op.execute("ALTER TABLE applications ADD CONSTRAINT uq_applications_account_id_id UNIQUE (account_id, id)")
    for name, (column, referenced) in _OPERATIONAL_FOREIGN_KEYS.items():
        op.execute(f"ALTER TABLE operational_deliveries ADD CONSTRAINT {name} FOREIGN KEY ({column})"
                   f" REFERENCES {referenced} (id)")
    _add_application_references()
