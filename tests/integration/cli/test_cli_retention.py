"""`hookledger expunge`, `hookledger retention` and `hookledger accounts update|create|show` with the
payload retention, against a real API process: output, --json, exit codes, and what the database holds."""

from __future__ import annotations

import asyncio
import json
import uuid

import asyncpg

from billing.settle import DeadReason, settle
from cli_test_helpers import OPERATOR_KEY


def _json(result) -> dict:
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


async def _fetchrow(database_url: str, query: str, *arguments):
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetchrow(query, *arguments)
    finally:
        await connection.close()


async def _die(database_url: str, delivery_id: uuid.UUID) -> None:
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        owner = await pool.fetchval("SELECT account_id FROM deliveries WHERE id = $1", delivery_id)
        await settle(pool, delivery_id, DeadReason.OUT_OF_RETRIES, account_id=owner, attempt=0)
    finally:
        await pool.close()


def test_expunge_refuses_a_live_message_then_erases_it_once_finished(cli, module_database_url):
    """Pending: exit 1 naming when to ask again, payload kept. Dead (no worker here: settled as if every
    attempt failed): exit 0, payload NULL, the same answer twice; unknown and malformed ids: 1 and 2."""
    _, key = cli.account()
    _, other_key = cli.account()
    assert cli("endpoints", "create", "https://example.com/hooks", key=key).exit_code == 0
    sent = _json(cli("send", "invoice.paid", '{"card": "4242"}', "--json", key=key))
    message_id, delivery_id = sent["id"], uuid.UUID(sent["deliveries"][0]["id"])
    live = cli("expunge", message_id, key=key)
    assert live.exit_code == 1 and "still pending or sending" in live.stderr and "409" in live.stderr
    live_json = cli("expunge", message_id, "--json", key=key)
    assert live_json.exit_code == 1 and json.loads(live_json.stderr)["type"].endswith("/message-live")
    query = "SELECT payload, payload_erased_by FROM messages WHERE id = $1"
    assert asyncio.run(_fetchrow(module_database_url, query, uuid.UUID(message_id)))["payload"] is not None
    assert cli("expunge", message_id, key=other_key).exit_code == 1  # another account's message: 404
    asyncio.run(_die(module_database_url, delivery_id))
    erased = cli("expunge", message_id, key=key)
    assert erased.exit_code == 0, erased.output
    assert f"message {message_id} (invoice.paid): payload erased on" in erased.stdout
    first = _json(cli("expunge", message_id, "--json", key=key))
    again = _json(cli("expunge", message_id, "--json", key=key))
    assert first == again and first["payload_erased_by"].startswith("api_key:")
    row = asyncio.run(_fetchrow(module_database_url, query, uuid.UUID(message_id)))
    assert row["payload"] is None and row["payload_erased_by"] == first["payload_erased_by"]
    missing = cli("expunge", str(uuid.uuid4()), key=key)
    assert missing.exit_code == 1 and "404" in missing.stderr
    malformed = cli("expunge", "not-an-id", key=key)
    assert malformed.exit_code == 2 and "message must be an id" in malformed.stderr


def test_an_account_shows_and_sets_its_retention(cli, module_database_url):
    account_id, key = cli.account()
    shown = cli("retention", key=key)
    assert shown.exit_code == 0 and "kept 30 days" in shown.stdout
    assert _json(cli("retention", "--set", "7", "--json", key=key))["payload_retention_days"] == 7
    assert "kept 7 days" in cli("retention", key=key).stdout
    query = "SELECT payload_retention_days FROM accounts WHERE id = $1"
    assert asyncio.run(_fetchrow(module_database_url, query, uuid.UUID(account_id)))[0] == 7
    for days in ("0", "3651", "seven"):
        refused = cli("retention", "--set", days, key=key)
        assert refused.exit_code == 2 and "--set" in refused.stderr, refused.output
    assert asyncio.run(_fetchrow(module_database_url, query, uuid.UUID(account_id)))[0] == 7


def test_the_operator_creates_updates_and_shows_an_accounts_retention(cli, module_database_url):
    created = _json(cli("accounts", "create", "kept", "--payload-retention-days", "90", "--json", key=OPERATOR_KEY))
    account_id = created["account"]["id"]
    assert created["account"]["payload_retention_days"] == 90
    updated = cli("accounts", "update", account_id, "--payload-retention-days", "3650", key=OPERATOR_KEY)
    assert updated.exit_code == 0 and "3650" in updated.stdout and "retention days" in updated.stdout
    assert _json(cli("accounts", "show", account_id, "--json", key=OPERATOR_KEY))["payload_retention_days"] == 3650
    query = "SELECT payload_retention_days FROM accounts WHERE id = $1"
    assert asyncio.run(_fetchrow(module_database_url, query, uuid.UUID(account_id)))[0] == 3650
    out_of_range = cli("accounts", "update", account_id, "--payload-retention-days", "0", key=OPERATOR_KEY)
    assert out_of_range.exit_code == 2 and "--payload-retention-days" in out_of_range.stderr
    missing_option = cli("accounts", "update", account_id, key=OPERATOR_KEY)
    assert missing_option.exit_code == 2
    unknown = cli("accounts", "update", str(uuid.uuid4()), "--payload-retention-days", "5", key=OPERATOR_KEY)
    assert unknown.exit_code == 1 and "404" in unknown.stderr
    _, account_key = cli.account()
    not_operator = cli("accounts", "update", account_id, "--payload-retention-days", "5", key=account_key)
    assert not_operator.exit_code == 1 and "403" in not_operator.stderr
    assert asyncio.run(_fetchrow(module_database_url, query, uuid.UUID(account_id)))[0] == 3650
