"""The operator's commands through the API with the operator key (`deliveries dead|show`, `accounts
delete`): --json puts JSON alone on stdout and errors on stderr; ids come out whole in tables at any
width; bad input exits 2 and asks nothing; deleting an account asks first."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from cli_test_helpers import OPERATOR_KEY

from delivery.cli.main import app

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def operator(cli):
    def run(*args: str, columns: int = 250, input: str | None = None):
        env = {**cli.env, "HOOKLEDGER_API_KEY": None, "HOOKLEDGER_OPERATOR_KEY": OPERATOR_KEY, "COLUMNS": str(columns)}
        return cli.runner.invoke(app, list(args), env=env, input=input)
    return run


@pytest.fixture
def dead(cli):
    """An account with two dead deliveries (their endpoint deleted while they waited: no worker runs
    here), as (account id, endpoint id, the dead delivery ids)."""
    account_id, key = cli.account()
    created = cli("endpoints", "create", "https://example.com/a-rather-long-path/for/webhooks", "--json", key=key)
    endpoint_id = json.loads(created.stdout)["id"]
    ids = []
    for n in range(2):
        sent = cli("send", "invoice.paid", f'{{"n": {n}}}', "--json", key=key)
        ids += [d["id"] for d in json.loads(sent.stdout)["deliveries"]]
    deleted = cli("endpoints", "delete", endpoint_id, "--json", key=key)
    assert json.loads(deleted.stdout)["refunded_now"] == 2
    return account_id, endpoint_id, ids


def test_dead_and_show_go_through_the_api_with_the_operator_key(operator, dead):
    """Filtered by account and reason, as JSON; then one of them shown with its charge and refund."""
    account_id, endpoint_id, ids = dead
    listed = operator("deliveries", "dead", "--account", account_id, "--reason", "endpoint_deleted", "--json")
    assert listed.exit_code == 0, listed.output
    page = json.loads(listed.stdout)
    assert sorted(row["id"] for row in page["data"]) == sorted(ids) and page["next_cursor"] is None
    assert {row["endpoint_id"] for row in page["data"]} == {endpoint_id}
    other = operator("deliveries", "dead", "--account", str(uuid.uuid4()), "--json")
    assert json.loads(other.stdout) == {"data": [], "next_cursor": None}
    shown = operator("deliveries", "show", ids[0], "--json")
    assert shown.exit_code == 0, shown.output
    found = json.loads(shown.stdout)
    assert (found["state"], found["dead_reason"], found["account_id"]) == ("dead", "endpoint_deleted", account_id)
    assert sorted(entry["id"] for entry in found["ledger_entries"]) == [f"charge:{ids[0]}", f"refund:{ids[0]}"]
    human = operator("deliveries", "show", ids[0])
    assert human.exit_code == 0 and f"refund:{ids[0]}" in human.stdout and "endpoint_deleted" in human.stdout


def test_show_lists_the_custom_headers_each_attempt_was_sent_with(operator, dead, module_database_url):
    """An attempt recorded with custom headers: `deliveries show` prints them on its row, `Name: value`
    each in name order, and --json carries them as attempts[].sent_headers."""
    import asyncio

    import asyncpg

    account_id, _, ids = dead

    async def record() -> None:
        connection = await asyncpg.connect(module_database_url)
        try:
            await connection.execute(
                "INSERT INTO delivery_attempts (delivery_id, attempt, account_id, started_at, status_code, sent_headers)"
                " VALUES ($1, 1, $2, now(), 503, '{\"X-Tenant\": \"acme\", \"X-Route\": \"v2\"}')",
                uuid.UUID(ids[1]), uuid.UUID(account_id))
        finally:
            await connection.close()

    asyncio.run(record())
    found = json.loads(operator("deliveries", "show", ids[1], "--json").stdout)
    assert [attempt["sent_headers"] for attempt in found["attempts"]] == [{"X-Tenant": "acme", "X-Route": "v2"}]
    human = operator("deliveries", "show", ids[1])
    assert human.exit_code == 0 and "headers sent" in human.stdout
    assert "X-Route: v2; X-Tenant: acme" in human.stdout, human.stdout  # by name


@pytest.mark.parametrize("columns", [60, 200])
def test_ids_come_out_whole_at_any_width(operator, cli, dead, columns):
    """At 200 columns a table, at 60 a list: either way every id is on one line, whole, to copy into
    the next command (rich cut them to `01a24844-b9b3-7…` or folded them mid-id)."""
    account_id, endpoint_id, ids = dead
    listed = operator("deliveries", "dead", "--account", account_id, columns=columns)
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.splitlines()
    for delivery_id in ids:
        assert any(delivery_id in line for line in lines), listed.stdout
    assert any(account_id in line for line in lines)
    assert ("│" in listed.stdout) == (columns == 200), listed.stdout  # a table only where it fits
    if columns == 60:
        assert all(len(line) <= columns for line in lines if not any(i in line for i in (*ids, account_id))
                   and "https://" not in line), listed.stdout
    shown = operator("deliveries", "show", ids[0], columns=columns)
    assert any(f"refund:{ids[0]}" in line for line in shown.stdout.splitlines()), shown.stdout
    _, key = cli.account()
    endpoint = json.loads(cli("endpoints", "create", "https://example.com/h", "--json", key=key).stdout)["id"]
    env = {**cli.env, "HOOKLEDGER_API_KEY": key, "COLUMNS": str(columns)}
    sent = cli.runner.invoke(app, ["send", "order.created", "{}"], env=env)
    assert sent.exit_code == 0 and any(endpoint in line for line in sent.stdout.splitlines()), sent.stdout
    delivery_id = json.loads(cli("deliveries", "list", "--json", key=key).stdout)["data"][0]["id"]
    for args, wanted in ((["endpoints", "list"], endpoint), (["deliveries", "list"], delivery_id),
                         (["ledger"], f"charge:{delivery_id}")):
        result = cli.runner.invoke(app, args, env=env)
        assert result.exit_code == 0 and any(wanted in line for line in result.stdout.splitlines()), result.stdout


def test_an_operator_read_that_fails_leaves_stdout_empty_under_json(operator):
    """A missing delivery (1) and a malformed id or time (2): the reason on stderr, stdout empty,
    so `... --json | jq` never reads a sentence as JSON."""
    missing = operator("deliveries", "show", str(uuid.uuid4()), "--json")
    assert missing.exit_code == 1 and missing.stdout == "" and "no delivery" in missing.stderr
    for args in (("deliveries", "show", "nope", "--json"), ("deliveries", "dead", "--since", "yesterday", "--json")):
        malformed = operator(*args)
        assert malformed.exit_code == 2 and malformed.stdout == "" and "error" in malformed.stderr, args


def test_bad_listing_options_are_usage_errors(operator):
    """A limit out of range, a cursor no listing returned and an unknown dead reason exit 2 with
    the reason, rather than 1 ("refused") or 0 with an empty page for a typo."""
    for args, named in ((("--limit", "0"), "limit"), (("--limit", "101"), "limit"), (("--cursor", "bogus"), "cursor"),
                        (("--reason", "out_of_retry"), "reason")):
        result = operator("deliveries", "dead", *args, "--json")
        assert result.exit_code == 2 and result.stdout == "" and named in result.stderr, (args, result.output)


def test_deleting_an_account_without_a_terminal_needs_yes(operator, cli):
    """No terminal to ask on and no --yes: refused in one line, exit 2, the account untouched. With
    --yes --no-wait the deletion starts through the API and --json prints the job alone."""
    account_id, _ = cli.account()
    refused = operator("accounts", "delete", account_id)
    assert refused.exit_code == 2 and refused.stdout == "", refused.output
    assert "cannot be undone: pass --yes" in refused.stderr and len(refused.stderr.splitlines()) == 1
    assert json.loads(operator("accounts", "show", account_id, "--json").stdout)["status"] == "active"
    started = operator("accounts", "delete", account_id, "--yes", "--no-wait", "--json")
    assert started.exit_code == 0, started.output
    job = json.loads(started.stdout)
    assert job["account_id"] == account_id and job["status"] == "running"  # for a worker to run (none here)


def test_deleting_an_account_at_a_terminal_asks_and_no_changes_nothing(cli, api_url):
    """At a terminal the command names the account and asks; "n" deletes nothing (exit 1)."""
    account_id, _ = cli.account(balance=7)
    leader, follower = pty.openpty()
    env = {**os.environ, "HOOKLEDGER_API_URL": api_url, "HOOKLEDGER_OPERATOR_KEY": OPERATOR_KEY, "COLUMNS": "200"}
    env.pop("HOOKLEDGER_API_KEY", None)
    process = subprocess.Popen([sys.executable, "-m", "delivery", "accounts", "delete", account_id], cwd=ROOT, env=env,
                               stdin=follower, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.close(follower)
    try:
        os.write(leader, b"n\n")
        stdout, stderr = process.communicate(timeout=60)
    finally:
        os.close(leader)
    assert process.returncode == 1, (stdout, stderr)
    assert f"Delete account {account_id}" in stderr.decode() and "balance 7 credits" in stderr.decode()
    assert b"nothing deleted" in stdout
    assert json.loads(cli("accounts", "show", account_id, "--json", key=OPERATOR_KEY).stdout)["status"] == "active"


def test_a_secret_printed_to_a_pipe_is_one_line(cli):
    """Piped output is 80 columns wide to rich: a 64-byte secret (94 characters) must still come
    out whole, as `SECRET=$(hookledger endpoints secret ID)` reads it."""
    from signing import generate_secret

    _, key = cli.account()
    secret = generate_secret(64)
    assert len(secret) > 80
    created = cli("endpoints", "create", "https://example.com/hooks", "--secret", secret, "--json", key=key)
    assert created.exit_code == 0, created.output
    endpoint_id = json.loads(created.stdout)["id"]
    narrow = {**cli.env, "HOOKLEDGER_API_KEY": key, "COLUMNS": "80"}
    shown = cli.runner.invoke(app, ["endpoints", "secret", endpoint_id], env=narrow)
    assert shown.exit_code == 0 and shown.stdout == secret + "\n"
    rotated = cli.runner.invoke(app, ["endpoints", "rotate-secret", endpoint_id, "--secret", generate_secret(64)], env=narrow)
    assert rotated.exit_code == 0 and rotated.stdout.count("\n") == 1 and len(rotated.stdout) > 81


def test_endpoints_create_prints_the_new_secret_once(cli):
    """Human output ends with the signing secret, the one `endpoints secret` shows; --json carries it too."""
    _, key = cli.account()
    created = cli("endpoints", "create", "https://example.com/hooks", key=key)
    assert created.exit_code == 0, created.output
    (line,) = [line for line in created.stdout.splitlines() if line.startswith("signing secret: ")]
    secret = line.removeprefix("signing secret: ")
    endpoint_id = created.stdout.split("hookledger endpoints secret ")[1].split(")")[0]
    assert secret.startswith("whsec_") and cli("endpoints", "secret", endpoint_id, key=key).stdout.strip() == secret
    as_json = json.loads(cli("endpoints", "create", "https://example.com/other", "--json", key=key).stdout)
    assert as_json["secret"] == cli("endpoints", "secret", as_json["id"], key=key).stdout.strip()


def test_endpoints_disable_with_the_operator_key(cli, operator):
    """`endpoints disable ID` switches the endpoint off (disabled_reason operator); again: the same answer;
    an unknown id exits 1 with a 404; the account's own key is refused."""
    _, key = cli.account()
    endpoint_id = json.loads(cli("endpoints", "create", "https://example.com/hooks", "--json", key=key).stdout)["id"]
    refused = cli("endpoints", "disable", endpoint_id, "--json", key=key)
    assert refused.exit_code == 1
    disabled = operator("endpoints", "disable", endpoint_id, "--json")
    assert disabled.exit_code == 0, disabled.output
    body = json.loads(disabled.stdout)
    assert (body["id"], body["enabled"], body["disabled_reason"]) == (endpoint_id, False, "operator")
    again = operator("endpoints", "disable", endpoint_id, "--json")
    assert again.exit_code == 0 and json.loads(again.stdout) == body
    missing = operator("endpoints", "disable", str(uuid.uuid4()))
    assert missing.exit_code == 1 and "endpoint" in missing.output.lower(), missing.output
