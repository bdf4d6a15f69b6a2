"""A command that cannot run as configured says why in one line and exits 2 (3 when a server does not
answer), starting nothing.

Run as real processes (`python -m delivery ...`), as a user runs them: what is checked is what
reaches the terminal and the exit code, not a traceback's last line.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from delivery.platform import config, run as platform
from signing import Keyring, format_keyring, generate_at_rest_key, generate_secret

ROOT = Path(__file__).resolve().parents[3]


def _hookledger(*arguments: str, environment: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "delivery", *arguments], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def taken_port():
    """A port something else listens on, as another server on a developer's machine would."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


def _one_error_line(completed: subprocess.CompletedProcess) -> str:
    assert completed.returncode == 2, completed.stdout + completed.stderr
    assert "Traceback" not in completed.stderr and "╭" not in completed.stderr, completed.stderr
    text = " ".join(completed.stderr.split())  # rich wraps at the terminal's width
    assert text.startswith("error: "), completed.stderr
    return text


def test_a_malformed_setting_is_one_line_and_exit_2(tmp_path: Path) -> None:
    environment = {**os.environ, "HOOKLEDGER_API_PORT": "eighty", "HOOKLEDGER_DATA_DIR": str(tmp_path / "data")}
    for command in ("api", "worker"):
        text = _one_error_line(_hookledger(command, environment=environment))
        assert "HOOKLEDGER_API_PORT must be an integer, got 'eighty'" in text


def test_the_api_on_a_taken_port_names_the_address_and_the_setting(
    taken_port: int, database_url: str, redis_url: str, tmp_path: Path
) -> None:
    environment = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url,
                   "HOOKLEDGER_API_PORT": str(taken_port), "HOOKLEDGER_OPERATOR_KEY": "op_" + "k" * 32,
                   "HOOKLEDGER_SECRET_KEYS": format_keyring(Keyring({"k1": generate_at_rest_key()}, "k1")),
                   "HOOKLEDGER_DATA_DIR": str(tmp_path / "data")}
    text = _one_error_line(_hookledger("api", environment=environment))
    assert f"cannot listen on 127.0.0.1:{taken_port}" in text and "HOOKLEDGER_API_PORT" in text


def test_listen_on_a_taken_port_names_the_address_and_the_option(taken_port: int) -> None:
    """`hookledger listen` too: one line naming the address and what to change, exit 2, not a traceback."""
    text = _one_error_line(_hookledger("listen", "--port", str(taken_port), "--secret", generate_secret(),
                                       environment=dict(os.environ)))
    assert f"cannot listen on 127.0.0.1:{taken_port}" in text and "address already in use" in text
    assert "--port" in text


def test_run_on_a_taken_port_starts_nothing(taken_port: int, tmp_path: Path) -> None:
    """Checked before the servers start: no data directory, no embedded PostgreSQL or Redis."""
    data_dir = tmp_path / "data"
    environment = {**os.environ, "HOOKLEDGER_DATA_DIR": str(data_dir)}
    for name in ("DATABASE_URL", "REDIS_URL"):
        environment.pop(name, None)
    text = _one_error_line(_hookledger("run", "--demo-only", "--port", str(taken_port), environment=environment))
    assert f"cannot listen on 127.0.0.1:{taken_port}" in text and "--port 0" in text
    assert not data_dir.exists()


def test_the_port_check_follows_the_host_s_address_family() -> None:
    """An IPv6 API host is probed with an IPv6 socket: free is accepted, taken is refused."""
    try:
        listener = socket.socket(socket.AF_INET6)
        listener.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with listener:
        listener.listen()
        taken = listener.getsockname()[1]
        with pytest.raises(config.ConfigError, match=f"cannot listen on ::1:{taken}"):
            platform.check_port_free("::1", taken)
    platform.check_port_free("::1", taken)  # closed now: free again


def _unreachable(completed: subprocess.CompletedProcess) -> str:
    assert completed.returncode == 3, completed.stdout + completed.stderr
    assert "Traceback" not in completed.stderr and "╭" not in completed.stderr, completed.stderr
    text = " ".join(completed.stderr.split())
    assert "error: A server the platform needs did not answer at start" in text, completed.stderr
    return text


def test_a_server_that_does_not_answer_at_start_is_named_with_its_setting_and_exit_3(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    """Once running, the worker rides out a Redis outage; at start it says which server is missing.
    The address is shown without the URL's password."""
    base = {**os.environ, "HOOKLEDGER_DEV": "1", "HOOKLEDGER_DATA_DIR": str(tmp_path / "data"),
            "HOOKLEDGER_SECRET_KEYS": format_keyring(Keyring({"k1": generate_at_rest_key()}, "k1"))}
    port = platform.free_port()  # nothing listens there once it is returned
    no_postgresql = {**base, "DATABASE_URL": f"postgresql://postgres:hunter2@127.0.0.1:{port}/test",
                     "REDIS_URL": redis_url}
    for command in ("api", "worker"):
        text = _unreachable(_hookledger(command, environment=no_postgresql))
        assert f"PostgreSQL at 127.0.0.1:{port} (DATABASE_URL)" in text and "hunter2" not in text
    no_redis = {**base, "DATABASE_URL": database_url, "REDIS_URL": f"redis://:hunter2@127.0.0.1:{port}/0",
                "HOOKLEDGER_REDIS_START_WAIT_SECONDS": "1"}
    for command in ("api", "worker"):
        text = _unreachable(_hookledger(command, environment=no_redis))
        assert f"Redis at 127.0.0.1:{port} (REDIS_URL)" in text and "hunter2" not in text


def test_a_worker_started_while_redis_restarts_waits_for_it(database_url: str, private_redis, tmp_path: Path) -> None:
    """Within HOOKLEDGER_REDIS_START_WAIT_SECONDS a worker waits for Redis instead of exiting: a
    worker replaced during a Redis restart comes up once Redis is back."""
    private_redis.stop()
    environment = {**os.environ, "HOOKLEDGER_DEV": "1", "HOOKLEDGER_DATA_DIR": str(tmp_path / "data"),
                   "DATABASE_URL": database_url, "REDIS_URL": private_redis.url,
                   "HOOKLEDGER_SECRET_KEYS": format_keyring(Keyring({"k1": generate_at_rest_key()}, "k1")),
                   "HOOKLEDGER_SHUTDOWN_GRACE_SECONDS": "1"}  # shutting down is not what this test is about
    log_path = tmp_path / "worker.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "delivery", "worker"], cwd=ROOT, env=environment,
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        # Until it says it is waiting (a fixed sleep was shorter than a slow machine's start-up).
        deadline = time.monotonic() + 20
        while "does not answer" not in log_path.read_text() and time.monotonic() < deadline:
            assert worker.poll() is None, log_path.read_text()
            time.sleep(0.1)
        time.sleep(1)  # and keeps waiting
        assert worker.poll() is None, log_path.read_text()
        private_redis.start()
        deadline = time.monotonic() + 20
        while "worker started" not in log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        text = log_path.read_text()
        assert "worker started" in text and "does not answer" in text, text  # it said it was waiting
    finally:
        worker.terminate()
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:  # a loaded CI machine; graceful shutdown has tests of its own
            worker.kill()
            worker.wait(20)
