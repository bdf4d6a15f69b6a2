"""The operator's read commands (`deliveries dead|show`, straight on the database): with --json,
stdout is JSON or nothing, errors go to stderr; bad input exits 2 and answers nothing."""

from __future__ import annotations

import json
import uuid

import pytest

from delivery.cli.main import app


@pytest.fixture
def operator(cli, module_database_url):
    def run(*args: str):
        return cli.runner.invoke(app, list(args), env={**cli.env, "DATABASE_URL": module_database_url})
    return run


def test_an_operator_read_that_fails_leaves_stdout_empty_under_json(operator):
    """A missing delivery (1) and a malformed id or time (2): the reason on stderr, stdout empty,
    so `... --json | jq` never reads a sentence as JSON."""
    missing = operator("deliveries", "show", str(uuid.uuid4()), "--json")
    assert missing.exit_code == 1 and missing.stdout == "" and "no delivery" in missing.stderr
    for args in (("deliveries", "show", "nope", "--json"), ("deliveries", "dead", "--since", "yesterday", "--json")):
        malformed = operator(*args)
        assert malformed.exit_code == 2 and malformed.stdout == "" and "error" in malformed.stderr, args
    listed = operator("deliveries", "dead", "--json")
    assert listed.exit_code == 0 and json.loads(listed.stdout) == {"data": [], "next_cursor": None}


def test_bad_listing_options_are_usage_errors(operator):
    """A limit out of range, a cursor no listing returned and an unknown dead reason exit 2 with
    the reason, rather than 1 ("refused") or 0 with an empty page for a typo."""
    for args, named in ((("--limit", "0"), "limit"), (("--limit", "501"), "limit"), (("--cursor", "bogus"), "cursor"),
                        (("--reason", "out_of_retry"), "reason")):
        result = operator("deliveries", "dead", *args, "--json")
        assert result.exit_code == 2 and result.stdout == "" and named in result.stderr, (args, result.output)


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
