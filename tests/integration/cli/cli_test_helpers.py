"""Helpers for the CLI tests: the operator key the API process is given, free ports, and `Cli`,
which runs `hookledger ...` in this process. (Not in conftest.py: two conftest modules cannot both
be imported by that name.)"""

from __future__ import annotations

import json
import uuid

from typer.testing import CliRunner

from delivery.cli.main import app

OPERATOR_KEY = "op_cli_test_" + "c" * 32


class Cli:
    """Runs `hookledger ...` in this process with the environment a user would have."""

    def __init__(self, api_url: str) -> None:
        self.runner = CliRunner()
        self.env = {"HOOKLEDGER_API_URL": api_url, "HOOKLEDGER_API_KEY": None, "HOOKLEDGER_OPERATOR_KEY": None,
                    "COLUMNS": "250"}

    def __call__(self, *args: str, key: str | None = None, input: str | None = None):
        env = {**self.env, "HOOKLEDGER_API_KEY": key}
        return self.runner.invoke(app, list(args), env=env, input=input)

    def account(self, balance: int = 100, price: int = 2) -> tuple[str, str]:
        """A new account (id, API key), topped up, made through the CLI itself."""
        created = self("accounts", "create", f"acct-{uuid.uuid4().hex[:8]}", "--price", str(price), "--json",
                       key=OPERATOR_KEY)
        assert created.exit_code == 0, created.output
        body = json.loads(created.stdout)
        if balance:
            topped = self("accounts", "topup", body["account"]["id"], f"o-{uuid.uuid4().hex}", str(balance),
                          key=OPERATOR_KEY)
            assert topped.exit_code == 0, topped.output
        return body["account"]["id"], body["api_key"]["key"]
