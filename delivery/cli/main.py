"""The `hookledger` command line.

Each command imports what it needs when it runs, not here: every `hookledger ...` builds the
whole command tree (for --help, and to find the command), and the API server's modules,
alembic and the settings (delivery.platform.config pulls in the engine, arq and aiohttp) took about 1.4 s
to import before `send` or `--help` did anything. tests/unit/test_cli_imports.py keeps it so.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from delivery.cli import client_commands as cli_client, operator_commands as cli_operator
from delivery.errors import ServerUnreachableError

app = typer.Typer(no_args_is_help=True, add_completion=False, help="hookledger: webhooks billed per delivery.")
console = Console()
EXIT_CONFIG = 2  # a malformed setting or a port already taken: as for a bad argument
EXIT_UNAVAILABLE = 3  # PostgreSQL or Redis did not answer at start (as the client commands use 3)


@app.command()
def migrate() -> None:
    """Apply the database migrations (alembic upgrade head)."""
    from delivery.platform import config, migrate as migrations, services

    settings = config.load()
    migrations.upgrade(services.database_url(settings.database))
    console.print("migrated to head")


@app.command()
def audit(
    account: str = typer.Option(None, help="Audit one account (its id); default: every account."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for machines."),
    since: str = typer.Option(None, help="Incremental: check only the deliveries created or finished, and those"
                              " with a ledger entry, since this ISO 8601 time (balances and triggers are always"
                              " all checked)."),
) -> None:
    """Check invariants I1-I8 against the ledger, and list notices (among them the probe setting and the
    key revocation trigger, against the migrations). Exit code 1 on any violation; notices leave it 0."""
    # Bad input is refused before the audit's modules (the database layer, alembic) are loaded.
    account_id = cli_operator.parse_id(account, "account") if account else None
    since_time = cli_operator.parse_time(since, "--since") if since else None

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
        audit_report.render(report, console)
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
    port: int = typer.Option(8000, min=0, max=65535, help="Port for the API (0: any free port)."),
) -> None:
    """The whole platform on this machine (embedded PostgreSQL and Redis unless configured), with a demo."""
    import signal as signals

    from delivery.platform import config, demo as platform_demo, run as platform

    # SIGTERM (a supervisor, `timeout`, `docker stop`) and SIGHUP (the terminal closed) stop the
    # platform as Ctrl-C does. Their default would end this process at once, leaving the API,
    # the worker, the receiver and the embedded PostgreSQL and Redis running with no owner.
    for signal_number in (signals.SIGTERM, signals.SIGHUP):
        signals.signal(signal_number, _interrupt)
    settings = config.load()
    console.print("starting PostgreSQL, Redis, the API and a worker ...")
    running = platform.start(settings, api_port=port or None)
    try:
        console.print(f"API      {running.api_url}  (docs {running.api_url}/docs, metrics {running.api_url}/metrics)")
        console.print(f"worker   metrics http://127.0.0.1:{running.environment['HOOKLEDGER_WORKER_METRICS_PORT']}/metrics")
        console.print(f"operator HOOKLEDGER_OPERATOR_KEY={running.operator_key}")
        console.print(f"logs     {running.log_dir}")
        clean = platform_demo.run(running, console)
        console.print("[green]demo finished: every delivery ended and the audit is clean[/green]" if clean
                      else "[red]demo failed: see above[/red]")
        if demo_only:
            raise typer.Exit(0 if clean else 1)
        console.print("serving until Ctrl-C ...")
        while True:
            signals.pause()
    except KeyboardInterrupt:
        pass
    finally:
        running.stop()


def _interrupt(signal_number: int, frame: object) -> None:
    raise KeyboardInterrupt


@app.command(name="api")
def api() -> None:
    """Serve the HTTP API (/v1, /openapi.json, /docs, /metrics) until SIGTERM."""
    from delivery.platform import api_server as cli_api

    cli_api.api()


app.add_typer(cli_operator.accounts_app, name="accounts")
app.add_typer(cli_operator.deliveries_app, name="deliveries")
# Through the API (the SDK); cli_client also adds accounts create|topup|show and deliveries list.
app.add_typer(cli_client.endpoints_app, name="endpoints")
app.command(name="send")(cli_client.send)
app.command(name="balance")(cli_client.balance)
app.command(name="ledger")(cli_client.ledger)
app.command(name="listen")(cli_client.listen)


def main() -> None:
    try:
        app()
    except _startup_errors() as error:
        # A malformed setting, a port already taken, a server that does not answer: one line
        # saying what to change, not a traceback, and nothing started.
        Console(stderr=True).print(f"[red]error[/red]: {error}", highlight=False)
        raise SystemExit(EXIT_UNAVAILABLE if isinstance(error, ServerUnreachableError) else EXIT_CONFIG) from None


def _startup_errors() -> tuple[type[Exception], ...]:
    """The errors main() reports in one line. A ConfigError can only come from delivery.platform.config,
    so when no command loaded it there is none to catch, and it is not imported just for that
    (this runs on every exit: typer ends each command with SystemExit)."""
    config = sys.modules.get("delivery.platform.config")
    return (ServerUnreachableError, config.ConfigError) if config else (ServerUnreachableError,)
