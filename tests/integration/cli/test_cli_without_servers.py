"""The operator's commands with no DATABASE_URL and no API to reach start no server of their own.

Without DATABASE_URL the settings name an embedded PostgreSQL in the data directory: `deliveries
show` started an empty one there and ended in a 100-line UndefinedTableError traceback. Each
command is run here as a real process, as a user runs it, with HOOKLEDGER_DATA_DIR an empty
directory: it exits with its code and one line on stderr, creates no data directory and starts
no postgres process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from delivery.platform.run import free_port

ROOT = Path(__file__).resolve().parents[3]
ID = "0193a7e8-0000-7000-8000-000000000001"


def _postgres_processes(data_dir: Path) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(data_dir) in command:
                found.append(command)
    return found


@pytest.fixture
def environment(tmp_path: Path) -> dict[str, str]:
    data_dir = tmp_path / "data"
    environment = {name: value for name, value in os.environ.items()
                   if name not in ("DATABASE_URL", "REDIS_URL", "HOOKLEDGER_API_KEY", "HOOKLEDGER_OPERATOR_KEY")}
    environment.update(HOOKLEDGER_DATA_DIR=str(data_dir), COLUMNS="80",
                       HOOKLEDGER_API_URL=f"http://127.0.0.1:{free_port()}")  # nothing listens there
    return environment


def _run(environment: dict[str, str], *arguments: str) -> subprocess.CompletedProcess:
    completed = subprocess.run([sys.executable, "-m", "delivery", *arguments], cwd=ROOT, env=environment,
                               capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    data_dir = Path(environment["HOOKLEDGER_DATA_DIR"])
    assert not data_dir.exists(), (arguments, sorted(str(p) for p in data_dir.rglob("*"))[:10])
    assert not _postgres_processes(data_dir)
    assert "Traceback" not in completed.stderr, completed.stderr
    assert len(completed.stderr.splitlines()) == 1, completed.stderr  # one line, whatever the width
    return completed


# What works on PostgreSQL directly refuses in one line naming DATABASE_URL, exit 2.
ON_POSTGRESQL = {
    "audit": ["audit"],
    "audit one account": ["audit", "--account", ID, "--json"],
    "repair": ["accounts", "repair", ID],
    "replay": ["deliveries", "replay", ID],
    "bulk replay": ["deliveries", "replay", "--endpoint", ID, "--since", "2026-01-01T00:00:00Z", "--yes"],
    "delete inline": ["accounts", "delete", ID, "--inline", "--yes"],
}


@pytest.mark.parametrize("arguments", ON_POSTGRESQL.values(), ids=ON_POSTGRESQL.keys())
def test_a_command_on_postgresql_without_database_url_refuses_in_one_line(environment, arguments):
    completed = _run(environment, *arguments)
    assert completed.returncode == 2 and completed.stdout == "", completed.stderr
    assert completed.stderr.startswith("error: ") and "set DATABASE_URL" in completed.stderr


# What goes through the API needs the operator key, then an API that answers.
THROUGH_THE_API = {
    "show": ["deliveries", "show", ID],
    "dead": ["deliveries", "dead", "--json"],
    "delete": ["accounts", "delete", ID, "--yes"],
    "accounts show": ["accounts", "show", ID],
}


@pytest.mark.parametrize("arguments", THROUGH_THE_API.values(), ids=THROUGH_THE_API.keys())
def test_an_operator_command_without_the_operator_key_says_which_setting(environment, arguments):
    completed = _run(environment, *arguments)
    assert completed.returncode == 2 and completed.stdout == "", completed.stderr
    assert "no API key: set HOOKLEDGER_OPERATOR_KEY" in completed.stderr


@pytest.mark.parametrize("arguments", THROUGH_THE_API.values(), ids=THROUGH_THE_API.keys())
def test_an_unreachable_api_is_named_with_a_hint(environment, arguments):
    """Exit 3 and one line: the URL tried, and what to run or set."""
    completed = _run({**environment, "HOOKLEDGER_OPERATOR_KEY": "hl_op_" + "k" * 32}, *arguments)
    assert completed.returncode == 3 and completed.stdout == "", completed.stderr
    text = completed.stderr
    if "--json" in arguments:  # problem JSON, its detail saying the same
        import json

        text = json.loads(text)["detail"]
    assert f"cannot reach the hookledger API at {environment['HOOKLEDGER_API_URL']}" in text
    assert "is `hookledger api`" in text and "HOOKLEDGER_API_URL" in text


def test_version(environment):
    completed = subprocess.run([sys.executable, "-m", "delivery", "--version"], cwd=ROOT, env=environment,
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0 and completed.stdout.startswith("hookledger 0.") and completed.stderr == ""
