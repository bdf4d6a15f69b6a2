"""`hookledger` app and operator commands against a real API process: output, --json, exit codes."""

from __future__ import annotations

import json
import uuid

from cli_test_helpers import OPERATOR_KEY

from delivery.platform.run import free_port


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_operator_accounts_create_topup_show(cli):
    """An operator makes an account, tops it up once per order id, reads it; a missing one exits 1."""
    created = _json(cli("accounts", "create", "acme", "--price", "3", "--json", key=OPERATOR_KEY))
    account_id = created["account"]["id"]
    assert created["api_key"]["key"].startswith(created["api_key"]["prefix"])
    first = cli("accounts", "topup", account_id, "order-7", "50", key=OPERATOR_KEY)
    assert first.exit_code == 0 and "topped up 50 credits; balance 50" in first.stdout
    again = cli("accounts", "topup", account_id, "order-7", "50", key=OPERATOR_KEY)
    assert again.exit_code == 0 and "already applied" in again.stdout
    shown = cli("accounts", "show", account_id, key=OPERATOR_KEY)
    assert shown.exit_code == 0 and "acme" in shown.stdout and "50" in shown.stdout
    assert _json(cli("accounts", "show", account_id, "--json", key=OPERATOR_KEY))["balance"] == 50
    reversed_ = _json(cli("accounts", "reverse-topup", account_id, "order-7", "--json", key=OPERATOR_KEY))
    assert reversed_["applied"] and reversed_["balance"] == 0
    missing = cli("accounts", "show", str(uuid.uuid4()), key=OPERATOR_KEY)
    assert missing.exit_code == 1 and "404" in missing.stderr and "no account" in missing.stderr
    human = cli("accounts", "create", "beta", key=OPERATOR_KEY)
    assert human.exit_code == 0 and "API key (shown once): hl_" in human.stdout


def test_endpoints_lifecycle(cli):
    _, key = cli.account()
    created = _json(cli("endpoints", "create", "https://example.com/hooks", "-e", "invoice.paid",
                        "--description", "billing", "--json", key=key))
    endpoint_id = created["id"]
    assert created["event_types"] == ["invoice.paid"] and created["enabled"] is True
    listed = cli("endpoints", "list", key=key)
    assert listed.exit_code == 0 and "https://example.com/hooks" in listed.stdout and "invoice.paid" in listed.stdout
    assert [e["id"] for e in _json(cli("endpoints", "list", "--json", key=key))["data"]] == [endpoint_id]
    assert "billing" in cli("endpoints", "show", endpoint_id, key=key).stdout
    updated = _json(cli("endpoints", "update", endpoint_id, "--disable", "--all-events", "--json", key=key))
    assert updated["enabled"] is False and updated["event_types"] is None
    nothing = cli("endpoints", "update", endpoint_id, key=key)
    assert nothing.exit_code == 2 and "nothing to change" in nothing.stderr
    secret = cli("endpoints", "secret", endpoint_id, key=key)
    assert secret.exit_code == 0 and secret.stdout.strip().startswith("whsec_")
    rotated = _json(cli("endpoints", "rotate-secret", endpoint_id, "--json", key=key))["secret"]
    assert rotated != secret.stdout.strip() and cli("endpoints", "secret", endpoint_id, key=key).stdout.strip() == rotated
    deleted = cli("endpoints", "delete", endpoint_id, key=key)
    assert deleted.exit_code == 0 and f"deleted endpoint {endpoint_id}" in deleted.stdout
    gone = cli("endpoints", "show", endpoint_id, "--json", key=key)
    assert gone.exit_code == 1 and json.loads(gone.stderr)["status"] == 404


def test_send_balance_ledger_and_deliveries(cli):
    """Two endpoints at 2 credits: a send charges 4; the same key again charges nothing more."""
    _, key = cli.account(balance=100, price=2)
    for url in ("https://example.com/a", "https://example.com/b"):
        assert cli("endpoints", "create", url, key=key).exit_code == 0
    payload = '{"invoice": "in_1",  "amount": 12}'
    sent = _json(cli("send", "invoice.paid", payload, "--idempotency-key", "inv-1", "--json", key=key))
    assert sent["total_charged"] == 4 and len(sent["deliveries"]) == 2 and sent["replayed"] is False
    again = cli("send", "invoice.paid", payload, "--idempotency-key", "inv-1", key=key)
    assert again.exit_code == 0 and "nothing more charged" in again.stdout
    from_stdin = _json(cli("send", "order.created", "-", "--json", key=key, input='{"order": 1}'))
    assert from_stdin["total_charged"] == 4 and from_stdin["idempotency_key"]
    assert _json(cli("balance", "--json", key=key)) == {"balance": 92, "in_flight": 8}
    assert "balance 92 credits (8 in flight)" in cli("balance", key=key).stdout
    ledger = _json(cli("ledger", "--limit", "2", "--json", key=key))
    assert [e["kind"] for e in ledger["data"]] == ["topup", "charge"] and ledger["next_cursor"]
    rest = cli("ledger", "--cursor", ledger["next_cursor"], key=key)
    assert rest.exit_code == 0 and rest.stdout.count("charge:") == 3
    deliveries = _json(cli("deliveries", "list", "--message", sent["id"], "--json", key=key))
    assert {d["id"] for d in deliveries["data"]} == {d["id"] for d in sent["deliveries"]}
    table = cli("deliveries", "list", "--state", "pending", "--limit", "3", key=key)
    assert table.exit_code == 0 and "3 deliveries" in table.stdout and "next page: --cursor" in table.stdout


def test_refusals_and_usage_errors_have_their_exit_codes(cli):
    """1 when the API refuses (402, 401, 403, 422), 2 for a usage error, 3 when the API cannot be reached."""
    _, key = cli.account(balance=0)
    assert cli("endpoints", "create", "https://example.com/a", key=key).exit_code == 0
    broke = cli("send", "invoice.paid", "{}", "--json", key=key)
    assert broke.exit_code == 1 and json.loads(broke.stderr)["type"].endswith("/insufficient-balance")
    assert broke.stdout == ""
    invalid = cli("endpoints", "create", "ftp://example.com/x", key=key)
    assert invalid.exit_code == 1 and "url:" in invalid.stderr
    assert cli("balance", key="hl_live_not_a_key").exit_code == 1
    operator_only = cli("accounts", "show", str(uuid.uuid4()), key=key)
    assert operator_only.exit_code == 1 and "403" in operator_only.stderr
    not_json = cli("send", "invoice.paid", "{not json", key=key)
    assert not_json.exit_code == 2 and "not JSON" in not_json.stderr
    no_key = cli("balance")
    assert no_key.exit_code == 2 and "HOOKLEDGER_API_KEY" in no_key.stderr
    assert cli("deliveries", "list", "--limit", "0", key=key).exit_code == 2
    assert cli("balance", "--api-url", "ftp://nowhere", key=key).exit_code == 2
    unreachable = cli("balance", "--api-url", f"http://127.0.0.1:{free_port()}", key=key)
    assert unreachable.exit_code == 3 and "ConnectError" in unreachable.stderr
