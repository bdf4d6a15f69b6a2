"""`hookledger deliveries show` prints the webhook-id a delivery is sent under: its own id, or for a
replay the replayed delivery's (and which delivery it replays), in the table and in --json."""

from __future__ import annotations

import asyncio
import json
import re
import uuid

import asyncpg

from billing.settle import DeadReason, settle
from cli_test_helpers import OPERATOR_KEY
from delivery.cli.main import app


async def _die(database_url: str, delivery_id: uuid.UUID) -> None:
    connection_pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        owner = await connection_pool.fetchval("SELECT account_id FROM deliveries WHERE id = $1", delivery_id)
        await settle(connection_pool, delivery_id, DeadReason.OUT_OF_RETRIES, account_id=owner, attempt=0)
    finally:
        await connection_pool.close()


def test_deliveries_show_prints_the_webhook_id(cli, module_database_url):
    _, key = cli.account()
    assert cli("endpoints", "create", "https://example.com/hooks", key=key).exit_code == 0
    sent = cli("send", "invoice.paid", '{"n": 1}', "--json", key=key)
    assert sent.exit_code == 0, sent.output
    dead = uuid.UUID(json.loads(sent.stdout)["deliveries"][0]["id"])
    asyncio.run(_die(module_database_url, dead))  # as if every attempt had failed (no worker runs here)
    env = {**cli.env, "DATABASE_URL": module_database_url, "HOOKLEDGER_OPERATOR_KEY": OPERATOR_KEY}
    replayed = cli.runner.invoke(app, ["deliveries", "replay", str(dead)], env=env)
    assert replayed.exit_code == 0, replayed.output
    replay = re.search(rf"replayed {dead} as ([0-9a-f-]{{36}})", replayed.stdout).group(1)

    shown = cli.runner.invoke(app, ["deliveries", "show", replay], env=env)
    assert shown.exit_code == 0, shown.output
    lines = [" ".join(line.split()) for line in shown.stdout.splitlines()]
    assert f"webhook-id {dead}" in lines and f"replays {dead}" in lines, shown.stdout
    as_json = json.loads(cli.runner.invoke(app, ["deliveries", "show", replay, "--json"], env=env).stdout)
    assert (as_json["webhook_id"], as_json["replay_of"]) == (str(dead), str(dead))
    original = cli.runner.invoke(app, ["deliveries", "show", str(dead)], env=env)
    lines = [" ".join(line.split()) for line in original.stdout.splitlines()]
    assert f"webhook-id {dead}" in lines and not any(line.startswith("replays") for line in lines), original.stdout
