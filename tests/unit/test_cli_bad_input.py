"""Bad input on the command line is a usage error: the reason on stderr, nothing on stdout (so
`... --json | jq` never reads a sentence), exit 2, and nothing asked of the API or PostgreSQL.

The API and the database named in the environment are closed ports here: a command that asked
either before refusing its input would exit 3 (unreachable), not 2.
"""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from delivery.cli.main import app

ID = "0193a7e8-0000-7000-8000-000000000001"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    port = _closed_port()
    return {"HOOKLEDGER_API_URL": f"http://127.0.0.1:{port}", "HOOKLEDGER_API_KEY": "hl_test_key",
            "DATABASE_URL": f"postgresql://postgres@127.0.0.1:{port}/nothing", "COLUMNS": "250"}


BAD = {
    # the operator's commands, on PostgreSQL or through the API
    "audit account": (["audit", "--account", "nope"], "account must be an id"),
    "audit since": (["audit", "--since", "yesterday"], "--since must be an ISO 8601 time"),
    "delete account": (["accounts", "delete", "nope"], "account must be an id"),
    "delete timeout": (["accounts", "delete", ID, "--timeout", "nan"], "--timeout"),
    "repair account": (["accounts", "repair", "nope"], "account must be an id"),
    "dead endpoint": (["deliveries", "dead", "--endpoint", "nope"], "endpoint must be an id"),
    "dead until": (["deliveries", "dead", "--until", "soon"], "--until must be an ISO 8601 time"),
    "show delivery": (["deliveries", "show", "nope"], "delivery must be an id"),
    "replay delivery": (["deliveries", "replay", "nope"], "delivery must be an id"),
    "replay endpoint": (["deliveries", "replay", "--endpoint", "nope", "--since", "2026-01-01"], "endpoint must be an id"),
    "replay confirm total": (["deliveries", "replay", "--endpoint", ID, "--since", "2026-01-01", "--confirm-total", "-1"],
                             "confirm-total"),
    "run port": (["run", "--port", "70000"], "port"),
    # through the API
    "endpoints show": (["endpoints", "show", "nope"], "endpoint must be an id"),
    "endpoints update": (["endpoints", "update", "nope", "--description", "x"], "endpoint must be an id"),
    "endpoints delete": (["endpoints", "delete", "nope"], "endpoint must be an id"),
    "endpoints rotate": (["endpoints", "rotate-secret", "nope"], "endpoint must be an id"),
    "endpoints secret": (["endpoints", "secret", "nope"], "endpoint must be an id"),
    "ledger delivery": (["ledger", "--delivery", "nope"], "delivery must be an id"),
    "list endpoint": (["deliveries", "list", "--endpoint", "nope"], "endpoint must be an id"),
    "list message": (["deliveries", "list", "--message", "nope"], "message must be an id"),
    "list created after": (["deliveries", "list", "--created-after", "monday"], "--created-after must be an ISO 8601"),
    "topup account": (["accounts", "topup", "nope", "order-1", "10"], "account must be an id"),
    "reverse account": (["accounts", "reverse-topup", "nope", "order-1"], "account must be an id"),
    "accounts show": (["accounts", "show", "nope"], "account must be an id"),
    "listen endpoint": (["listen", "--secret-from-endpoint", "nope"], "--secret-from-endpoint must be an id"),
}


# `hookledger run` serves and prints no JSON; every other command takes --json.
WITHOUT_JSON = {"run port"}


@pytest.mark.parametrize("args, said", BAD.values(), ids=BAD.keys())
def test_bad_input_is_a_usage_error_on_stderr_that_asks_nothing(env, args, said):
    result = CliRunner().invoke(app, args, env=env)
    assert (result.exit_code, result.stdout) == (2, ""), (result.exit_code, result.output)
    assert said in " ".join(result.stderr.split()), result.stderr


@pytest.mark.parametrize("args, said", [BAD[name] for name in BAD if name not in WITHOUT_JSON],
                         ids=[name for name in BAD if name not in WITHOUT_JSON])
def test_under_json_too(env, args, said):
    args = [*args, "--json"]
    result = CliRunner().invoke(app, args, env=env)
    assert (result.exit_code, result.stdout) == (2, ""), (result.exit_code, result.output)
    assert said in " ".join(result.stderr.split()), result.stderr
