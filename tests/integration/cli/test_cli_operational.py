"""`hookledger operational ...` against a real API process: every subcommand, human and --json output,
and refusals (a bad threshold is a usage error; another account's endpoint exits 1, not found)."""

from __future__ import annotations

import json

from cli_test_helpers import OPERATOR_KEY


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_operational_endpoints_events_and_threshold(cli):
    account_id, key = cli.account(balance=40, price=2)
    created = _json(cli("operational", "create", "https://ops.example.com/hook", "-e", "balance.low",
                        "--description", "pager", "--json", key=key))
    endpoint_id = created["endpoint"]["id"]
    assert created["secret"].startswith("whsec_") and created["endpoint"]["event_types"] == ["balance.low"]
    assert _json(cli("operational", "secret", endpoint_id, "--json", key=key)) == {"secret": created["secret"]}
    listed = cli("operational", "list", key=key)
    assert listed.exit_code == 0 and endpoint_id in listed.stdout and "pager" in listed.stdout
    updated = _json(cli("operational", "update", endpoint_id, "--all-events", "--disable", "--json", key=key))
    assert (updated["event_types"], updated["enabled"]) == (None, False)
    shown = cli("operational", "show", endpoint_id, key=key)
    assert shown.exit_code == 0 and "(all)" in shown.stdout
    assert _json(cli("operational", "threshold", "30", "--json", key=key))["low_balance_threshold"] == 30
    assert "30" in cli("operational", "threshold", key=key).stdout
    topped = cli("accounts", "topup", account_id, "order-cli", "5", key=OPERATOR_KEY)
    assert topped.exit_code == 0, topped.output
    page = _json(cli("operational", "events", "--type", "topup.applied", "--json", key=key))
    assert [event["data"]["order_id"] for event in page["data"]][-1] == "order-cli"
    human = cli("operational", "events", "--limit", "1", key=key)
    assert human.exit_code == 0 and "topup.applied" in human.stdout and "next page: --cursor" in human.stdout
    assert _json(cli("operational", "threshold", "off", "--json", key=key))["low_balance_threshold"] is None
    bad = cli("operational", "threshold", "-3", key=key)
    assert bad.exit_code == 2
    _, other_key = cli.account(balance=0)
    assert cli("operational", "show", endpoint_id, key=other_key).exit_code == 1
    assert cli("operational", "delete", endpoint_id, key=key).exit_code == 0
    assert cli("operational", "show", endpoint_id, key=key).exit_code == 1
