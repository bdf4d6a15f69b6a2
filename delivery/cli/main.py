"""The `hookledger` command line.

Each command imports what it needs when it runs, not here: every `hookledger ...` builds the
whole command tree (for --help, and to find the command), and the API server's modules,
alembic and the settings (delivery.platform.config pulls in the engine, arq and aiohttp) took about 1.4 s
to import before `send` or `--help` did anything. tests/unit/test_cli_imports.py keeps it so.
"""

from __future__ import annotations

import sys

import typer

from delivery.cli import application_commands as cli_applications
from delivery.cli import catalog_commands as cli_catalog
from delivery.cli import client_commands as cli_client, common, operator_commands as cli_operator, output
from delivery.cli import retention_commands as cli_retention
from delivery.cli.operational_commands import operational_app
from delivery.errors import ServerUnreachableError

app = typer.Typer(no_args_is_help=True, add_completion=False, help="hookledger: webhooks billed per delivery.")
EXIT_CONFIG = 2  # a malformed setting or a port already taken: as for a bad argument
EXIT_UNAVAILABLE = 3  # PostgreSQL or Redis did not answer at start (as the client commands use 3)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"hookledger {version('hookledger')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            print("hookledger (not installed)")
        raise typer.Exit(0)


@app.callback()
def _options(
    show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit."),
) -> None:
    """hookledger: webhooks billed per delivery."""


@app.command()
def migrate(as_json: common.AsJson = False) -> None:
    """Apply the database migrations (alembic upgrade head); without DATABASE_URL, to the embedded server."""
    from delivery.platform import config, migrate as migrations, services

    settings = config.load()
    migrations.upgrade(services.database_url(settings.database))
    if as_json:
        output.print_json({"migrated": "head"})
    else:
        output.out().print("migrated to head")


@app.command()
def audit(
    account: str = typer.Option(None, metavar="ACCOUNT_ID", help="Audit one account; default: every account."),
    as_json: common.AsJson = False,
    since: str = typer.Option(None, "--since", metavar="TIME", help="Incremental: check only the deliveries created or finished,"
                              " and those with a ledger entry, since this ISO 8601 time (balances and triggers are"
                              " always all checked)."),
) -> None:
    """Check invariants I1-I8 against the ledger (PostgreSQL: DATABASE_URL), and list notices (among them the
    probe setting and the key revocation trigger, against the migrations). Exit 1 on any violation."""
    # Bad input is refused before the audit's modules (the database layer, alembic) are loaded.
    account_id = common.parse_id(account, "account") if account else None
    since_time = common.parse_time(since, "--since") if since else None
    common.require_database("audit")

    import asyncio

    from delivery.operations import audit_report
    from delivery.platform import config
    from delivery.platform.database import open_pool
    from billing.audit import audit as run_audit

    async def main():
        pool = await open_pool(config.load())
        try:
            return await run_audit(pool, account_id, since=since_time)
        finally:
            await pool.close()

    report = asyncio.run(main())
    if as_json:
        print(audit_report.to_json(report))
    else:
        audit_report.render(report, output.out())
    raise typer.Exit(0 if report.clean else 1)


@app.command()
def worker() -> None:
    """Run a delivery worker (arq) until SIGTERM: claims, sends, records, retries, sweeps."""
    import logging

    from delivery.platform import config, services, worker as worker_module

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = config.load()
    worker_module.run(settings, services.redis_url(settings.redis))


@app.command()
def run(
    demo_only: bool = typer.Option(False, "--demo-only", help="Exit after the demo instead of serving."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, metavar="PORT", help="Port for the API (0: any free port)."),
) -> None:
    """The whole platform on this machine (embedded PostgreSQL and Redis unless configured), with a demo."""
    import signal as signals

    from delivery.platform import config, demo as platform_demo, run as platform

    # SIGTERM (a supervisor, `timeout`, `docker stop`) and SIGHUP (the terminal closed) stop the
    # platform as Ctrl-C does. Their default would end this process at once, leaving the API,
    # the worker, the receiver and the embedded PostgreSQL and Redis running with no owner.
    for signal_number in (signals.SIGTERM, signals.SIGHUP):
        signals.signal(signal_number, _interrupt)
    console = output.out()
    settings = config.load()
    console.print("starting PostgreSQL, Redis, the API and a worker ...")
    try:
        running = platform.start(settings, api_port=port or None)
    except KeyboardInterrupt:
        console.print("interrupted while starting; stopped what had started")
        raise typer.Exit(1) from None
    code = 0
    try:
        _print_addresses(console, running)
        demo = platform_demo.run(running, console)
        console.print("[green]demo finished: every delivery ended and the audit is clean[/green]" if demo.clean
                      else "[red]demo failed: see above[/red]")
        console.print(f"demo account  {demo.account_id}  key {demo.api_key}", markup=False, soft_wrap=True)
        console.print(f"dashboard     {running.dashboard_url}  (sign in with the demo account's key, or the operator"
                      " key for dead letters, deletions and the audit)", markup=False, soft_wrap=True)
        if demo_only:
            code = 0 if demo.clean else 1
        else:
            console.print("serving until Ctrl-C ...")
            _serve(console, running)
    except KeyboardInterrupt:
        console.print(f"stopping {running.servers()} ...", soft_wrap=True)
    finally:
        running.stop()
        console.print(f"stopped {running.servers()}", soft_wrap=True)
    raise typer.Exit(code)


def _print_addresses(console, running) -> None:
    """Where everything is, one whole line each (a key split in two cannot be pasted)."""
    metrics_port = running.environment["HOOKLEDGER_WORKER_METRICS_PORT"]
    for line in (f"API           {running.api_url}  (docs {running.api_url}/docs, metrics {running.api_url}/metrics)",
                 f"dashboard     {running.dashboard_url}",
                 f"worker        metrics http://127.0.0.1:{metrics_port}/metrics",
                 f"operator key  HOOKLEDGER_OPERATOR_KEY={running.operator_key}",
                 f"logs          {running.log_dir}"):
        console.print(line, markup=False, soft_wrap=True)


def _serve(console, running) -> None:
    """Until a signal (KeyboardInterrupt): say at once when a part of the platform stops."""
    import time

    while True:
        for line in running.health_changes():
            output.err().print(f"[red]error[/red]: {line}", soft_wrap=True, highlight=False)
        time.sleep(1)


def _interrupt(signal_number: int, frame: object) -> None:
    raise KeyboardInterrupt


@app.command()
def settings(as_json: common.AsJson = False) -> None:
    """Every setting read from the environment: its value here (secrets as set or unset), default and meaning."""
    import os

    from delivery.platform import settings_reference as reference

    rows = [(s.name, reference.current(s, os.environ), s.meaning) for s in reference.SETTINGS]
    if as_json:
        output.print_json([{"name": name, "value": value, "meaning": meaning} for name, value, meaning in rows])
    else:
        output.print_rows(output.out(), "settings (a value in brackets is the default)",
                          output.ids("variable") + output.texts("value", "meaning"), rows)


@app.command(name="api")
def api() -> None:
    """Serve the HTTP API (/v1, /openapi.json, /docs, /metrics) until SIGTERM."""
    from delivery.platform import api_server as cli_api

    cli_api.api()


app.add_typer(cli_operator.accounts_app, name="accounts")
app.add_typer(cli_operator.deliveries_app, name="deliveries")
# Through the API (the SDK); cli_client also adds accounts create|topup|show and deliveries list.
app.add_typer(cli_client.endpoints_app, name="endpoints")
app.add_typer(operational_app, name="operational")
app.add_typer(cli_applications.applications_app, name="applications")
app.add_typer(cli_catalog.event_types_app, name="event-types")
app.command(name="send")(cli_client.send)
app.command(name="balance")(cli_client.balance)
app.command(name="ledger")(cli_client.ledger)
app.command(name="listen")(cli_client.listen)
app.command(name="expunge")(cli_retention.expunge)
app.command(name="retention")(cli_retention.retention)


def main() -> None:
    try:
        app()
    except _startup_errors() as error:
        # A malformed setting, a port already taken, a server that does not answer: one line
        # saying what to change, not a traceback, and nothing started.
        output.error_line(str(error))
        raise SystemExit(EXIT_UNAVAILABLE if isinstance(error, ServerUnreachableError) else EXIT_CONFIG) from None


def _startup_errors() -> tuple[type[Exception], ...]:
    """The errors main() reports in one line. A ConfigError can only come from delivery.platform.config,
    so when no command loaded it there is none to catch, and it is not imported just for that
    (this runs on every exit: typer ends each command with SystemExit)."""
    config = sys.modules.get("delivery.platform.config")
    return (ServerUnreachableError, config.ConfigError) if config else (ServerUnreachableError,)
