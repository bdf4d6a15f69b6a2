"""The settings table that `hookledger settings` prints is the one the code reads: every variable
the code reads is in it, nothing else is, and each default it states is the one the code uses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from delivery.cli.main import app
from delivery.platform import config
from delivery.platform.settings_reference import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
TEST_ONLY = {"HOOKLEDGER_TEST_CRASH_AFTER_STEP"}  # a fault-injection hook of the deletion tests
NAME = re.compile(r'"((?:HOOKLEDGER_[A-Z0-9_]+)|DATABASE_URL|REDIS_URL)"')


def _read_by_the_code() -> set[str]:
    names: set[str] = set()
    for package in ("delivery", "billing", "signing"):
        for path in (ROOT / package).rglob("*.py"):
            if path.name != "settings_reference.py":
                names.update(NAME.findall(path.read_text()))
    return names - TEST_ONLY


def test_every_setting_the_code_reads_is_listed_and_nothing_else() -> None:
    listed = [setting.name for setting in SETTINGS]
    assert len(listed) == len(set(listed)), "a setting is listed twice"
    read = _read_by_the_code()
    assert read - set(listed) == set(), "read by the code but missing from settings_reference.SETTINGS"
    assert set(listed) - read == set(), "listed in settings_reference.SETTINGS but read nowhere"


@pytest.mark.parametrize("setting", [s for s in SETTINGS if re.fullmatch(r"[0-9,]+", s.default)], ids=lambda s: s.name)
def test_each_stated_default_is_the_default_the_code_uses(setting) -> None:
    """Setting a variable to the default the table states changes nothing that load() builds."""
    assert config.load({setting.name: setting.default}) == config.load({})


def test_a_stated_default_that_differs_from_the_code_is_caught() -> None:
    """The check above can fail: a value other than the default builds other settings."""
    assert config.load({"HOOKLEDGER_CLAIM_BATCH": "199"}) != config.load({})


def test_the_command_prints_values_and_hides_secrets() -> None:
    env = {"HOOKLEDGER_CLAIM_BATCH": "123", "HOOKLEDGER_OPERATOR_KEY": "op-secret-value",
           "DATABASE_URL": "postgresql://user:hunter2@db/x", "HOOKLEDGER_API_PORT": ""}
    result = CliRunner().invoke(app, ["settings", "--json"], env=env)
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row["value"] for row in json.loads(result.stdout)}
    assert rows["HOOKLEDGER_CLAIM_BATCH"] == "123"
    assert rows["HOOKLEDGER_OPERATOR_KEY"] == "set" and rows["DATABASE_URL"] == "set"
    assert rows["HOOKLEDGER_API_PORT"] == "(8000)"
    assert "hunter2" not in result.stdout and "op-secret-value" not in result.stdout
    table = CliRunner().invoke(app, ["settings"], env=env)
    assert table.exit_code == 0 and "HOOKLEDGER_SECRET_ROTATION_OVERLAP_SECONDS" in table.stdout
    assert "hunter2" not in table.stdout
