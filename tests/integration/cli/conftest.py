"""Fixtures for the CLI tests: the real API as a subprocess (`python -m delivery api`) on a free
loopback port, on a database of this module's own, shared by the module's tests (each makes its
own account, so they do not see each other's rows).

A subprocess rather than an in-process server: CliRunner swaps sys.stdout while a command runs,
and the API's request logs would land in the command's output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from cli_test_helpers import OPERATOR_KEY, Cli

from delivery.platform.run import free_port
from signing import Keyring, format_keyring, generate_at_rest_key

STARTUP_SECONDS_MAX = 30.0
STOP_SECONDS_MAX = 10.0


@pytest.fixture(scope="module")
def module_database_url(make_database) -> str:
    return make_database("hookledger_cli")


def wait_until_healthy(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS_MAX
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the API exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the API did not answer /healthz within {STARTUP_SECONDS_MAX} s:\n{log.read_text()}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(STOP_SECONDS_MAX)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def server_env(module_database_url: str, redis_server_url: str, tmp_path_factory) -> dict[str, str]:
    """The environment `hookledger api` and `hookledger worker` share (one keyring: the API seals
    endpoint secrets with it, the worker opens them to sign)."""
    return {**os.environ, "DATABASE_URL": module_database_url, "REDIS_URL": redis_server_url,
            "HOOKLEDGER_OPERATOR_KEY": OPERATOR_KEY, "HOOKLEDGER_DEV": "1", "HOOKLEDGER_API_PORT": str(free_port()),
            "HOOKLEDGER_SECRET_KEYS": format_keyring(Keyring({"k1": generate_at_rest_key()}, "k1")),
            "HOOKLEDGER_DATA_DIR": str(tmp_path_factory.mktemp("cli-servers")), "HOOKLEDGER_LOG_LEVEL": "warning"}


def _start(command: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("wb") as output:
        return subprocess.Popen([sys.executable, "-m", "delivery", command], env=env, stdout=output,
                                stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def api_url(server_env):
    """The base URL of a real `hookledger api` process."""
    log = Path(server_env["HOOKLEDGER_DATA_DIR"]) / "api.log"
    process = _start("api", server_env, log)
    url = f"http://127.0.0.1:{server_env['HOOKLEDGER_API_PORT']}"
    try:
        wait_until_healthy(url, process, log)
        yield url
    finally:
        stop(process)


@pytest.fixture(scope="module")
def worker(server_env, api_url):
    """A real `hookledger worker` process on the same database, Redis and keyring as the API."""
    log = Path(server_env["HOOKLEDGER_DATA_DIR"]) / "worker.log"
    process = _start("worker", server_env, log)
    try:
        yield log
    finally:
        stop(process)


@pytest.fixture(scope="module")
def cli(api_url) -> Cli:
    return Cli(api_url)
