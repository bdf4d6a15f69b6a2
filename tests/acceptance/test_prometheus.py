"""The monitoring files an operator starts from hold against a real Prometheus.

Debian's prometheus (scripts/test installs it where missing, as it does chromium) scrapes a real
`hookledger api` and `hookledger worker` on loopback, loads delivery/platform/monitoring's rules
(promtool checks them first), and its HTTP API gives back the lag series, the workers reporting
and every rule loaded. Every metric name the rules and the Grafana dashboard use is one we export.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from delivery import metrics

MONITORING = Path(__file__).resolve().parents[2] / "delivery" / "platform" / "monitoring"
RULES = MONITORING / "prometheus-rules.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
OPERATOR_KEY = "op_prometheus_" + "k" * 32
WAIT_SECONDS = 60

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                reason="Debian's prometheus is not installed (scripts/test installs it when run as root)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _exported_names() -> set[str]:
    """Every series name /metrics can carry: the registry's, with the suffixes Prometheus adds."""
    names = {"hookledger_workers_reporting"}  # added by delivery.engine.metrics_share at the scrape
    for family in metrics.REGISTRY.collect():
        names.add(family.name)
        names.update(family.name + suffix for suffix in ("_total", "_bucket", "_sum", "_count", "_created"))
    return names


def test_the_rules_and_the_dashboard_use_only_series_we_export():
    used = set(re.findall(r"\bhookledger_[a-z_]+", RULES.read_text()))
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel["targets"]:
            used |= set(re.findall(r"\bhookledger_[a-z_]+", target["expr"]))
    assert len(used) >= 10
    assert used - _exported_names() == set()


def test_promtool_accepts_the_rules():
    completed = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "SUCCESS: 8 rules found" in completed.stdout


def _start(command: list[str], environment: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(command, env=environment, stdout=log.open("w"), stderr=subprocess.STDOUT)


def _wait_until(check, what: str, processes: list[subprocess.Popen]):
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        try:
            found = check()
            if found:
                return found
        except requests.ConnectionError:
            pass
        for process in processes:
            assert process.poll() is None, f"{process.args} exited while waiting for {what}"
        assert time.monotonic() < deadline, f"no {what} within {WAIT_SECONDS} s"
        time.sleep(0.5)


def test_prometheus_scrapes_the_api_and_a_worker_and_loads_the_rules(make_database, redis_url, tmp_path):
    api_port, worker_port, prometheus_port = _free_port(), _free_port(), _free_port()
    environment = {
        **os.environ, "DATABASE_URL": make_database("hookledger_prom"), "REDIS_URL": redis_url,
        "HOOKLEDGER_OPERATOR_KEY": OPERATOR_KEY, "HOOKLEDGER_SECRET_KEYS": "k1:" + "A" * 43 + "=",
        "HOOKLEDGER_DEV": "1", "HOOKLEDGER_API_PORT": str(api_port), "HOOKLEDGER_LOG_LEVEL": "warning",
        "HOOKLEDGER_WORKER_METRICS_PORT": str(worker_port), "HOOKLEDGER_WORKER_METRICS_SHARE_SECONDS": "1",
        "HOOKLEDGER_DATA_DIR": str(tmp_path / "data"),
    }
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{RULES}']\n"
        "scrape_configs:\n"
        f"  - job_name: api\n    static_configs: [{{targets: ['127.0.0.1:{api_port}']}}]\n"
        f"  - job_name: worker\n    static_configs: [{{targets: ['127.0.0.1:{worker_port}']}}]\n")
    processes = [
        _start([sys.executable, "-m", "delivery", "api"], environment, tmp_path / "api.log"),
        _start([sys.executable, "-m", "delivery", "worker"], environment, tmp_path / "worker.log"),
        _start(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prometheus_port}"], environment, tmp_path / "prometheus.log"),
    ]
    prometheus = f"http://127.0.0.1:{prometheus_port}"

    def query(expression: str) -> list[dict]:
        answer = requests.get(f"{prometheus}/api/v1/query", params={"query": expression}, timeout=5).json()
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    try:
        lag = _wait_until(lambda: query('hookledger_oldest_due_delivery_age_seconds{job="api"}'), "lag series", processes)
        assert float(lag[0]["value"][1]) >= 0
        waiting = _wait_until(lambda: query("hookledger_deliveries_waiting"), "waiting series", processes)
        assert {sample["metric"]["state"] for sample in waiting} == {"pending", "sending"}
        workers = _wait_until(lambda: query('hookledger_workers_reporting{job="api"} >= 1'), "a worker reporting",
                              processes)
        assert float(workers[0]["value"][1]) >= 1
        assert _wait_until(lambda: query('up{job="worker"} == 1'), "the worker's own port scraped", processes)
        # The money and the worker's steps: the credits counters and the worker's histograms, from both scrapes.
        assert _wait_until(lambda: query('hookledger_credits_charged_total{job="api"}'), "credits charged", processes)
        assert _wait_until(lambda: query('hookledger_credits_refunded_total{job="api"}'), "credits refunded", processes)
        assert _wait_until(lambda: query('hookledger_worker_answer_to_record_seconds_count{job="worker"}'),
                           "the worker's answer-to-record histogram", processes)
        groups = _wait_until(lambda: requests.get(f"{prometheus}/api/v1/rules", timeout=5).json()["data"]["groups"],
                             "rules loaded", processes)
        names = {rule["name"] for group in groups for rule in group["rules"]}
        assert names == {"HookledgerAuditViolations", "HookledgerNoWorkers", "HookledgerDeliveriesLate",
                         "HookledgerDeadRateHigh", "HookledgerRedisUnreachable", "HookledgerCommitOutcomeUnknown",
                         "HookledgerEndpointFarBehind", "HookledgerResultsRecordedSlowly"}
        assert all(rule["health"] != "err" for group in groups for rule in group["rules"])
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
