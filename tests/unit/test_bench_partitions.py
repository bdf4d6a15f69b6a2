"""The benchmarks' --partitions (scripts/bench_ingest.py, scripts/bench_delivery.py): the list is
refused with a clear error where it is not distinct whole numbers in range, it goes with neither
mode that measures something else, and each run is set beside the first count's as ratios."""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import bench_delivery  # noqa: E402  (scripts/ is not a package)
import bench_ingest  # noqa: E402
import scratch_database  # noqa: E402


def test_the_partition_list_is_distinct_whole_numbers_in_range():
    assert scratch_database.partition_counts("1,8") == [1, 8]
    assert scratch_database.partition_counts("8") == [8]
    assert scratch_database.partition_counts(f"{scratch_database.PARTITIONS_MAX},1") == [scratch_database.PARTITIONS_MAX, 1]
    for bad in ("", "1,", "a", "0", "1,1", "8,8", "1.5", "-8", f"1,{scratch_database.PARTITIONS_MAX + 1}"):
        with pytest.raises(argparse.ArgumentTypeError, match="distinct whole numbers 1 to"):
            scratch_database.partition_counts(bad)


@pytest.mark.parametrize(("script", "other_mode"), [("bench_ingest.py", "--operational-compare"),
                                                     ("bench_ingest.py", "--tracing=off,100%"),
                                                     ("bench_delivery.py", "--custom-headers"),
                                                     ("bench_delivery.py", "--tracing=off,100%")])
def test_partitions_are_refused_beside_a_mode_that_measures_something_else(script, other_mode):
    """The refusal comes from argparse, before any database or server is touched: the servers named
    here listen nowhere, so a script that went on would fail otherwise, not run a benchmark."""
    nowhere = {"DATABASE_URL": "postgresql://postgres@127.0.0.1:9/none", "REDIS_URL": "redis://127.0.0.1:9/0"}
    result = subprocess.run([sys.executable, str(SCRIPTS / script), "--partitions", "1,8", other_mode],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, **nowhere, "PYTHONPATH": str(SCRIPTS.parent)})
    assert result.returncode == 2, result.stderr
    assert "--partitions compares the plain runs" in result.stderr


def _ingest_report(rates: dict[tuple, tuple[float, float]], bare: dict[tuple, float]) -> dict:
    return {"api": [{"concurrency": concurrency, "fan_out": fan_out, "accounts": accounts, "messages_per_second": rate,
                     "share_of_trivial": share} for (concurrency, fan_out, accounts), (rate, share) in rates.items()],
            "bare_sql": [{"fan_out": fan_out, "accounts": accounts, "messages_per_second": rate,
                          "share_of_trivial": rate / 10_000} for (fan_out, accounts), rate in bare.items()]}


def test_ingest_sets_each_case_beside_the_first_count_as_rate_and_share_ratios():
    reports = {
        1: _ingest_report({(96, 1, "1,000 accounts"): (8_000, 0.5), (96, 1, "one hot account"): (9_000, 0.6)},
                          {(1, "many accounts"): 2_000}),
        8: _ingest_report({(96, 1, "1,000 accounts"): (6_000, 0.45), (96, 1, "one hot account"): (9_900, 0.6)},
                          {(1, "many accounts"): 1_000}),
    }
    found = {(row["kind"], row["accounts"]): row["by_partitions"] for row in bench_ingest.compare_partitions(reports)}
    assert set(found) == {("api", "1,000 accounts"), ("api", "one hot account"), ("bare_sql", "many accounts")}
    many = found["api", "1,000 accounts"]
    assert (many[1]["rate_ratio"], many[1]["share_ratio"]) == (1.0, 1.0)
    assert many[8]["rate_ratio"] == pytest.approx(0.75) and many[8]["share_ratio"] == pytest.approx(0.9)
    assert found["api", "one hot account"][8]["rate_ratio"] == pytest.approx(1.1)
    assert found["bare_sql", "many accounts"][8]["rate_ratio"] == pytest.approx(0.5)


def test_ingest_ratios_follow_the_first_count_given_not_the_smallest():
    reports = {8: _ingest_report({(96, 4, "one hot account"): (4_000, 0.4)}, {}),
               1: _ingest_report({(96, 4, "one hot account"): (5_000, 0.5)}, {})}
    (row,) = bench_ingest.compare_partitions(reports)
    assert row["by_partitions"][8]["rate_ratio"] == 1.0
    assert row["by_partitions"][1]["rate_ratio"] == pytest.approx(1.25)


def test_delivery_sets_each_run_beside_the_first_count_and_a_drain_beside_its_ceiling():
    results = {
        1: {"event_loop": "uvloop", "ceiling": {"rate": 10_000.0}, "drain1": {"rate": 3_000.0, "ceiling": 10_000.0},
            "latency": {"p50_ms": 10.0, "p99_ms": 40.0}, "naive": {"rate": 300.0}},
        8: {"event_loop": "uvloop", "ceiling": {"rate": 8_000.0}, "drain1": {"rate": 2_400.0, "ceiling": 6_000.0},
            "latency": {"p50_ms": 12.0, "p99_ms": 30.0}, "naive": {"rate": 0.0}},
    }
    found = {row["run"]: row["by_partitions"] for row in bench_delivery.compare_partitions(results)}
    assert set(found) == {"ceiling", "drain1", "latency", "naive"}
    assert found["drain1"][8]["rate_ratio"] == pytest.approx(0.8)
    assert found["drain1"][1]["share_of_ceiling"] == pytest.approx(0.3)
    assert found["drain1"][8]["share_of_ceiling_ratio"] == pytest.approx(0.4 / 0.3)
    assert (found["latency"][8]["p50_ms_ratio"], found["latency"][8]["p99_ms_ratio"]) == (pytest.approx(1.2), 0.75)
    assert found["ceiling"][8]["rate_ratio"] == pytest.approx(0.8)
    assert found["naive"][8]["rate_ratio"] == 0.0


def test_a_first_run_that_made_nothing_gives_no_ratio_rather_than_an_error():
    results = {1: {"drain2": {"rate": 0.0, "ceiling": 5_000.0}}, 8: {"drain2": {"rate": 100.0, "ceiling": 5_000.0}}}
    (row,) = bench_delivery.compare_partitions(results)
    assert math.isnan(row["by_partitions"][8]["rate_ratio"])
