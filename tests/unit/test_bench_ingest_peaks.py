"""scripts/bench_ingest.py's peaks: each case at the concurrency where the API made the most,
against the trivial handler at the concurrency where the mean of its runs was the highest; and
its --concurrency list, refused with a clear error where it is not one."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_ingest  # noqa: E402  (scripts/ is not a package)


def _api(concurrency: int, fan_out: int, accounts: str, rate: float) -> dict:
    return {"concurrency": concurrency, "fan_out": fan_out, "accounts": accounts, "messages_per_second": rate}


def test_each_case_takes_its_own_best_concurrency_and_the_trivial_handler_its_best_mean():
    report = {
        # The mean decides the trivial handler's best: 96 has the single highest run, 64 the highest mean.
        "trivial": [{"concurrency": 64, "each": [15_000, 15_000, 15_000]},
                    {"concurrency": 96, "each": [16_000, 13_000, 13_000]},
                    {"concurrency": 256, "each": [14_000, 14_000, 14_000]}],
        "api": [_api(96, 1, "1,000 accounts", 9_000), _api(96, 1, "one hot account", 11_000),
                _api(256, 1, "1,000 accounts", 12_000), _api(256, 1, "one hot account", 10_500),
                _api(96, 4, "1,000 accounts", 6_000), _api(256, 4, "1,000 accounts", 5_000)],
    }
    found = {(peak["fan_out"], peak["accounts"]): peak for peak in bench_ingest.peaks(report)}
    assert set(found) == {(1, "1,000 accounts"), (1, "one hot account"), (4, "1,000 accounts")}
    assert (found[1, "1,000 accounts"]["concurrency"], found[1, "1,000 accounts"]["messages_per_second"]) == (256, 12_000)
    assert (found[1, "one hot account"]["concurrency"], found[1, "one hot account"]["messages_per_second"]) == (96, 11_000)
    assert found[4, "1,000 accounts"]["concurrency"] == 96
    for peak in found.values():
        assert (peak["trivial_concurrency"], peak["trivial_per_second"]) == (64, 15_000)
    assert found[1, "1,000 accounts"]["share_of_trivial"] == pytest.approx(0.8)
    assert found[4, "1,000 accounts"]["share_of_trivial"] == pytest.approx(0.4)


def test_one_concurrency_sets_each_case_beside_that_concurrency_s_mean():
    report = {"trivial": [{"concurrency": 96, "each": [10_000, 12_000]}],
              "api": [_api(96, 1, "one hot account", 6_600)]}
    (peak,) = bench_ingest.peaks(report)
    assert (peak["concurrency"], peak["trivial_concurrency"]) == (96, 96)
    assert peak["share_of_trivial"] == pytest.approx(0.6)


def test_the_concurrency_list_is_whole_numbers_of_1_to_1024():
    assert bench_ingest.concurrencies("96,256") == [96, 256]
    for bad in ("", "96,", "a", "0", "96,2000", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match="whole numbers 1 to 1024"):
            bench_ingest.concurrencies(bad)
