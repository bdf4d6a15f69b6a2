"""Every `hookledger ...` builds the whole command tree before it runs one command (for --help and
to find the command), so what delivery.cli.main imports at the top is paid by every command, even
`--help` and a usage error. Each command imports the heavy parts it needs when it runs: the API
server, the SDK (httpx), the settings (which pull in the engine, arq and aiohttp), the database
drivers and alembic cost about 1 s together here, against 0.2 s for what the tree needs.

Run in a fresh interpreter: this process has imported most of the project already.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Top-level packages, and modules of ours, that no command needs just to be found.
HEAVY = ("aiohttp", "alembic", "arq", "asyncpg", "httpx", "redis", "sqlalchemy", "structlog", "prometheus_client",
         "cryptography", "delivery.platform.config", "delivery.api", "delivery.client", "delivery.platform.database",
         "delivery.engine", "billing.database", "signing")


def _imported_by(code: str) -> set[str]:
    output = subprocess.run([sys.executable, "-c", code + "\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
                            check=True, capture_output=True, text=True).stdout
    return set(json.loads(output.splitlines()[-1]))


def _heavy(modules: set[str]) -> list[str]:
    return sorted(name for name in HEAVY if any(m == name or m.startswith(name + ".") for m in modules))


def test_building_the_command_tree_imports_nothing_heavy():
    assert _heavy(_imported_by("import delivery.cli")) == []


@pytest.mark.parametrize("args", [["--help"], ["deliveries", "--help"], ["audit", "--account", "nope"],
                                  ["endpoints", "show", "nope", "--api-key", "k"]], ids=" ".join)
def test_help_and_usage_errors_import_nothing_heavy(args):
    """--help, and a malformed id refused before anything is asked: neither loads the settings,
    the database layer or the SDK."""
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom delivery.cli.main import app\n"
            f"result = CliRunner().invoke(app, {args!r})\nassert result.exit_code in (0, 2), result.output")
    assert _heavy(_imported_by(code)) == []
