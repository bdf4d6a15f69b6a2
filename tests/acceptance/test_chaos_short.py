"""The short chaos run (scripts/chaos.py --short) passes: every invariant holds under injected faults.

It runs as a subprocess with DATABASE_URL and REDIS_URL removed, so it starts an embedded
PostgreSQL and Redis of its own: that is what lets it restart PostgreSQL, FLUSHALL Redis and stop
it for a while without touching the servers the rest of the suite (or anyone else) uses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from billing.distribution import account_partitions

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
RUN_SECONDS_MAX = 150  # the run takes about a minute here; a hang fails instead of blocking CI


def test_short_chaos_run_passes(tmp_path: Path) -> None:
    """Two APIs and two workers, SIGKILL/SIGTERM of workers, FLUSHALL, PostgreSQL and API restarts, a
    receiver outage and Redis outages while about 2,000 deliveries go out, with a one-day retention made
    to pass in seconds and expunges: exit 0, every check holds (the erasure checks among them: no body
    went out erased, no attempt after an erasure, no ledger entry changed), every fault kind ran, and
    both retention and expunges erased payloads."""
    environment = {name: value for name, value in os.environ.items() if name not in ("DATABASE_URL", "REDIS_URL")}
    summary_path = tmp_path / "chaos-summary.json"
    completed = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chaos.py"), "--short", "--seed", "7", "--summary", str(summary_path)],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=RUN_SECONDS_MAX, check=False)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-6000:]
    summary = json.loads(summary_path.read_text())
    assert summary["passed"] and all(check["passed"] for check in summary["checks"])
    assert set(summary["faults"]["injected"]) == {"sigkill_worker", "sigterm_worker", "flush_redis",
                                                  "restart_postgres", "restart_api", "receiver_outage",
                                                  "redis_outage"}
    assert summary["load"]["deliveries_accepted"] >= 1_500
    assert summary["load"]["accounts_deleted"] >= 2
    names = {check["name"] for check in summary["checks"]}
    assert {"no body went out erased: every signed body was a payload the workload sent",
            "no attempt started after its message was expunged or erased by retention",
            "no response excerpt kept of an erased message"} <= names
    # The run took the schema the environment asks for: CI runs it once with the account tables
    # hash-partitioned (HOOKLEDGER_ACCOUNT_PARTITIONS=8), and the checks above held there too.
    assert summary["account_partitions"] == account_partitions()
    assert summary["account_shards"] == int(os.environ.get("HOOKLEDGER_ACCOUNT_SHARDS", "1"))
    assert summary["erasure"]["erased_by"]["retention"] > 0 and summary["erasure"]["erased_by"]["expunge"] > 0
