"""account partitions: with HOOKLEDGER_ACCOUNT_PARTITIONS=N, the distributed tables hash-partitioned by account

With HOOKLEDGER_ACCOUNT_PARTITIONS unset, 0 or 1 this migration changes nothing: plain tables.
With N from 2 to 64, every table of billing.distribution.DISTRIBUTED becomes PARTITION BY HASH
(account_id) (accounts: by id) with N partitions <table>_p<k>, keeping its rows, keys, indexes,
foreign keys both ways, triggers (and their enabled state) and statistics
(migrations.account_partitions, which reads them from the catalog). PostgreSQL then enforces on
one server the key rules a distributed engine (Citus) would: every primary key and unique index
includes the distribution column. Anything else in the variable is refused before anything changes.

The downgrade makes any partitioned distributed table plain again, whatever the variable says now.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06
"""
from alembic import op

from billing import distribution
from migrations import account_partitions

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None


def upgrade() -> None:
    partitions = distribution.account_partitions()
    if partitions > 1:
        account_partitions.partition(op.get_bind(), partitions)


def downgrade() -> None:
    bind = op.get_bind()
    if account_partitions.partitions_of(bind, "ledger_entries") > 0:
        account_partitions.unpartition(bind)
