"""Operator commands: `hookledger accounts delete|repair` and `hookledger deliveries dead|show|replay`.

`accounts_app` and `deliveries_app` are typer sub-apps that delivery.cli.main registers; other
modules may add commands to them. Exit codes of `accounts delete`: 0 deleted, 1 failed,
3 waiting for a repair (`accounts repair ID`), 4 still running when --timeout ran out,
2 bad input. Other commands: 0 done, 1 refused, 2 bad input, 3 PostgreSQL went away during the
command (for a replay: whether the last batch was written could not be told; it says what to do).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import datetime, timezone

import typer
from rich.console import Console
from rich.table import Table

from billing.errors import BillingError, InvalidInput

accounts_app = typer.Typer(no_args_is_help=True, help="Accounts: create, top up, show, delete (and repair a deletion that waits).")
deliveries_app = typer.Typer(no_args_is_help=True, help="Deliveries: dead letters, inspect, replay.")
console = Console()
errors = Console(stderr=True)  # what went wrong: never on stdout, which --json keeps for JSON

EXIT_DONE, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_WAITING_REPAIR, EXIT_STILL_RUNNING = 0, 1, 2, 3, 4
EXIT_UNAVAILABLE = 3  # not `accounts delete`'s: PostgreSQL went away while another command ran
DELETION_EXIT_CODES = {"done": EXIT_DONE, "failed": EXIT_FAILED, "waiting_repair": EXIT_WAITING_REPAIR,
                       "running": EXIT_STILL_RUNNING}
POLL_INTERVAL_SECONDS = 0.5
POOL_CLOSE_SECONDS = 5.0  # a graceful close of the pool, then its connections are cut


def parse_id(value: str, what: str) -> uuid.UUID:
    """An id given on the command line (every command's, the API's too): a malformed one is bad
    input, said on stderr with exit 2 before anything is asked of PostgreSQL or the API."""
    try:
        return uuid.UUID(value)
    except ValueError:
        errors.print(f"[red]error[/red]: {what} must be an id like 01a2...-...; got {value!r}")
        raise typer.Exit(EXIT_BAD_INPUT) from None


def parse_time(value: str | None, what: str) -> datetime | None:
    """A time given on the command line, in UTC when it names no zone; a malformed one as parse_id."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        errors.print(f"[red]error[/red]: {what} must be an ISO 8601 time like 2026-12-01T10:00:00Z; got {value!r}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


async def _with_pool(work):
    from billing.database import ask_within
    from delivery.platform import config
    from delivery.platform.database import open_pool

    pool = await open_pool(config.load())
    try:
        return await work(pool)
    finally:
        try:
            # A connection stuck on a database that stopped answering would hold a graceful close,
            # and the command, forever: after an answer the command already has, that is a hang.
            await ask_within(pool.close(), POOL_CLOSE_SECONDS)
        except asyncio.TimeoutError:
            pool.terminate()


def _run(work):
    """Run `work(pool)`; a refused operation prints its reason and exits 1 (2 for bad input);
    PostgreSQL going away meanwhile, one line and exit 3, not a traceback. Reasons go to stderr."""
    from delivery.store import connection_loss
    from delivery.operations import dead_letters

    try:
        return asyncio.run(_with_pool(work))
    except dead_letters.ReplayOutcomeUnknown as unknown:
        _print_in_doubt(unknown)
        raise typer.Exit(EXIT_UNAVAILABLE) from None
    except InvalidInput as error:
        errors.print(f"[red]error[/red]: {error.detail}")
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except BillingError as error:
        errors.print(f"[red]refused[/red]: {error.detail}")
        raise typer.Exit(EXIT_FAILED) from None
    except connection_loss.UNAVAILABLE as error:
        errors.print(f"[red]error[/red]: PostgreSQL went away during the command ({error!r}); run it again"
                      " once it is back", highlight=False)
        raise typer.Exit(EXIT_UNAVAILABLE) from None


def _print_in_doubt(unknown) -> None:
    """What a replay cut off at its COMMIT did for certain, what is in doubt, and how to go on."""
    done = unknown.done
    if done.created or done.already or done.refused:
        _print_outcomes(done)
        console.print(f"before that: {len(done.created)} new deliveries, {done.charged} credits charged")
    # The would-be new delivery of each replay in doubt: `deliveries show` on it tells whether it exists.
    pairs = [(old_id, result.deliveries[0].id) for old_id, result in zip(unknown.in_doubt, unknown.results)
             if getattr(result, "deliveries", None)]
    advice = ("each replay is keyed by its dead delivery, so running the same command again replays each at most"
              " once" if unknown.keyed else
              "these were --again replays (no key): run `hookledger deliveries show` on the new ids below before"
              " replaying again, or they may be replayed and charged twice")
    console.print(f"[red]error[/red]: the connection to PostgreSQL broke while {len(unknown.in_doubt)} replays were"
                  " being committed, and the database could not be asked in time whether they were written;"
                  f" {advice}.", highlight=False)
    for old_id, new_id in pairs:
        console.print(f"in doubt: {old_id}, replayed as {new_id} if it was written", highlight=False)


# ---- accounts delete / repair --------------------------------------------------------------------

@accounts_app.command("delete")
def delete_account(
    account: str = typer.Argument(..., help="The account id."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait and show progress (default) or return at once."),
    inline: bool = typer.Option(False, "--inline", help="Run the job in this process instead of on a worker."),
    timeout: float = typer.Option(3600, help="Seconds to wait before giving up watching (exit 4)."),
) -> None:
    """Delete an account: close it, refund every live delivery once, close out its balance."""
    from delivery.operations import deletion

    account_id = parse_id(account, "account")
    if not timeout >= 0:  # NaN too: it would never run out, so the command would watch forever
        errors.print(f"[red]error[/red]: --timeout must be a number of seconds, 0 or more; got {timeout}")
        raise typer.Exit(EXIT_BAD_INPUT)

    async def main(pool):
        if inline:
            await deletion.start_account_deletion(pool, None, account_id)
            return await deletion.run_deletion(pool, account_id)
        from delivery.platform import config
        from delivery.engine import queue as job_queue
        from delivery.platform import services

        redis = await job_queue.connect(services.redis_url(config.load().redis))
        try:
            deletion_id = await deletion.start_account_deletion(pool, redis, account_id)
        finally:
            await redis.aclose()
        console.print(f"deletion {deletion_id} of account {account_id} started")
        if not wait:
            return None
        return await _watch(pool, account_id, timeout)

    state = _run(main)
    if state is None:
        raise typer.Exit(EXIT_DONE)
    _print_deletion(state)
    raise typer.Exit(DELETION_EXIT_CODES.get(state.status, EXIT_FAILED))


async def _watch(pool, account_id: uuid.UUID, timeout_seconds: float):
    """Poll the deletion row and show its step until it stops running or the timeout passes."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from delivery.operations import deletion

    deadline = time.monotonic() + timeout_seconds
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("queued", total=len(deletion.STEPS))
        while True:
            state = await deletion.read_deletion(pool, account_id)
            done_steps = deletion.STEPS.index(state.step) + 1 if state.step in deletion.STEPS else 0
            progress.update(task, description=f"{state.status}: {state.step}", completed=done_steps)
            if state.status != "running" or time.monotonic() > deadline:
                return state
            await asyncio.sleep(POLL_INTERVAL_SECONDS)


def _print_deletion(state) -> None:
    colour = {"done": "green", "waiting_repair": "yellow", "failed": "red"}.get(state.status, "blue")
    console.print(f"deletion of account {state.account_id}: [{colour}]{state.status}[/{colour}] (step {state.step})")
    report = dict(state.report)
    mismatches = report.pop("mismatches", [])
    report.pop("steps", None)
    table = Table(show_header=False)
    for key, value in report.items():
        if value is not None:
            table.add_row(key, str(value))
    console.print(table)
    if mismatches:
        listed = Table(title="live deliveries that disagree with the ledger (nothing was settled)")
        listed.add_column("delivery")
        listed.add_column("problem")
        for item in mismatches:
            listed.add_row(item["delivery_id"], item["problem"])
        console.print(listed)
        console.print(f"see `hookledger accounts repair {state.account_id}`, then run the deletion again")


@accounts_app.command("repair")
def repair_account(
    account: str = typer.Argument(..., help="The account id (its deletion waits for a repair)."),
    apply: bool = typer.Option(False, "--apply", help="Write the corrections (after a confirmation)."),
    yes: bool = typer.Option(False, "--yes", help="With --apply: do not ask for confirmation."),
) -> None:
    """Show the live deliveries that disagree with the ledger and the adjustments that fix them."""
    from delivery.operations import repair

    account_id = parse_id(account, "account")
    shown = _run(lambda pool: repair.plan(pool, account_id))
    repair.render(shown, console)
    if not apply or not shown.repairable:
        raise typer.Exit(EXIT_DONE if not shown.needs_a_person else EXIT_FAILED)
    if not yes and not typer.confirm(f"write {len(shown.repairable)} adjustment entries"
                                     f" (balance change {shown.balance_change:+d} credits)?"):
        console.print("nothing written")
        raise typer.Exit(EXIT_FAILED)
    applied = _run(lambda pool: repair.apply(pool, shown))
    console.print(f"[green]repaired {applied.repaired} deliveries[/green] ({applied.adjustments} adjustments,"
                  f" {applied.refunds} refunds); balance now {applied.balance}."
                  f" Resume with `hookledger accounts delete {account_id}`.")


# ---- deliveries dead / show / replay -------------------------------------------------------------

@deliveries_app.command("dead")
def dead(
    account: str = typer.Option(None, help="Only this account's dead deliveries."),
    endpoint: str = typer.Option(None, help="Only this endpoint's."),
    reason: str = typer.Option(None, help="Only this dead reason (out_of_retries, endpoint_disabled, ...)."),
    since: str = typer.Option(None, help="Died at or after this ISO 8601 time."),
    until: str = typer.Option(None, help="Died before this ISO 8601 time."),
    cursor: str = typer.Option(None, help="The next cursor a previous page printed."),
    limit: int = typer.Option(50, min=1, max=500, help="Rows per page (1-500)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for machines."),
) -> None:
    """List dead deliveries, newest first, one page at a time."""
    from billing.tables import DEAD_REASONS
    from delivery.operations import dead_letters

    if reason is not None and reason not in DEAD_REASONS:
        errors.print(f"[red]error[/red]: --reason must be one of {', '.join(DEAD_REASONS)}; got {reason!r}")
        raise typer.Exit(EXIT_BAD_INPUT)
    filters = dead_letters.DeadFilter(
        parse_id(account, "account") if account else None, parse_id(endpoint, "endpoint") if endpoint else None,
        reason, parse_time(since, "--since"), parse_time(until, "--until"),
    )
    page = _run(lambda pool: dead_letters.list_dead(pool, filters, cursor=cursor, limit=limit))
    if as_json:
        print(json.dumps({"data": page.rows, "next_cursor": page.next_cursor}, default=str, indent=2))
        return
    table = Table(title=f"{len(page.rows)} dead deliveries")
    for column in ("delivery", "account", "endpoint url", "event", "reason", "attempts", "died at"):
        table.add_column(column)
    for row in page.rows:
        table.add_row(str(row["id"]), str(row["account_id"]), row["url"], row["event_type"], row["dead_reason"],
                      str(row["attempt"]), str(row["finished_at"]))
    console.print(table)
    if page.next_cursor:
        console.print(f"next page: --cursor {page.next_cursor}")


@deliveries_app.command("show")
def show(
    delivery: str = typer.Argument(..., help="The delivery id."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for machines."),
) -> None:
    """One delivery: its attempts (status, latency, errors, response excerpt) and ledger entries."""
    from delivery.operations import dead_letters

    delivery_id = parse_id(delivery, "delivery")
    found = _run(lambda pool: dead_letters.inspect(pool, delivery_id))
    if as_json:
        print(json.dumps(found, default=str, indent=2))
        return
    d = found["delivery"]
    console.print(f"delivery {d['id']} ({d['state']}{', ' + d['dead_reason'] if d['dead_reason'] else ''}),"
                  f" account {d['account_id']}, {d['url']}, event {d['event_type']}, price {d['price']},"
                  f" attempt {d['attempt']}/{d['attempts_max']}, webhook-id {d['webhook_id']}"
                  + (f", replays {d['replay_of']}" if d["replay_of"] else ""))
    attempts = Table(title="attempts (latest first)")
    for column in ("#", "status", "latency ms", "error", "response excerpt", "stale", "finished at"):
        attempts.add_column(column)
    for a in found["attempts"]:
        attempts.add_row(str(a["attempt"]), str(a["status_code"] or "-"), str(a["latency_ms"] or "-"),
                         a["error"] or "", (a["response_excerpt"] or "")[:200], "yes" if a["stale"] else "",
                         str(a["finished_at"]))
    console.print(attempts)
    ledger = Table(title="ledger entries")
    for column in ("entry", "kind", "amount", "at"):
        ledger.add_column(column)
    for entry in found["ledger"]:
        ledger.add_row(entry["id"], entry["kind"], str(entry["amount"]), str(entry["created_at"]))
    console.print(ledger)


@deliveries_app.command("replay")
def replay(
    delivery: str = typer.Argument(None, help="Replay this dead delivery (or use --endpoint for a bulk replay)."),
    again: bool = typer.Option(False, "--again", help="Replay even if it was replayed before (a new charge)."),
    endpoint: str = typer.Option(None, help="Bulk: replay this endpoint's dead deliveries in --since/--until."),
    since: str = typer.Option(None, help="Bulk: died at or after this ISO 8601 time."),
    until: str = typer.Option(None, help="Bulk: died before this ISO 8601 time (default now)."),
    confirm_total: int = typer.Option(None, min=0, help="Bulk: the total charge you accept (skips the question)."),
    yes: bool = typer.Option(False, "--yes", help="Bulk: accept the total shown without asking."),
) -> None:
    """Replay dead deliveries as new deliveries with new charges; the old refunds stay."""
    from delivery.platform import config
    from delivery.operations import dead_letters

    settings = config.load()
    attempts_max = settings.ledger.attempts_max
    outcome_wait = settings.api.commit_outcome_wait_seconds  # a COMMIT answer lost: how long to ask
    if (delivery is None) == (endpoint is None):
        errors.print("[red]error[/red]: give a delivery id, or --endpoint with --since (bulk)")
        raise typer.Exit(EXIT_BAD_INPUT)
    if delivery is not None:
        delivery_id = parse_id(delivery, "delivery")
        result = _run(lambda pool: dead_letters.replay(pool, delivery_id, attempts_max=attempts_max, again=again,
                                                       outcome_wait_seconds=outcome_wait))
        _print_replayed(result)
        return
    endpoint_id = parse_id(endpoint, "endpoint")
    if since is None:
        errors.print("[red]error[/red]: a bulk replay needs --since")
        raise typer.Exit(EXIT_BAD_INPUT)
    died_after, died_before = parse_time(since, "--since"), parse_time(until, "--until") or datetime.now(timezone.utc)
    plan = _run(lambda pool: dead_letters.plan_bulk_replay(pool, endpoint_id, died_after, died_before))
    console.print(f"{len(plan.delivery_ids)} dead deliveries to replay; total charge {plan.total_charge} credits"
                  + (" (more remain for a next call)" if plan.more else ""))
    if not plan.delivery_ids:
        return
    if confirm_total is None:
        if not yes and not typer.confirm(f"charge {plan.total_charge} credits and replay?"):
            console.print("nothing replayed")
            raise typer.Exit(EXIT_FAILED)
        confirm_total = plan.total_charge
    result = _run(lambda pool: dead_letters.bulk_replay(pool, endpoint_id, died_after, died_before,
                                                        confirm_total=confirm_total, attempts_max=attempts_max,
                                                        outcome_wait_seconds=outcome_wait))
    _print_replayed(result)


def _print_replayed(result) -> None:
    _print_outcomes(result)
    console.print(f"{len(result.created)} new deliveries, {result.charged} credits charged;"
                  " a worker sends them within one sweep interval")
    if result.refused:
        raise typer.Exit(EXIT_FAILED)


def _print_outcomes(result) -> None:
    for old_id, new_id in result.created.items():
        console.print(f"replayed {old_id} as {new_id}")
    for old_id, new_id in result.already.items():
        console.print(f"[yellow]{old_id} was replayed before as {new_id}[/yellow]; nothing charged (use --again)")
    for old_id, why in result.refused.items():
        console.print(f"[red]not replayed[/red] {old_id}: {why}")
