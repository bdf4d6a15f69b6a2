"""The operator's commands beside `accounts create|topup|reverse-topup|show` (client_commands):

    hookledger accounts delete ACCOUNT_ID [--yes] [--no-wait] [--inline]   through the API (--inline: PostgreSQL)
    hookledger accounts repair ACCOUNT_ID [--apply [--yes]]                PostgreSQL (DATABASE_URL)
    hookledger deliveries dead [--account ID --endpoint ID --reason R --since T --until T]   through the API
    hookledger deliveries show DELIVERY_ID                                  through the API
    hookledger deliveries replay DELIVERY_ID | --endpoint ID --since T      PostgreSQL (DATABASE_URL)

Through the API they take the operator key (HOOKLEDGER_OPERATOR_KEY, or --api-key); on
PostgreSQL they need DATABASE_URL and refuse in one line without it (delivery.cli.common says
why). Every one takes --json. Exit codes of `accounts delete`: 0 deleted (or started, with
--no-wait), 1 failed or not confirmed, 3 waiting for a repair (`accounts repair ACCOUNT_ID`),
4 still running when --timeout ran out, 2 bad input. Other commands: 0 done, 1 refused, 2 bad
input, 3 the API or PostgreSQL failed or went away during the command (for a replay: whether the
last batch was written could not be told; it says what to do).
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated, Optional

import typer
from rich.console import Console

from billing.errors import BillingError, InvalidInput
from delivery.cli import output
from delivery.cli.common import (
    API_URL_DEFAULT,
    AccountId,
    ApiUrl,
    AsJson,
    Cursor,
    DeliveryId,
    Limit,
    OperatorKey,
    Yes,
    accounts_app,
    api,
    can_ask,
    confirm,
    deliveries_app,
    parse_id,
    parse_time,
    require_database,
)

EXIT_DONE, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_WAITING_REPAIR, EXIT_STILL_RUNNING = 0, 1, 2, 3, 4
EXIT_UNAVAILABLE = 3  # not `accounts delete`'s: PostgreSQL went away while another command ran
DELETION_EXIT_CODES = {"done": EXIT_DONE, "failed": EXIT_FAILED, "waiting_repair": EXIT_WAITING_REPAIR,
                       "running": EXIT_STILL_RUNNING}
POLL_INTERVAL_SECONDS = 0.5
POOL_CLOSE_SECONDS = 5.0  # a graceful close of the pool, then its connections are cut
OPERATOR_KEY_NAMES = "HOOKLEDGER_OPERATOR_KEY"
DELETE_REFUSAL = "deleting an account cannot be undone"


def _human(as_json: bool) -> Console:
    """Where sentences go: stdout, or stderr under --json (stdout is for the JSON alone)."""
    return output.err() if as_json else output.out()


# ---- on PostgreSQL: the pool of one command ---------------------------------------------------------

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


def _run(work, human: Console):
    """Run `work(pool)`; a refused operation prints its reason and exits 1 (2 for bad input);
    PostgreSQL going away meanwhile, one line and exit 3, not a traceback. Reasons go to stderr."""
    from delivery.operations import dead_letters
    from delivery.store import connection_loss

    try:
        return asyncio.run(_with_pool(work))
    except dead_letters.ReplayOutcomeUnknown as unknown:
        _print_in_doubt(unknown, human)
        raise typer.Exit(EXIT_UNAVAILABLE) from None
    except InvalidInput as error:
        raise output.usage(error.detail) from None
    except BillingError as error:
        output.err().print(f"[red]refused[/red]: {error.detail}", markup=True, soft_wrap=True)
        raise typer.Exit(EXIT_FAILED) from None
    except connection_loss.UNAVAILABLE as error:
        output.error_line(f"PostgreSQL went away during the command ({error!r}); run it again once it is back")
        raise typer.Exit(EXIT_UNAVAILABLE) from None


def _print_in_doubt(unknown, console: Console) -> None:
    """What a replay cut off at its COMMIT did for certain, what is in doubt, and how to go on."""
    done = unknown.done
    if done.created or done.already or done.refused:
        _print_outcomes(done, console)
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
        console.print(f"in doubt: {old_id}, replayed as {new_id} if it was written", highlight=False, soft_wrap=True)


# ---- accounts delete / repair --------------------------------------------------------------------

@accounts_app.command("delete")
def delete_account(
    account: AccountId,
    yes: Yes = False,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait and show progress (default) or return at once.")] = True,
    inline: Annotated[bool, typer.Option("--inline", help="Run the deletion job in this process, on PostgreSQL"
                                         " (DATABASE_URL), instead of on a worker through the API.")] = False,
    timeout: Annotated[float, typer.Option(metavar="SECONDS", help="Seconds to wait before giving up watching (exit 4).")] = 3600,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: OperatorKey = None, as_json: AsJson = False,
) -> None:
    """Delete an account, irreversibly: close it, refund every live delivery once, close out its balance."""
    account_id = parse_id(account, "account")
    if not timeout >= 0:  # NaN too: it would never run out, so the command would watch forever
        raise output.usage(f"--timeout must be a number of seconds, 0 or more; got {timeout}")
    if not yes:
        can_ask(DELETE_REFUSAL)
    if inline:
        require_database("accounts delete --inline")
        if not confirm(f"Delete account {account_id}? It closes, its live deliveries are refunded and its balance"
                       " closed out; this cannot be undone.", yes, DELETE_REFUSAL):
            _human(as_json).print("nothing deleted")
            raise typer.Exit(EXIT_FAILED)
        state = _run(lambda pool: _delete_inline(pool, account_id), _human(as_json))
    else:
        state = _delete_through_api(account_id, yes, wait, timeout, api_url, api_key, as_json)
        if state is None:
            raise typer.Exit(EXIT_DONE)
    if as_json:
        output.print_json({"id": state.id, "account_id": state.account_id, "status": state.status, "step": state.step,
                           "report": state.report})
    else:
        _print_deletion(state, output.out())
    raise typer.Exit(DELETION_EXIT_CODES.get(state.status, EXIT_FAILED))


async def _delete_inline(pool, account_id):
    from delivery.operations import deletion

    await deletion.start_account_deletion(pool, None, account_id)
    return await deletion.run_deletion(pool, account_id)


def _delete_through_api(account_id, yes: bool, wait: bool, timeout: float, api_url: str, api_key: str | None,
                        as_json: bool):
    """DELETE /v1/accounts/{id} once confirmed, then follow GET .../deletion until it ends (or the timeout)."""
    human = _human(as_json)
    with api(api_url, api_key, as_json, key_names=OPERATOR_KEY_NAMES) as client:
        if not yes:
            account = client.accounts.get(account_id)
            question = (f"Delete account {account.id} ({account.name}, {account.status}, balance {account.balance}"
                        " credits)? It closes, its live deliveries are refunded and its balance closed out;"
                        " this cannot be undone.")
            if not confirm(question, yes, DELETE_REFUSAL):
                human.print("nothing deleted")
                raise typer.Exit(EXIT_FAILED)
        state = client.accounts.delete(account_id)
        human.print(f"deletion {state.id} of account {account_id} started", soft_wrap=True)
        if not wait:
            if as_json:
                output.print_json(state)
            return None
        return _watch(client, account_id, state, timeout, show_progress=not as_json)


def _watch(client, account_id, state, timeout_seconds: float, *, show_progress: bool):
    """Poll the deletion and show its step (on stderr) until it stops running or the timeout passes."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    deadline = time.monotonic() + timeout_seconds
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=output.err(), transient=True, disable=not show_progress) as progress:
        task = progress.add_task("queued", total=None)
        while state.status == "running" and time.monotonic() <= deadline:
            progress.update(task, description=f"{state.status}: {state.step}")
            time.sleep(POLL_INTERVAL_SECONDS)
            state = client.accounts.deletion(account_id)
    return state


def _print_deletion(state, console: Console) -> None:
    colour = {"done": "green", "waiting_repair": "yellow", "failed": "red"}.get(state.status, "blue")
    console.print(f"deletion of account {state.account_id}: [{colour}]{state.status}[/{colour}] (step {state.step})",
                  soft_wrap=True)
    report = dict(state.report)
    mismatches = report.pop("mismatches", [])
    report.pop("steps", None)
    pairs = [(key, value) for key, value in report.items() if value is not None]
    if pairs:
        output.print_fields(console, pairs)
    if mismatches:
        output.print_rows(console, "live deliveries that disagree with the ledger (nothing was settled)",
                          (*output.ids("delivery"), *output.texts("problem")),
                          [(item["delivery_id"], item["problem"]) for item in mismatches])
        console.print(f"see `hookledger accounts repair {state.account_id}`, then run the deletion again", soft_wrap=True)


@accounts_app.command("repair")
def repair_account(
    account: Annotated[str, typer.Argument(metavar="ACCOUNT_ID", show_default=False,
                                           help="The account whose deletion waits for a repair.")],
    apply: Annotated[bool, typer.Option("--apply", help="Write the corrections (after a confirmation).")] = False,
    yes: Yes = False,
    as_json: AsJson = False,
) -> None:
    """Show the live deliveries that disagree with the ledger and the adjustments that fix them (PostgreSQL)."""
    account_id = parse_id(account, "account")
    require_database("accounts repair")
    from delivery.operations import repair

    human = _human(as_json)
    shown = _run(lambda pool: repair.plan(pool, account_id), human)
    if as_json and not (apply and shown.repairable):
        output.print_json(_repair_json(shown, None))
    elif not as_json:
        _print_repairs(shown, human)
    if not apply or not shown.repairable:
        raise typer.Exit(EXIT_DONE if not shown.needs_a_person else EXIT_FAILED)
    if not confirm(f"write {len(shown.repairable)} adjustment entries (balance change {shown.balance_change:+d}"
                   " credits)?", yes, "a repair writes ledger entries"):
        human.print("nothing written")
        raise typer.Exit(EXIT_FAILED)
    applied = _run(lambda pool: repair.apply(pool, shown), human)
    if as_json:
        output.print_json(_repair_json(shown, applied))
        return
    human.print(f"[green]repaired {applied.repaired} deliveries[/green] ({applied.adjustments} adjustments,"
                f" {applied.refunds} refunds); balance now {applied.balance}."
                f" Resume with `hookledger accounts delete {account_id}`.", soft_wrap=True)


def _repair_json(shown, applied) -> dict:
    repairs = [{"delivery_id": r.delivery_id, "price": r.price, "problem": r.problem, "repairable": r.repairable,
                "adjustment_id": r.adjustment_id, "adjustment_amount": r.adjustment_amount,
                "refund_amount": r.refund_amount, "balance_change": r.balance_change} for r in shown.repairs]
    state = shown.deletion
    return {"account_id": shown.account_id,
            "deletion": None if state is None else {"id": state.id, "status": state.status, "step": state.step},
            "repairs": repairs, "balance_change": shown.balance_change,
            "applied": None if applied is None else {"repaired": applied.repaired, "adjustments": applied.adjustments,
                                                     "refunds": applied.refunds, "balance": applied.balance}}


def _print_repairs(shown, console: Console) -> None:
    state = shown.deletion
    if state is not None:
        console.print(f"deletion of account {shown.account_id}: [bold]{state.status}[/bold] (step {state.step})",
                      soft_wrap=True)
    if not shown.repairs:
        console.print("[green]no live delivery disagrees with the ledger[/green]: nothing to repair")
        return
    rows = [(r.delivery_id, r.price, r.problem, r.adjustment_id, r.adjustment_amount if r.repairable else None,
             r.refund_amount if r.repairable else None, r.balance_change if r.repairable else None)
            for r in shown.repairs]
    output.print_rows(console, f"{len(shown.repairs)} live deliveries disagree with the ledger",
                      (*output.ids("delivery"), *output.texts("price", "problem"), *output.ids("adjustment entry"),
                       *output.texts("amount", "then refund", "balance change")), rows)
    console.print(f"{len(shown.repairable)} repairable (each: the adjustment, then the delivery is marked dead"
                  f" with its refund, as the bulk settlement would); balance change {shown.balance_change:+d} credits")
    if shown.needs_a_person:
        console.print(f"[red]{len(shown.needs_a_person)} need a person[/red]: the deletion cannot finish until they"
                      " are fixed")


# ---- deliveries dead / show (through the API) -------------------------------------------------------

@deliveries_app.command("dead")
def dead(
    account: Annotated[Optional[str], typer.Option(metavar="ACCOUNT_ID", help="Only this account's.")] = None,
    endpoint: Annotated[Optional[str], typer.Option(metavar="ENDPOINT_ID", help="Only this endpoint's.")] = None,
    reason: Annotated[Optional[str], typer.Option("--reason", metavar="REASON",
                                                  help="Only this dead reason (out_of_retries, endpoint_disabled, ...).")] = None,
    since: Annotated[Optional[str], typer.Option(metavar="TIME", help="Died at or after this ISO 8601 time.")] = None,
    until: Annotated[Optional[str], typer.Option(metavar="TIME", help="Died before this ISO 8601 time.")] = None,
    limit: Limit = None, cursor: Cursor = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: OperatorKey = None, as_json: AsJson = False,
) -> None:
    """Dead deliveries of every account (operator), newest first, one page at a time."""
    from billing.tables import DEAD_REASONS

    if reason is not None and reason not in DEAD_REASONS:
        raise output.usage(f"--reason must be one of {', '.join(DEAD_REASONS)}; got {reason!r}")
    account_id = parse_id(account, "account") if account else None
    endpoint_id = parse_id(endpoint, "endpoint") if endpoint else None
    died_after, died_before = parse_time(since, "--since"), parse_time(until, "--until")
    if cursor is not None:
        parse_id(cursor, "--cursor (a next cursor this command printed)")
    with api(api_url, api_key, as_json, key_names=OPERATOR_KEY_NAMES) as client:
        page = client.deliveries.list_dead_letters(limit=limit, cursor=cursor, account_id=account_id,
                                                   endpoint_id=endpoint_id, dead_reason=reason,
                                                   died_after=died_after, died_before=died_before)
    if as_json:
        output.print_json(page)
        return
    console = output.out()
    output.print_rows(console, f"{len(page)} dead deliveries",
                      (*output.ids("delivery", "account"), *output.texts("endpoint url", "event", "reason", "attempts",
                                                                         "died at")),
                      [(d.id, d.account_id, d.url, d.event_type, d.dead_reason, d.attempt, _time(d.finished_at))
                       for d in page])
    if page.next_cursor:
        console.print(f"next page: --cursor {page.next_cursor}", markup=False, soft_wrap=True)


def _time(value) -> str:
    from datetime import timezone

    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if value else "-"


@deliveries_app.command("show")
def show(
    delivery: DeliveryId,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: OperatorKey = None, as_json: AsJson = False,
) -> None:
    """Any account's delivery (operator): its attempts (status, latency, errors, response excerpt, custom headers
    sent) and ledger entries."""
    delivery_id = parse_id(delivery, "delivery")
    with api(api_url, api_key, as_json, key_names=OPERATOR_KEY_NAMES) as client:
        found = client.deliveries.inspect(delivery_id)
    if as_json:
        output.print_json(found)
        return
    console = output.out()
    endpoint = found.url + ("" if found.endpoint_enabled else " (disabled)") + (
        " (deleted)" if found.endpoint_deleted_at else "")
    output.print_fields(console, [
        ("delivery", found.id), ("state", found.state + (f" ({found.dead_reason})" if found.dead_reason else "")),
        ("account", found.account_id), ("endpoint", found.endpoint_id), ("url", endpoint), ("message", found.message_id),
        ("event", found.event_type), ("webhook-id", found.webhook_id),
        *([("replays", found.replay_of)] if found.replay_of else []),
        ("price", found.price), ("attempt", f"{found.attempt}/{found.attempts_max}"),
        ("payload bytes", "erased" if found.payload_bytes is None else found.payload_bytes),
        ("created", _time(found.created_at)), ("finished", _time(found.finished_at)),
    ])
    console.print()
    output.print_rows(console, "attempts (latest first)",
                      output.texts("#", "status", "latency ms", "error", "response excerpt", "headers sent", "stale",
                                   "finished at"),
                      [(a.attempt, a.status_code, a.latency_ms, a.error or "", (a.response_excerpt or "")[:200],
                        _headers_sent(a.sent_headers), "yes" if a.stale else "", _time(a.finished_at))
                       for a in found.attempts])
    output.print_rows(console, "ledger entries", (*output.ids("entry"), *output.texts("kind", "amount", "at")),
                      [(e.id, e.kind, e.amount, _time(e.created_at)) for e in found.ledger_entries])


def _headers_sent(headers: dict[str, str] | None) -> str:
    """An attempt's custom headers on one line, `Name: value` each by name, `;` between."""
    return "; ".join(f"{name}: {headers[name]}" for name in sorted(headers or {}, key=str.lower))


# ---- deliveries replay (on PostgreSQL) -------------------------------------------------------------

@deliveries_app.command("replay")
def replay(
    delivery: Annotated[Optional[str], typer.Argument(metavar="[DELIVERY_ID]", show_default=False,
                                                      help="Replay this dead delivery (or --endpoint for a bulk replay).")] = None,
    again: Annotated[bool, typer.Option("--again", help="Replay even if it was replayed before (a new charge).")] = False,
    endpoint: Annotated[Optional[str], typer.Option(metavar="ENDPOINT_ID",
                                                    help="Bulk: replay this endpoint's dead deliveries in --since/--until.")] = None,
    since: Annotated[Optional[str], typer.Option(metavar="TIME", help="Bulk: died at or after this ISO 8601 time.")] = None,
    until: Annotated[Optional[str], typer.Option(metavar="TIME", help="Bulk: died before this ISO 8601 time (default now).")] = None,
    confirm_total: Annotated[Optional[int], typer.Option(min=0, metavar="CREDITS",
                                                         help="Bulk: the total charge you accept (skips the question).")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Bulk: accept the total shown without asking.")] = False,
    as_json: AsJson = False,
) -> None:
    """Replay dead deliveries as new deliveries with new charges; the old refunds stay (PostgreSQL)."""
    if (delivery is None) == (endpoint is None):
        raise output.usage("give a DELIVERY_ID, or --endpoint ENDPOINT_ID with --since (bulk)")
    if delivery is not None:
        delivery_id = parse_id(delivery, "delivery")
    else:
        endpoint_id = parse_id(endpoint, "endpoint")
        if since is None:
            raise output.usage("a bulk replay needs --since")
        died_after, died_before = parse_time(since, "--since"), parse_time(until, "--until")
    require_database("deliveries replay")
    from datetime import datetime, timezone

    from delivery.operations import dead_letters
    from delivery.platform import config

    settings = config.load()
    attempts_max = settings.ledger.attempts_max
    outcome_wait = settings.api.commit_outcome_wait_seconds  # a COMMIT answer lost: how long to ask
    human = _human(as_json)
    if delivery is not None:
        result = _run(lambda pool: dead_letters.replay(pool, delivery_id, attempts_max=attempts_max, again=again,
                                                       outcome_wait_seconds=outcome_wait), human)
        _print_replayed(result, as_json)
        return
    died_before = died_before or datetime.now(timezone.utc)
    plan = _run(lambda pool: dead_letters.plan_bulk_replay(pool, endpoint_id, died_after, died_before), human)
    human.print(f"{len(plan.delivery_ids)} dead deliveries to replay; total charge {plan.total_charge} credits"
                + (" (more remain for a next call)" if plan.more else ""))
    if not plan.delivery_ids:
        if as_json:
            output.print_json(_replayed_json(dead_letters.Replayed()))
        return
    if confirm_total is None:
        if not confirm(f"charge {plan.total_charge} credits and replay?", yes,
                       f"a bulk replay charges {plan.total_charge} credits: pass --confirm-total {plan.total_charge}"
                       " or --yes"):
            human.print("nothing replayed")
            raise typer.Exit(EXIT_FAILED)
        confirm_total = plan.total_charge
    result = _run(lambda pool: dead_letters.bulk_replay(pool, endpoint_id, died_after, died_before,
                                                        confirm_total=confirm_total, attempts_max=attempts_max,
                                                        outcome_wait_seconds=outcome_wait), human)
    _print_replayed(result, as_json)


def _replayed_json(result) -> dict:
    return {"created": [{"dead_delivery_id": old, "delivery_id": new} for old, new in result.created.items()],
            "already_replayed": [{"dead_delivery_id": old, "delivery_id": new} for old, new in result.already.items()],
            "refused": [{"dead_delivery_id": old, "reason": why} for old, why in result.refused.items()],
            "total_charged": result.charged}


def _print_replayed(result, as_json: bool) -> None:
    if as_json:
        output.print_json(_replayed_json(result))
    else:
        console = output.out()
        _print_outcomes(result, console)
        console.print(f"{len(result.created)} new deliveries, {result.charged} credits charged;"
                      " a worker sends them within one sweep interval")
    if result.refused:
        raise typer.Exit(EXIT_FAILED)


def _print_outcomes(result, console: Console) -> None:
    for old_id, new_id in result.created.items():
        console.print(f"replayed {old_id} as {new_id}", soft_wrap=True)
    for old_id, new_id in result.already.items():
        console.print(f"[yellow]{old_id} was replayed before as {new_id}[/yellow]; nothing charged (use --again)",
                      soft_wrap=True)
    for old_id, why in result.refused.items():
        console.print(f"[red]not replayed[/red] {old_id}: {why}", soft_wrap=True)
