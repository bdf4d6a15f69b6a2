"""`hookledger run` (what ./scripts/run does) brings up the platform on embedded servers and the demo passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_run_demo_on_embedded_servers(tmp_path: Path) -> None:
    """No DATABASE_URL / REDIS_URL: embedded PostgreSQL and Redis, API, worker and listen as processes;
    the demo goes through the API, the SDK and the CLI, every delivery ends, the audit is clean."""
    environment = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    environment.update(HOOKLEDGER_DATA_DIR=str(tmp_path / "data"), COLUMNS="200")
    completed = subprocess.run([sys.executable, "-m", "delivery", "run", "--demo-only", "--port", "0"], cwd=ROOT,
                               env=environment, capture_output=True, text=True, timeout=240)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-4000:]
    assert "audit clean" in output
    assert "already accepted under this key" in output  # the second send under one idempotency key
    assert "verified and printed 2 webhook(s)" in output
    assert 'hookledger_deliveries_total{outcome="delivered"} 2.0' in output  # the worker's own /metrics
    assert 'hookledger_refunds_total{reason="out_of_retries"} 2.0' in output
    assert (tmp_path / "data" / "postgres" / "PG_VERSION").exists()  # the embedded server's data dir
    secrets_file = tmp_path / "data" / "dev-secrets.json"
    assert oct(secrets_file.stat().st_mode & 0o777) == "0o600"
