"""Convert the distributed tables to hash-partitioned tables and back, from the catalog.

Migration 0023 calls `partition(bind, n)` (and its downgrade `unpartition(bind)`) for the tables
of billing.distribution.DISTRIBUTED. Nothing here names a table's columns, keys, indexes or
triggers: they are read from the catalog (pg_index, pg_constraint, pg_trigger, pg_statistic_ext
with pg_get_*def) and made again on the new table, so whatever a later migration adds is carried
too. Each table is converted in these steps, all in the migration's one transaction:

1. read its definition; the foreign keys from or to any table being converted are dropped first
   (and made again last), so the tables can be replaced one by one;
2. drop its key constraints and indexes (their names are the schema's), rename it aside, and its
   identity sequences, whose names the new table's take again;
3. CREATE TABLE ... (LIKE old INCLUDING ALL EXCLUDING INDEXES EXCLUDING STATISTICS): columns,
   defaults, identity and generated columns, NOT NULL and CHECK constraints, column comments;
   PARTITION BY HASH (<its distribution column>) and N partitions <table>_p<k> (MODULUS N,
   REMAINDER k), or a plain table on the way back;
4. copy the rows (OVERRIDING SYSTEM VALUE keeps the identity values; generated columns are
   computed again) and carry each identity sequence's position over; drop the old table;
5. make its keys, indexes (partial ones too), extended statistics, table comment and triggers
   again, each trigger in its enabled state (ENABLE ALWAYS / REPLICA, DISABLE).

Triggers, in PostgreSQL 15. A row-level trigger on a partitioned table is cloned to every
partition and fires for a row whichever table the statement named. A statement-level trigger
(TRUNCATE guards, the statement-level reference checks with transition tables, NOTIFY) fires
only for the table the statement names: it is made on the partitioned table, which every
statement of the code names, and also on each partition, so that a statement naming a
partition directly (a person in psql truncating ledger_entries_p3) meets the same guard.
PostgreSQL refuses a row-level trigger with a transition table on a partitioned table; the
schema has none (each such check is statement-level), and a later one is refused here by name,
with the way to keep its behaviour: make it FOR EACH STATEMENT, reading the transition table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from billing import distribution

# Where an old table waits while its rows are copied; dropped in the same transaction.
_ASIDE_SUFFIX = "__unconverted"

_INDEXES = """
SELECT i.relname AS name, pg_get_indexdef(x.indexrelid) AS definition,
       obj_description(x.indexrelid, 'pg_class') AS comment
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
WHERE x.indrelid = $1::text::regclass
  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = x.indexrelid AND c.conrelid = x.indrelid)
ORDER BY i.relname
"""
# Primary, unique and exclusion keys (index-backed constraints): not the CHECKs, which LIKE copies.
_KEYS = """
SELECT conname AS name, pg_get_constraintdef(oid) AS definition, obj_description(oid, 'pg_constraint') AS comment
FROM pg_constraint WHERE conrelid = $1::text::regclass AND contype IN ('p', 'u', 'x') AND conparentid = 0
ORDER BY contype, conname
"""
_FOREIGN_KEYS = """
SELECT DISTINCT c.conname AS name, c.conrelid::regclass::text AS table_name, pg_get_constraintdef(c.oid) AS definition
FROM pg_constraint c
WHERE c.contype = 'f' AND c.conparentid = 0
  AND (c.conrelid::regclass::text = ANY($1::text[]) OR c.confrelid::regclass::text = ANY($1::text[]))
ORDER BY 2, 1
"""
# A trigger's own (not a clone on a partition, not a constraint's internal one). tgtype bit 0: FOR EACH ROW.
_TRIGGERS = """
SELECT tgname AS name, pg_get_triggerdef(oid) AS definition, tgenabled::text AS enabled,
       (tgtype & 1) = 1 AS row_level, (tgoldtable IS NOT NULL OR tgnewtable IS NOT NULL) AS transition_tables
FROM pg_trigger WHERE tgrelid = $1::text::regclass AND NOT tgisinternal AND tgparentid = 0
ORDER BY tgname
"""
_STATISTICS = """
SELECT pg_get_statisticsobjdef(oid) AS definition FROM pg_statistic_ext WHERE stxrelid = $1::text::regclass ORDER BY stxname
"""
_IDENTITY_SEQUENCES = """
SELECT a.attname AS column_name, pg_get_serial_sequence(quote_ident($2), a.attname) AS sequence
FROM pg_attribute a
WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped AND a.attidentity <> ''
"""
# The columns a copy writes: not the generated ones, which the new table computes again.
_COPIED_COLUMNS = """
SELECT quote_ident(attname) FROM pg_attribute
WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum
"""
_PARTITIONING = """
SELECT c.relkind::text AS kind, (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = c.oid) AS partitions
FROM pg_class c WHERE c.oid = $1::text::regclass
"""
# Each index of a partition that is a copy of an index of `table`, with its parent's name.
_PARTITION_INDEXES = """
SELECT child.relname AS name, parent.relname AS parent, t.relname AS partition
FROM pg_inherits i JOIN pg_class child ON child.oid = i.inhrelid JOIN pg_class parent ON parent.oid = i.inhparent
JOIN pg_index x ON x.indexrelid = child.oid JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_inherits p ON p.inhrelid = t.oid AND p.inhparent = $1::text::regclass
WHERE parent.relkind = 'I'
ORDER BY 1
"""
_NAME_LENGTH_MAX = 63  # PostgreSQL's NAMEDATALEN - 1
_ENABLED = {"O": None, "D": "DISABLE TRIGGER", "A": "ENABLE ALWAYS TRIGGER", "R": "ENABLE REPLICA TRIGGER"}


class PartitioningRefused(RuntimeError):
    """A table has something PostgreSQL 15 does not allow on a partitioned table."""


@dataclass
class _Definition:
    """What a table has beyond what CREATE TABLE ... LIKE copies."""

    table: str
    keys: list = field(default_factory=list)
    indexes: list = field(default_factory=list)
    triggers: list = field(default_factory=list)
    statistics: list = field(default_factory=list)
    comment: str | None = None


def partition(bind, partitions: int) -> None:
    """Make every distributed table PARTITION BY HASH (its distribution column) with `partitions`
    partitions, keeping its rows and everything defined on it."""
    assert 2 <= partitions <= distribution.PARTITIONS_MAX, partitions
    _convert(bind, partitions)


def unpartition(bind) -> None:
    """Make every distributed table a plain table again, keeping its rows and everything on it."""
    _convert(bind, 1)


def partitions_of(bind, table: str) -> int:
    """How many partitions `table` has; 0 for a plain table."""
    row = _rows(bind, _PARTITIONING, table)[0]
    return int(row["partitions"]) if row["kind"] == "p" else 0


def name_partition_indexes(bind, table: str) -> None:
    """Name the partitions' copies of the indexes of a partitioned `table` `<index>_p<k>`, as
    `partition` does: for a later migration that makes an index on a table already partitioned
    (the copies named so already are left as they are)."""
    _name_partition_indexes(bind, table)


def _name_partition_indexes(bind, table: str) -> None:
    """Name each partition's copy of an index (and of a key) `<index>_p<k>`, after its parent and its
    partition, instead of PostgreSQL's made-up names: a unique violation names the partition's
    index, and code that tells violations apart by name (billing.distribution.is_index_or_its_copy)
    then knows it."""
    for row in _rows(bind, _PARTITION_INDEXES, table):
        name = row["parent"] + row["partition"][len(table):]
        assert len(name) <= _NAME_LENGTH_MAX, name
        if row["name"] != name:
            _execute(bind, f"ALTER INDEX {_quote(row['name'])} RENAME TO {_quote(name)}")


def _rows(bind, statement: str, *parameters) -> list:
    return list(bind.exec_driver_sql(statement, parameters).mappings())


def _execute(bind, statement: str) -> None:
    bind.exec_driver_sql(statement)


def _convert(bind, partitions: int) -> None:
    tables = list(distribution.DISTRIBUTED)
    foreign_keys = _rows(bind, _FOREIGN_KEYS, tables)
    for key in foreign_keys:
        _execute(bind, f'ALTER TABLE {key["table_name"]} DROP CONSTRAINT {_quote(key["name"])}')
    for table in tables:
        _replace(bind, _read(bind, table), partitions)
    for key in foreign_keys:
        _execute(bind, f'ALTER TABLE {key["table_name"]} ADD CONSTRAINT {_quote(key["name"])} {key["definition"]}')


def _read(bind, table: str) -> _Definition:
    definition = _Definition(
        table=table,
        keys=_rows(bind, _KEYS, table),
        indexes=_rows(bind, _INDEXES, table),
        triggers=_rows(bind, _TRIGGERS, table),
        statistics=[row["definition"] for row in _rows(bind, _STATISTICS, table)],
        comment=bind.exec_driver_sql("SELECT obj_description($1::text::regclass, 'pg_class')", (table,)).scalar(),
    )
    for trigger in definition.triggers:
        if trigger["row_level"] and trigger["transition_tables"]:
            raise PartitioningRefused(
                f"trigger {trigger['name']} on {table} is FOR EACH ROW with a transition table, which PostgreSQL"
                " refuses on a partitioned table: make it FOR EACH STATEMENT, reading the transition table")
    return definition


def _replace(bind, definition: _Definition, partitions: int) -> None:
    table = definition.table
    aside = table + _ASIDE_SUFFIX
    for key in definition.keys:
        _execute(bind, f"ALTER TABLE {table} DROP CONSTRAINT {_quote(key['name'])}")
    for index in definition.indexes:
        _execute(bind, f"DROP INDEX {_quote(index['name'])}")
    sequences = _rows(bind, _IDENTITY_SEQUENCES, table, table)
    for sequence in sequences:
        _execute(bind, f"ALTER SEQUENCE {sequence['sequence']} RENAME TO {_bare(sequence['sequence'])}{_ASIDE_SUFFIX}")
    _execute(bind, f"ALTER TABLE {table} RENAME TO {aside}")
    partitioned_by = f" PARTITION BY HASH ({distribution.distribution_column(table)})" if partitions > 1 else ""
    _execute(bind, f"CREATE TABLE {table} (LIKE {aside} INCLUDING ALL EXCLUDING INDEXES EXCLUDING STATISTICS)"
                   + partitioned_by)
    for remainder in range(partitions if partitions > 1 else 0):
        _execute(bind, f"CREATE TABLE {distribution.partition_name(table, remainder)} PARTITION OF {table}"
                       f" FOR VALUES WITH (MODULUS {partitions}, REMAINDER {remainder})")
    columns = ", ".join(bind.exec_driver_sql(_COPIED_COLUMNS, (aside,)).scalars())
    _execute(bind, f"INSERT INTO {table} ({columns}) OVERRIDING SYSTEM VALUE SELECT {columns} FROM {aside}")
    for sequence in sequences:
        old = f"{sequence['sequence']}{_ASIDE_SUFFIX}"
        bind.exec_driver_sql(
            f"SELECT setval(pg_get_serial_sequence($1, $2), last_value, is_called) FROM {old}",
            (table, sequence["column_name"]))
    _execute(bind, f"DROP TABLE {aside}")
    _make_again(bind, definition, partitions)


def _make_again(bind, definition: _Definition, partitions: int) -> None:
    table = definition.table
    for key in definition.keys:
        _execute(bind, f"ALTER TABLE {table} ADD CONSTRAINT {_quote(key['name'])} {key['definition']}")
        if key["comment"] is not None:
            bind.exec_driver_sql(f"COMMENT ON CONSTRAINT {_quote(key['name'])} ON {table} IS {_literal(key['comment'])}")
    for index in definition.indexes:
        # A partitioned table's index reads "ON ONLY": made so, it would stay invalid until each
        # partition's were attached. Without ONLY it is made on every partition at once.
        _execute(bind, index["definition"].replace(" ON ONLY ", " ON ", 1))
        if index["comment"] is not None:
            _execute(bind, f"COMMENT ON INDEX {_quote(index['name'])} IS {_literal(index['comment'])}")
    for statistics in definition.statistics:
        _execute(bind, statistics)
    if definition.comment is not None:
        _execute(bind, f"COMMENT ON TABLE {table} IS {_literal(definition.comment)}")
    _name_partition_indexes(bind, table)
    partition_names = [distribution.partition_name(table, remainder) for remainder in range(partitions if partitions > 1 else 0)]
    for trigger in definition.triggers:
        _make_trigger(bind, table, trigger, trigger["definition"])
        if not trigger["row_level"]:
            for name in partition_names:
                _make_trigger(bind, name, trigger, _on(trigger["definition"], table, name))


def _make_trigger(bind, table: str, trigger, definition: str) -> None:
    _execute(bind, definition)
    state = _ENABLED[trigger["enabled"]]
    if state is not None:
        _execute(bind, f"ALTER TABLE {table} {state} {_quote(trigger['name'])}")


def _on(definition: str, table: str, other: str) -> str:
    """A trigger's definition made for another table."""
    for form in (f" ON public.{table} ", f" ON {table} "):
        if form in definition:
            return definition.replace(form, f" ON public.{other} ", 1)
    raise AssertionError(f"no ON {table} in {definition!r}")


def _bare(qualified: str) -> str:
    """A relation's name without its schema (public.x -> x)."""
    return qualified.rsplit(".", 1)[-1]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
