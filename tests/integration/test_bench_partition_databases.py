"""The benchmarks' fresh databases for --partitions (scripts/scratch_database.py): a count of 1
migrates plain tables even where this process has HOOKLEDGER_ACCOUNT_PARTITIONS set, and a count of
8 makes every partitioned table with exactly 8 partitions, accounts' rows among them (what the
benchmarks compare; a migration that ignored the option would make the comparison say nothing)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import scratch_database  # noqa: E402  (scripts/ is not a package)


async def test_one_partition_is_plain_tables_whatever_the_environment_says(postgres_server_url, monkeypatch):
    monkeypatch.setenv(scratch_database.PARTITIONS_VARIABLE, "8")
    async with scratch_database.scratch_database(postgres_server_url, "hookledger_test_bench", partitions=1) as url:
        assert await scratch_database.partitioned_tables(url) == {}


async def test_eight_partitions_partition_the_account_scoped_tables_eight_ways(postgres_server_url, monkeypatch):
    monkeypatch.delenv(scratch_database.PARTITIONS_VARIABLE, raising=False)
    async with scratch_database.scratch_database(postgres_server_url, "hookledger_test_bench", partitions=8) as url:
        layout = await scratch_database.partitioned_tables(url)
    assert {"deliveries", "ledger_entries", "messages"} <= set(layout)
    assert set(layout.values()) == {8}
