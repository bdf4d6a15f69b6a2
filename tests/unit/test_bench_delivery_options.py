"""scripts/bench_delivery.py --answer-ms: refused with a clear error unless a whole number of
milliseconds up to a minute; with it, each endpoint has a loopback address of its own."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_delivery  # noqa: E402  (scripts/ is not a package)


def test_answer_ms_is_a_whole_number_of_milliseconds_up_to_a_minute():
    assert bench_delivery._answer_ms("0") == 0
    assert bench_delivery._answer_ms("50") == 50
    assert bench_delivery._answer_ms("60000") == 60_000
    for bad in ("", "-1", "1.5", "fifty", "60001"):
        with pytest.raises(argparse.ArgumentTypeError, match="whole number of milliseconds, 0 to 60000"):
            bench_delivery._answer_ms(bad)


def test_each_endpoint_has_a_loopback_address_of_its_own_past_127_0_0_1():
    hosts = [bench_delivery._endpoint_host(number) for number in range(600)]
    assert hosts[0] == "127.0.0.2" and hosts[253] == "127.0.0.255" and hosts[254] == "127.0.1.0"
    assert len(set(hosts)) == 600 and "127.0.0.1" not in hosts
