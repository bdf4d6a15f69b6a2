"""Which tables are distributed by account, and which are reference tables: the one list.

A distributed engine (Citus) shards a DISTRIBUTED table by its distribution column: every
primary key, unique constraint and unique index of it includes that column, and every foreign
key between two of them pairs the columns (migration 0022; tests/integration/
test_account_keys_catalog.py checks the catalog against these lists). With
HOOKLEDGER_ACCOUNT_PARTITIONS=N (migration 0023) PostgreSQL hash-partitions each of them by that
column, which enforces the same key rules on one server.

A REFERENCE table is read by a token or a key hash before the account is known: small, rarely
written, it would be a reference table on Citus (a copy on every node) and is never partitioned.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

# The column each distributed table is sharded by: its account.
ACCOUNT_COLUMN = "account_id"

DISTRIBUTED: tuple[str, ...] = (
    "accounts",  # by its own id: the account is the shard key
    "account_deletions",
    "applications",
    "application_counts",
    "deliveries",
    "delivery_attempts",
    "endpoints",
    "event_types",
    "ledger_entries",
    "messages",
    "operational_deliveries",
    "operational_endpoints",
    "operational_events",
)

# Each reference table with why it is one.
REFERENCE: dict[str, str] = {
    "api_keys": "found by the hash of the key a request carries, before its account is known",
    "dashboard_sessions": "found by a cookie's token hash; an operator's session has no account at all",
    "portal_links": "found by the token hash of a magic link, before its account is known",
    "portal_sessions": "found by the token hash of a portal cookie, before its account is known",
    "idempotent_responses": "keyed by a principal that is an account's id as text or 'operator', not by account_id",
}

# Tables that belong to neither list: the migrations' own bookkeeping.
NOT_ACCOUNT_DATA: tuple[str, ...] = ("alembic_version",)


def distribution_column(table: str) -> str:
    """The column `table` is distributed (and partitioned) by; a KeyError for any other table."""
    if table == "accounts":
        return "id"
    if table in DISTRIBUTED:
        return ACCOUNT_COLUMN
    raise KeyError(f"{table} is not a distributed table")


# HOOKLEDGER_ACCOUNT_PARTITIONS, read at migrate time only (migration 0023): how many hash
# partitions each distributed table has. Unset, 0 or 1: plain tables.
PARTITIONS_VARIABLE = "HOOKLEDGER_ACCOUNT_PARTITIONS"
PARTITIONS_MAX = 64  # a bound on the tables a migration makes: 13 tables times this


def partition_name(table: str, remainder: int) -> str:
    """The name of a distributed table's partition holding the hashes of `remainder` (MODULUS N)."""
    return f"{table}_p{remainder}"


_PARTITION_NAME = re.compile("(" + "|".join(DISTRIBUTED) + r")_p[0-9]+")


def is_partition_name(name: str) -> bool:
    """Whether `name` is a partition of a distributed table (what comparisons with billing.tables skip)."""
    return _PARTITION_NAME.fullmatch(name) is not None


def is_index_or_its_copy(name: str | None, index: str) -> bool:
    """Whether a constraint or index `name` (a driver error's constraint_name) is `index` or its copy
    on a partition, `<index>_p<k>` (migration 0023 names them so): a unique violation on a
    partitioned table names the partition's index."""
    return name is not None and (name == index or re.fullmatch(re.escape(index) + "_p[0-9]+", name) is not None)


class PartitionsSettingError(ValueError):
    """HOOKLEDGER_ACCOUNT_PARTITIONS is not a whole number from 0 to 64."""


def account_partitions(environ: Mapping[str, str] | None = None) -> int:
    """The partitions per distributed table that HOOKLEDGER_ACCOUNT_PARTITIONS asks for; 1 for plain
    tables (unset, empty, 0 or 1). Anything but a whole number from 0 to PARTITIONS_MAX raises."""
    raw = (os.environ if environ is None else environ).get(PARTITIONS_VARIABLE, "").strip()
    if raw == "":
        return 1
    if not raw.isdigit() or int(raw) > PARTITIONS_MAX:
        raise PartitionsSettingError(
            f"{PARTITIONS_VARIABLE}={raw!r}: expected a whole number from 0 to {PARTITIONS_MAX}"
            " (unset, 0 or 1: plain tables)")
    return max(1, int(raw))


assert len(set(DISTRIBUTED)) == len(DISTRIBUTED), "a table named twice in DISTRIBUTED"
assert not set(DISTRIBUTED) & set(REFERENCE), "a table both distributed and reference"
