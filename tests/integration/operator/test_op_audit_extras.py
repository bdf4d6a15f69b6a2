"""The audit's incremental mode (--since), its per-account summary, and the cron's Prometheus gauges."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime, timedelta, timezone

from typer.testing import CliRunner

from billing.audit import audit
from billing.settle import settle
from delivery import metrics
from delivery.platform import worker
from delivery.cli.main import app
from operator_helpers import add_endpoint, create_many, make_account, raw_delivery


async def test_since_checks_recent_rows_and_every_balance(pool):
    """A corruption written a day ago is found by a full run but not by --since an hour ago; one written now is
    found by both; a balance that disagrees with the ledger is found by --since whatever its age."""
    account_id = await make_account(pool, balance=1000)
    endpoint_id = await add_endpoint(pool, account_id)
    await create_many(pool, account_id, endpoint_id, 5)
    old = await raw_delivery(pool, account_id, endpoint_id, charge=-1, created_at_sql="now() - interval '1 day'")
    hour_ago = datetime.now(timezone.utc) - timedelta(hours=1)

    full, recent = await audit(pool), await audit(pool, since=hour_ago)
    assert old in {v.delivery_id for v in full.violations}
    assert recent.clean and recent.since == hour_ago

    new = await raw_delivery(pool, account_id, endpoint_id, charge=None)
    assert {v.delivery_id for v in (await audit(pool, since=hour_ago)).violations} == {new}
    # An old delivery refunded now is in the incremental scope through its new ledger entry.
    await pool.execute("UPDATE deliveries SET state = 'dead', dead_reason = 'out_of_retries' WHERE id = $1", old)
    await pool.execute("INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount) VALUES ($1, $2, $3,"
                       " 'refund', 5)", f"refund:{old}", account_id, old)
    await pool.execute("UPDATE accounts SET balance = balance + 5 WHERE id = $1", account_id)
    assert old in {v.delivery_id for v in (await audit(pool, since=hour_ago)).violations}

    other = await make_account(pool, balance=50)
    await pool.execute("UPDATE accounts SET balance = balance + 7 WHERE id = $1", other)  # bypasses the ledger
    balances = [v for v in (await audit(pool, since=datetime.now(timezone.utc))).violations if v.invariant == "I4"]
    assert [v.account_id for v in balances] == [other]


async def test_summary_per_account_in_report_and_json(pool, database_url, monkeypatch):
    """Each account's summary carries balance, ledger sum, live/delivered/dead counts and its violations,
    in the report, in `hookledger audit --json`, and `--since` is accepted by the CLI."""
    good = await make_account(pool, balance=100)
    endpoint_id = await add_endpoint(pool, good)
    deliveries = await create_many(pool, good, endpoint_id, 4)
    await settle(pool, deliveries[0], "out_of_retries", account_id=good)
    await pool.execute("UPDATE deliveries SET state = 'delivered' WHERE id = $1", deliveries[1])
    bad = await make_account(pool, balance=100)
    bad_endpoint = await add_endpoint(pool, bad)
    await raw_delivery(pool, bad, bad_endpoint, charge=-1)

    report = await audit(pool)
    summaries = {s.account_id: s for s in report.summaries}
    assert (summaries[good].balance, summaries[good].ledger_total) == (100 - 3 * 5, 100 - 3 * 5)
    assert (summaries[good].live, summaries[good].delivered, summaries[good].dead) == (2, 1, 1)
    assert summaries[good].violations == 1  # delivered without a 2xx attempt on record (I6)
    assert (summaries[bad].live, summaries[bad].violations) == (1, 2)  # I1 charge amount and I2 net
    assert report.accounts == 2 and report.deliveries == 5

    monkeypatch.setenv("DATABASE_URL", database_url)
    result = await asyncio.to_thread(CliRunner().invoke, app, ["audit", "--json"])
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert {row["account_id"]: row["violations"] for row in data["summary"]} == {str(good): 1, str(bad): 2}
    recent = await asyncio.to_thread(CliRunner().invoke, app, ["audit", "--since", "2999-01-01T00:00:00Z"])
    assert recent.exit_code == 0 and "audit clean" in recent.output, recent.output
    table = await asyncio.to_thread(CliRunner().invoke, app, ["audit"])
    assert "accounts" in table.output and str(bad)[:8] in table.output


async def test_cron_sets_the_gauges(pool):
    """audit_cron publishes the number of violations and the time of the run as gauges."""
    account_id = await make_account(pool, balance=100)
    endpoint_id = await add_endpoint(pool, account_id)
    await create_many(pool, account_id, endpoint_id, 2)
    before = datetime.now(timezone.utc).timestamp()
    assert await worker.audit_cron({"pool": pool}) == 0
    assert metrics.REGISTRY.get_sample_value("hookledger_audit_violations") == 0
    assert metrics.REGISTRY.get_sample_value("hookledger_audit_notices") == 0
    assert metrics.REGISTRY.get_sample_value("hookledger_audit_last_run_timestamp_seconds") >= before - 1
    await raw_delivery(pool, account_id, endpoint_id, charge=None)
    assert await worker.audit_cron({"pool": pool}) == 2
    assert metrics.REGISTRY.get_sample_value("hookledger_audit_violations") == 2


async def test_broken_guards_are_notices_and_the_audit_still_exits_clean(pool, database_url, monkeypatch, caplog):
    """The probe setting and the key revocation trigger keep no money right: with both broken `hookledger audit` says
    the audit is clean, lists each as a notice (naming no account or delivery) and exits 0, `--json` has them under
    notices, and the cron's violations gauge stays 0 while its notices gauge counts 2, each logged as a warning."""
    account_id = await make_account(pool, balance=100)
    endpoint_id = await add_endpoint(pool, account_id)
    await create_many(pool, account_id, endpoint_id, 2)
    await pool.execute("ALTER FUNCTION ledger_entries_check_references() RESET enable_seqscan")
    await pool.execute("DROP TRIGGER api_keys_revoked ON api_keys")

    monkeypatch.setenv("DATABASE_URL", database_url)
    result = await asyncio.to_thread(CliRunner().invoke, app, ["audit", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["clean"] is True and data["violations"] == []
    notices = [(n["invariant"], n["account_id"], n["delivery_id"], n["detail"].split(":")[0]) for n in data["notices"]]
    assert notices == [
        ("notice", None, None, "trigger api_keys_revoked on api_keys does not exist"),
        ("notice", None, None, "function ledger_entries_check_references() runs with no settings, the migrations"
                               " give it enable_seqscan=off"),
    ]
    table = await asyncio.to_thread(CliRunner(env={"COLUMNS": "400"}).invoke, app, ["audit"])
    assert table.exit_code == 0 and "audit clean" in table.output and "2 notices (no invariant broken)" in table.output
    assert "api_keys_revoked" in table.output and "ledger_entries_check_references()" in table.output
    assert "None" not in table.output  # a schema notice's account and delivery show as "-"
    with caplog.at_level(logging.WARNING, logger="delivery.platform.worker"):
        assert await worker.audit_cron({"pool": pool}) == 0
    assert metrics.REGISTRY.get_sample_value("hookledger_audit_violations") == 0
    assert metrics.REGISTRY.get_sample_value("hookledger_audit_notices") == 2
    logged = sorted(record.getMessage() for record in caplog.records if record.name == "delivery.platform.worker")
    assert len(logged) == 2 and all(line.startswith("audit notice: ") for line in logged), logged
    assert "api_keys_revoked" in logged[0] + logged[1] and "ledger_entries_check_references()" in logged[0] + logged[1]
