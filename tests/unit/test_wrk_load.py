"""scripts/wrk_load.py, the ingest benchmark's wrk load: its report is read right, its script
refuses what it cannot quote, and (where wrk is installed) a real run against a loopback server
sends the body with the keys in turn and counts what the server answered."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from loopback_messages_server import BODY, KEYS, assert_each_key_in_turn, counting_handler, serving

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import wrk_load  # noqa: E402  (scripts/ is not a package)

REPORT = """Running 1s test @ http://127.0.0.1:8080/v1/messages
  1 threads and 96 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     5.12ms    1.02ms  20.01ms   90.00%
    Req/Sec    18.90k     1.20k   20.10k    80.00%
  18793 requests in 1.00s, 3.10MB read
  Non-2xx or 3xx responses: 12
Requests/sec:  18793.00
Transfer/sec:      3.10MB
"""


@pytest.mark.parametrize(("report", "expected"), [
    (REPORT, (18793, 1.0, 12)),
    (REPORT.replace("  Non-2xx or 3xx responses: 12\n", ""), (18793, 1.0, 0)),
    (REPORT.replace("in 1.00s", "in 999.50ms"), (18793, 0.9995, 12)),
])
def test_the_report_gives_requests_seconds_and_failures(report, expected):
    assert wrk_load.parse(report) == expected


def test_a_report_without_a_count_is_an_error():
    with pytest.raises(ValueError, match="no request count"):
        wrk_load.parse("unable to connect to 127.0.0.1:1 Connection refused\n")


@pytest.mark.parametrize(("keys", "body", "message"), [
    ([], b"{}", "1 to"),
    (['a"b'], b"{}", "cannot quote"),
    (["k1"], b'{"x":"]==]"}', "terminator"),
])
def test_the_script_refuses_what_it_cannot_quote(keys, body, message):
    with pytest.raises(ValueError, match=message):
        wrk_load._script(keys, body)


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (apt-get install wrk)")
async def test_a_real_run_sends_the_body_with_each_key_in_turn(unused_tcp_port):
    seen: list[tuple[str, bytes, str]] = []
    async with serving(unused_tcp_port, counting_handler(seen)) as url:
        rate, statuses = await wrk_load.load(url, KEYS, BODY, 1, 4)
    assert_each_key_in_turn(seen, spread=len(seen) // 3)
    failed = len(seen) // 7
    # wrk counts what it finished in its time; the server may have seen a request or two more.
    assert abs(statuses.get("non-2xx", 0) - failed) <= 4
    assert abs(statuses[202] - (len(seen) - failed)) <= 8
    assert rate > 0
