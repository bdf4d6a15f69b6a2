"""`hookledger applications ...` against a real API process: the life of an application, a send to
it, its usage, and refusals with their exit codes."""

from __future__ import annotations

import json


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_applications_lifecycle_send_and_usage(cli):
    """Create (with metadata), list, show by uid, add an endpoint, send, read usage, update, delete."""
    account_id, key = cli.account(balance=100, price=2)
    created = _json(cli("applications", "create", "Globex", "--uid", "customer-9", "-m", "plan=pro", "--json", key=key))
    assert (created["uid"], created["metadata"], created["is_default"]) == ("customer-9", {"plan": "pro"}, False)
    listed = cli("applications", "list", key=key)
    assert listed.exit_code == 0 and "customer-9" in listed.stdout and "2 applications" in listed.stdout
    assert [a["id"] for a in _json(cli("applications", "list", "--json", key=key))["data"]] == [account_id, created["id"]]
    assert "Globex" in cli("applications", "show", "customer-9", key=key).stdout
    endpoint = _json(cli("applications", "add-endpoint", "customer-9", "https://example.com/globex", "--json", key=key))
    assert endpoint["application_id"] == created["id"]
    assert [e["id"] for e in _json(cli("applications", "endpoints", "customer-9", "--json", key=key))["data"]] == [
        endpoint["id"]]
    sent = cli("applications", "send", "customer-9", "invoice.paid", '{"n": 1}', key=key)
    assert sent.exit_code == 0 and "1 deliveries, 2 credits charged" in sent.stdout
    usage = cli("applications", "usage", "customer-9", key=key)
    assert usage.exit_code == 0 and "1 charges (2 credits)" in usage.stdout and "net 2 credits" in usage.stdout
    assert _json(cli("applications", "usage", created["id"], "--since", "2000-01-01", "--json", key=key))["net"] == 2
    renamed = _json(cli("applications", "update", "customer-9", "--name", "Globex Corp", "--json", key=key))
    assert (renamed["name"], renamed["uid"], renamed["metadata"]) == ("Globex Corp", "customer-9", {"plan": "pro"})
    link = cli("applications", "portal-link", "customer-9", key=key)
    assert link.exit_code == 0 and "/portal/sign-in?token=" in link.stdout and "signs in once" in link.stdout
    deleted = cli("applications", "delete", "customer-9", key=key)
    assert deleted.exit_code == 0 and "and 1 endpoints" in deleted.stdout


def test_refusals_have_their_exit_codes(cli):
    """A missing application exits 1 (404), a bad uid exits 1 (422), malformed input is a usage error (2)."""
    _, key = cli.account()
    missing = cli("applications", "show", "nobody", key=key)
    assert missing.exit_code == 1 and "404" in missing.stderr
    bad = cli("applications", "create", "x", "--uid", "has space", key=key)
    assert bad.exit_code == 1 and "uid" in bad.stderr
    assert cli("applications", "create", "x", "-m", "novalue", key=key).exit_code == 2
    assert cli("applications", "send", "nobody", "a.b", "not json", key=key).exit_code == 2
    default = cli("applications", "delete", cli("applications", "list", "--json", key=key).stdout and
                  json.loads(cli("applications", "list", "--json", key=key).stdout)["data"][0]["id"], key=key)
    assert default.exit_code == 1 and "409" in default.stderr


def test_event_types_and_channels(cli):
    """The catalog through the CLI: create with a schema, list, show, a send refused by the schema
    (exit 1 naming the path), archive; a send to an application with channels."""
    _, key = cli.account(balance=100, price=1)
    created = _json(cli("event-types", "create", "invoice.paid", "--description", "Paid",
                        "--schema", '{"type": "object", "required": ["amount"]}', "--json", key=key))
    assert created["schema"] == {"type": "object", "required": ["amount"]}
    assert "invoice.paid" in cli("event-types", "list", key=key).stdout
    refused = cli("send", "invoice.paid", "{}", key=key)
    assert refused.exit_code == 1 and "payload" in refused.stderr
    assert cli("event-types", "create", "bad", "--schema", "{not json", key=key).exit_code == 2
    bad = cli("event-types", "create", "bad", "--schema", '{"type": "nonsense"}', key=key)
    assert bad.exit_code == 1 and "schema.type" in bad.stderr
    archived = _json(cli("event-types", "update", "invoice.paid", "--archive", "--no-schema", "--json", key=key))
    assert archived["archived"] is True and archived["schema"] is None
    assert _json(cli("event-types", "list", "--json", key=key))["data"] == []
    _json(cli("applications", "create", "A", "--uid", "a", "--json", key=key))
    _json(cli("applications", "add-endpoint", "a", "https://example.com/a", "--json", key=key))
    sent = _json(cli("applications", "send", "a", "user.created", "{}", "-c", "eu", "--json", key=key))
    assert len(sent["deliveries"]) == 1
