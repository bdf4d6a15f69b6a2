"""`hookledger endpoints` sets an endpoint's rate limit, custom headers and signing key kind, on
create, update and rotate, against a real API process; bad values exit 1 with the API's 422
naming the field, or 2 for a malformed option, and change nothing."""

from __future__ import annotations

import json


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_rate_limit_headers_and_key_type_on_create_update_and_rotate(cli):
    _, key = cli.account()
    created = _json(cli("endpoints", "create", "https://example.com/hooks", "--rate-limit", "50",
                        "--header", "X-Tenant: acme", "-H", "Authorization: Bearer t0k3n",
                        "--signing-key-type", "ed25519", "--json", key=key))
    endpoint_id = created["id"]
    assert created["rate_limit_per_second"] == 50 and created["signing_key_type"] == "ed25519"
    assert created["headers"] == {"X-Tenant": "acme", "Authorization": "Bearer t0k3n"}
    assert created["secret"].startswith("whpk_")
    shown = cli("endpoints", "show", endpoint_id, key=key)
    assert shown.exit_code == 0 and "ed25519" in shown.stdout and "X-Tenant" in shown.stdout
    updated = _json(cli("endpoints", "update", endpoint_id, "--rate-limit", "7", "-H", "X-One: 1", "--json", key=key))
    assert updated["rate_limit_per_second"] == 7 and updated["headers"] == {"X-One": "1"}
    cleared = _json(cli("endpoints", "update", endpoint_id, "--no-rate-limit", "--clear-headers", "--json", key=key))
    assert cleared["rate_limit_per_second"] is None and cleared["headers"] is None
    rotated = _json(cli("endpoints", "rotate-secret", endpoint_id, "--signing-key-type", "hmac", "--json", key=key))
    assert rotated["secret"].startswith("whsec_")
    assert _json(cli("endpoints", "show", endpoint_id, "--json", key=key))["signing_key_type"] == "hmac"


def test_bad_values_are_refused_and_change_nothing(cli):
    _, key = cli.account()
    endpoint = _json(cli("endpoints", "create", "https://example.com/hooks", "--rate-limit", "20", "--json", key=key))
    for arguments in (("--rate-limit", "0"), ("--rate-limit", "10001")):
        refused = cli("endpoints", "update", endpoint["id"], *arguments, "--json", key=key)
        assert refused.exit_code == 1, refused.output
        problem = json.loads(refused.stderr)
        assert problem["status"] == 422 and [error["field"] for error in problem["errors"]] == ["rate_limit_per_second"]
    made = cli("endpoints", "create", "https://example.com/other", "--rate-limit", "0", "--json", key=key)
    assert made.exit_code == 1 and json.loads(made.stderr)["status"] == 422
    malformed = cli("endpoints", "update", endpoint["id"], "--header", "no colon here", key=key)
    assert malformed.exit_code == 2 and "Name: value" in malformed.stderr
    both = cli("endpoints", "update", endpoint["id"], "--rate-limit", "5", "--no-rate-limit", key=key)
    assert both.exit_code == 2
    listed = _json(cli("endpoints", "list", "--json", key=key))["data"]
    assert [(item["id"], item["rate_limit_per_second"], item["headers"]) for item in listed] == [(endpoint["id"], 20, None)]
