"""CLI commands for apps and operators that go through the SDK (the HTTP API), never the database.

    hookledger endpoints create|list|show|update|delete|rotate-secret|secret
    hookledger send EVENT_TYPE PAYLOAD_JSON [--idempotency-key KEY]
    hookledger deliveries list          (beside the operator's deliveries dead|show|replay)
    hookledger balance | ledger
    hookledger accounts create|topup|reverse-topup|show   (operator key; beside accounts delete|repair)
    hookledger listen [--port 9000] [--secret whsec_...|--secret-from-endpoint ID]

They talk to HOOKLEDGER_API_URL (default http://127.0.0.1:8000, where `hookledger api` listens)
with HOOKLEDGER_API_KEY or --api-key; the operator commands also read HOOKLEDGER_OPERATOR_KEY.
Human output is tables; --json prints the API's answer for scripts (errors go to stderr, as
problem+json with --json). Exit codes: 0 done, 1 the API refused (4xx), 2 usage error,
3 the API failed or could not be reached (5xx, connection).
"""

from __future__ import annotations

import errno
import math
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Annotated, Any, Optional

import msgspec
import typer
from rich.console import Console
from rich.table import Table

from delivery.cli.operator_commands import accounts_app, deliveries_app, parse_id, parse_time

if TYPE_CHECKING:
    # The SDK (httpx) is imported by the commands that call the API, when they run: see delivery.cli.main.
    from delivery.client import Client, HookledgerError, models

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3
API_URL_DEFAULT = "http://127.0.0.1:8000"
PAYLOAD_FROM_STDIN = "-"
_BIND_ERRNOS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})

endpoints_app = typer.Typer(no_args_is_help=True, help="Endpoints: where your webhooks are delivered.")

ApiUrl = Annotated[str, typer.Option("--api-url", envvar="HOOKLEDGER_API_URL", help="The hookledger API.")]
ApiKey = Annotated[Optional[str], typer.Option("--api-key", envvar="HOOKLEDGER_API_KEY", show_default=False,
                                               help="Your account's API key (hl_live_...).")]
OperatorKey = Annotated[Optional[str], typer.Option(
    "--api-key", envvar=["HOOKLEDGER_OPERATOR_KEY", "HOOKLEDGER_API_KEY"], show_default=False,
    help="The operator key.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
Limit = Annotated[Optional[int], typer.Option(min=1, max=100, help="Rows per page (API default 50).")]
Cursor = Annotated[Optional[str], typer.Option(help="The next cursor a previous page printed.")]


def _out() -> Console:
    # Built per command so the terminal width (COLUMNS) and the stream are the ones of this run.
    # A value to copy or capture (a secret) is printed with soft_wrap: folded at the width, it
    # would come out of a pipe (80 columns) as two lines.
    return Console(highlight=False)


def _err() -> Console:
    return Console(stderr=True, highlight=False)


def _usage(message: str) -> typer.Exit:
    _err().print(f"[red]error[/red]: {message}", markup=True)
    return typer.Exit(EXIT_USAGE)


@contextmanager
def _api(api_url: str, api_key: str | None, as_json: bool) -> Iterator[Client]:
    """A client for one command; an API error is printed and becomes the exit code."""
    from delivery.client import APIConnectionError, Client, HookledgerError, ServerError

    if not api_key:
        raise _usage("no API key: set HOOKLEDGER_API_KEY or pass --api-key")
    try:
        client = Client(api_url, api_key)
    except ValueError as error:
        raise _usage(str(error)) from None
    try:
        with client:
            yield client
    except HookledgerError as error:
        _report(error, as_json)
        unavailable = isinstance(error, (ServerError, APIConnectionError)) or error.status is None
        raise typer.Exit(EXIT_UNAVAILABLE if unavailable else EXIT_REFUSED) from None


def _report(error: HookledgerError, as_json: bool) -> None:
    if as_json:
        problem = {"status": error.status, "type": error.type, "title": error.title, "detail": error.detail,
                   "errors": [{"field": e.field, "message": e.message} for e in error.errors],
                   "request_id": error.request_id}
        print(msgspec.json.encode(problem).decode(), file=sys.stderr)
        return
    console = _err()
    console.print(f"error: {error}", style="red", markup=False)
    if error.request_id:
        console.print(f"request id {error.request_id}", markup=False)


def _emit(value: Any, as_json: bool, render: Callable[[Console], None]) -> None:
    if as_json:
        print(msgspec.json.format(msgspec.json.encode(value), indent=2).decode())
    else:
        render(_out())


def _time(value: datetime | None) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S") if value else "-"


def _table(title: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> Table:
    table = Table(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*("-" if cell is None else str(cell) for cell in row))
    return table


def _next_page(console: Console, cursor: str | None) -> None:
    if cursor:
        console.print(f"next page: --cursor {cursor}", markup=False)


def _check_ids(*ids: tuple[str | None, str]) -> None:
    """Each (id given, what it names) is an id, or a usage error (parse_id: stderr, exit 2) before
    the API is asked, which would answer a malformed id as a missing row (404) or a bad field (422),
    exit 1 as for a refusal. Not given (None): nothing to check."""
    for value, what in ids:
        if value is not None:
            parse_id(value, what)


# ---- endpoints -------------------------------------------------------------------------------------

def _endpoint_rows(endpoints) -> list[tuple]:
    return [(e.id, e.url, ", ".join(e.event_types) if e.event_types else "(all)",
             "yes" if e.enabled else f"no ({e.disabled_reason or 'by you'})", e.timeout_ms, e.description)
            for e in endpoints]


_ENDPOINT_COLUMNS = ("id", "url", "event types", "enabled", "timeout ms", "description")


def _print_endpoint(endpoint: models.Endpoint) -> Callable[[Console], None]:
    return lambda console: console.print(_table("endpoint", _ENDPOINT_COLUMNS, _endpoint_rows([endpoint])))


@endpoints_app.command("create")
def endpoints_create(
    url: Annotated[str, typer.Argument(help="Where to POST webhooks (http or https).")],
    event_type: Annotated[Optional[list[str]], typer.Option("--event-type", "-e",
                                                            help="Subscribe to this event type (repeat; none: all).")] = None,
    description: Annotated[str, typer.Option(help="A note for you.")] = "",
    timeout_ms: Annotated[Optional[int], typer.Option(help="Per-attempt timeout in milliseconds.")] = None,
    disabled: Annotated[bool, typer.Option("--disabled", help="Create it disabled.")] = False,
    secret: Annotated[Optional[str], typer.Option(help="Use this whsec_ secret (default: generated).")] = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Create an endpoint; its signing secret is shown by `hookledger endpoints secret ID`."""
    with _api(api_url, api_key, as_json) as client:
        endpoint = client.endpoints.create(url, description=description, event_types=event_type or None,
                                           timeout_ms=timeout_ms, enabled=not disabled, secret=secret)
    _emit(endpoint, as_json, _print_endpoint(endpoint))


@endpoints_app.command("list")
def endpoints_list(api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """List your endpoints."""
    with _api(api_url, api_key, as_json) as client:
        endpoints = client.endpoints.list()
    _emit({"data": endpoints}, as_json,
          lambda console: console.print(_table(f"{len(endpoints)} endpoints", _ENDPOINT_COLUMNS, _endpoint_rows(endpoints))))


@endpoints_app.command("show")
def endpoints_show(endpoint_id: Annotated[str, typer.Argument(metavar="ID")],
                   api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """Show one endpoint."""
    _check_ids((endpoint_id, "endpoint"))
    with _api(api_url, api_key, as_json) as client:
        endpoint = client.endpoints.get(endpoint_id)
    _emit(endpoint, as_json, _print_endpoint(endpoint))


@endpoints_app.command("update")
def endpoints_update(
    endpoint_id: Annotated[str, typer.Argument(metavar="ID")],
    url: Annotated[Optional[str], typer.Option(help="A new URL.")] = None,
    event_type: Annotated[Optional[list[str]], typer.Option("--event-type", "-e",
                                                            help="Subscribe to exactly these (repeat).")] = None,
    all_events: Annotated[bool, typer.Option("--all-events", help="Subscribe to every event type.")] = False,
    description: Annotated[Optional[str], typer.Option(help="A new note.")] = None,
    enabled: Annotated[Optional[bool], typer.Option("--enable/--disable", help="Turn deliveries on or off.",
                                                    show_default=False)] = None,
    timeout_ms: Annotated[Optional[int], typer.Option(help="Per-attempt timeout in milliseconds.")] = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Change an endpoint; only the options given change."""
    _check_ids((endpoint_id, "endpoint"))
    if event_type and all_events:
        raise _usage("give --event-type or --all-events, not both")
    changes: dict[str, Any] = {name: value for name, value in
                               (("url", url), ("description", description), ("enabled", enabled),
                                ("timeout_ms", timeout_ms), ("event_types", event_type or None)) if value is not None}
    if all_events:
        changes["event_types"] = None
    if not changes:
        raise _usage("nothing to change: give at least one option (see --help)")
    with _api(api_url, api_key, as_json) as client:
        endpoint = client.endpoints.update(endpoint_id, **changes)
    _emit(endpoint, as_json, _print_endpoint(endpoint))


@endpoints_app.command("delete")
def endpoints_delete(endpoint_id: Annotated[str, typer.Argument(metavar="ID")],
                     api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """Delete an endpoint; its pending deliveries are refunded."""
    _check_ids((endpoint_id, "endpoint"))
    with _api(api_url, api_key, as_json) as client:
        deleted = client.endpoints.delete(endpoint_id)
    _emit(deleted, as_json, lambda console: console.print(
        f"deleted endpoint {deleted.id}; {deleted.refunded_now} pending deliveries refunded now", markup=False))


@endpoints_app.command("rotate-secret")
def endpoints_rotate_secret(
    endpoint_id: Annotated[str, typer.Argument(metavar="ID")],
    secret: Annotated[Optional[str], typer.Option(help="Rotate to this whsec_ secret (default: generated).")] = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Rotate the signing secret; the old one keeps signing beside it for the overlap (24 h by default).

    With --secret the rotation is safe to retry: rotating to the secret already current changes nothing.
    """
    _check_ids((endpoint_id, "endpoint"))
    with _api(api_url, api_key, as_json) as client:
        new_secret = client.endpoints.rotate_secret(endpoint_id, secret=secret)
    _emit({"secret": new_secret}, as_json, lambda console: console.print(new_secret, markup=False, soft_wrap=True))


@endpoints_app.command("secret")
def endpoints_secret(endpoint_id: Annotated[str, typer.Argument(metavar="ID")],
                     api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """Print the endpoint's signing secret (whsec_...)."""
    _check_ids((endpoint_id, "endpoint"))
    with _api(api_url, api_key, as_json) as client:
        secret = client.endpoints.get_secret(endpoint_id)
    _emit({"secret": secret}, as_json, lambda console: console.print(secret, markup=False, soft_wrap=True))


# ---- send, balance, ledger -------------------------------------------------------------------------

def _payload(text: str) -> msgspec.Raw:
    """The payload exactly as written (it is what the receiver gets, byte for byte), once checked to be JSON."""
    raw = (sys.stdin.read() if text == PAYLOAD_FROM_STDIN else text).strip().encode()
    try:
        msgspec.json.decode(raw)
    except msgspec.DecodeError as error:
        raise _usage(f"PAYLOAD_JSON is not JSON: {error}") from None
    return msgspec.Raw(raw)


def send(
    event_type: Annotated[str, typer.Argument(help="Like invoice.paid.")],
    payload_json: Annotated[str, typer.Argument(help="The payload as JSON, sent byte for byte; - reads stdin.")],
    idempotency_key: Annotated[Optional[str], typer.Option(
        help="Sending again with the same key charges nothing more (default: a new key per run).")] = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Send an event to your subscribed endpoints; each delivery is charged."""
    payload = _payload(payload_json)
    with _api(api_url, api_key, as_json) as client:
        message = client.send(event_type, payload, idempotency_key=idempotency_key)

    def render(console: Console) -> None:
        replayed = " (already accepted under this key: nothing more charged)" if message.replayed else ""
        console.print(f"message {message.id}: {len(message.deliveries)} deliveries, {message.total_charged}"
                      f" credits charged{replayed}", markup=False)
        console.print(f"idempotency key {message.idempotency_key}", markup=False)
        if message.deliveries:
            console.print(_table("deliveries", ("delivery", "endpoint", "price"),
                                 [(d.id, d.endpoint_id, d.price) for d in message.deliveries]))

    _emit(message, as_json, render)


def balance(api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """Your balance, and the credits charged for deliveries still in flight."""
    with _api(api_url, api_key, as_json) as client:
        result = client.balance()
    _emit(result, as_json, lambda console: console.print(
        f"balance {result.balance} credits ({result.in_flight} in flight)", markup=False))


def ledger(
    limit: Limit = None, cursor: Cursor = None,
    delivery: Annotated[Optional[str], typer.Option(help="Only this delivery's entries.")] = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Your ledger, oldest first: top-ups, charges, refunds, reclaims."""
    _check_ids((delivery, "delivery"))
    with _api(api_url, api_key, as_json) as client:
        page = client.ledger(limit=limit, cursor=cursor, delivery_id=delivery)

    def render(console: Console) -> None:
        console.print(_table(f"{len(page)} ledger entries", ("seq", "entry", "kind", "amount", "delivery", "at"),
                             [(e.seq, e.id, e.kind, e.amount, e.delivery_id, _time(e.created_at)) for e in page]))
        _next_page(console, page.next_cursor)

    _emit(page, as_json, render)


# ---- deliveries list (beside the operator's dead/show/replay) ---------------------------------------

@deliveries_app.command("list")
def deliveries_list(
    state: Annotated[Optional[str], typer.Option(help="pending, sending, delivered or dead.")] = None,
    endpoint: Annotated[Optional[str], typer.Option(help="Only this endpoint's.")] = None,
    message: Annotated[Optional[str], typer.Option(help="Only this message's.")] = None,
    created_after: Annotated[Optional[str], typer.Option(help="ISO 8601 time.")] = None,
    created_before: Annotated[Optional[str], typer.Option(help="ISO 8601 time.")] = None,
    limit: Limit = None, cursor: Cursor = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Your deliveries through the API, newest first, one page at a time."""
    after, before = parse_time(created_after, "--created-after"), parse_time(created_before, "--created-before")
    _check_ids((endpoint, "endpoint"), (message, "message"))
    with _api(api_url, api_key, as_json) as client:
        page = client.deliveries.list(limit=limit, cursor=cursor, state=state, endpoint_id=endpoint,
                                      message_id=message, created_after=after, created_before=before)

    def render(console: Console) -> None:
        rows = [(d.id, d.event_type, d.state + (f" ({d.dead_reason})" if d.dead_reason else ""),
                 f"{d.attempt}/{d.attempts_max}", d.price, d.endpoint_id, _time(d.created_at)) for d in page]
        console.print(_table(f"{len(page)} deliveries", ("delivery", "event", "state", "attempts", "price",
                                                          "endpoint", "created"), rows))
        _next_page(console, page.next_cursor)

    _emit(page, as_json, render)


# ---- accounts create / topup / reverse-topup / show (operator, beside delete/repair) ---------------

def _print_account(account: models.Account) -> Callable[[Console], None]:
    return lambda console: console.print(_table(
        "account", ("id", "name", "status", "balance", "price per delivery"),
        [(account.id, account.name, account.status, account.balance, account.price_per_delivery)]))


@accounts_app.command("create")
def accounts_create(
    name: Annotated[str, typer.Argument(help="The account's name.")],
    price: Annotated[Optional[int], typer.Option(help="Credits per delivery (default: the server's).")] = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: OperatorKey = None, as_json: AsJson = False,
) -> None:
    """Create an account and its first API key (shown once: keep it)."""
    with _api(api_url, api_key, as_json) as client:
        created = client.accounts.create(name, price_per_delivery=price)

    def render(console: Console) -> None:
        _print_account(created.account)(console)
        console.print(f"API key (shown once): {created.api_key.key}", markup=False)

    _emit(created, as_json, render)


@accounts_app.command("topup")
def accounts_topup(
    account_id: Annotated[str, typer.Argument(metavar="ACCOUNT_ID")],
    order_id: Annotated[str, typer.Argument(help="Your payment's id: the same order is applied once.")],
    amount: Annotated[int, typer.Argument(min=1, help="Credits to add.")],
    api_url: ApiUrl = API_URL_DEFAULT, api_key: OperatorKey = None, as_json: AsJson = False,
) -> None:
    """Add credits to an account, once per order id."""
    _check_ids((account_id, "account"))
    with _api(api_url, api_key, as_json) as client:
        topup = client.accounts.top_up(account_id, order_id, amount)
    _emit(topup, as_json, lambda console: console.print(
        (f"topped up {topup.amount} credits" if topup.applied else f"order {topup.order_id} was already applied;"
         " nothing added") + f"; balance {topup.balance}", markup=False))


@accounts_app.command("reverse-topup")
def accounts_reverse_topup(
    account_id: Annotated[str, typer.Argument(metavar="ACCOUNT_ID")],
    order_id: Annotated[str, typer.Argument(help="The order to reverse.")],
    api_url: ApiUrl = API_URL_DEFAULT, api_key: OperatorKey = None, as_json: AsJson = False,
) -> None:
    """Reverse a top-up (a refund to the customer), once per order id."""
    _check_ids((account_id, "account"))
    with _api(api_url, api_key, as_json) as client:
        topup = client.accounts.reverse_top_up(account_id, order_id)
    _emit(topup, as_json, lambda console: console.print(
        (f"reversed {-topup.amount} credits" if topup.applied else f"order {topup.order_id} was already reversed;"
         " nothing changed") + f"; balance {topup.balance}", markup=False))


@accounts_app.command("show")
def accounts_show(account_id: Annotated[str, typer.Argument(metavar="ACCOUNT_ID")],
                  api_url: ApiUrl = API_URL_DEFAULT, api_key: OperatorKey = None, as_json: AsJson = False) -> None:
    """Show an account: status, balance, price."""
    _check_ids((account_id, "account"))
    with _api(api_url, api_key, as_json) as client:
        account = client.accounts.get(account_id)
    _emit(account, as_json, _print_account(account))


# ---- listen -----------------------------------------------------------------------------------------

def listen(
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free one).")] = 9000,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    secret: Annotated[Optional[list[str]], typer.Option(
        help="A whsec_ secret (or whpk_ key) to verify with; repeat during a rotation.")] = None,
    secret_from_endpoint: Annotated[Optional[str], typer.Option(
        metavar="ID", help="Fetch the secret of this endpoint from the API.")] = None,
    tolerance_seconds: Annotated[Optional[float], typer.Option(
        help="Accepted clock skew in seconds, above 0 (default 300).")] = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None,
) -> None:
    """Receive webhooks locally: verify each, print it (or why it was refused). Ctrl-C stops."""
    from delivery.cli import listen as listener
    from signing import SigningError, Verifier

    # NaN or a negative tolerance would refuse every webhook, and infinity would accept replays.
    if tolerance_seconds is not None and not (math.isfinite(tolerance_seconds) and tolerance_seconds > 0):
        raise _usage(f"--tolerance-seconds must be a finite number of seconds above 0, not {tolerance_seconds}")
    keys = list(secret or [])
    if secret_from_endpoint:
        _check_ids((secret_from_endpoint, "--secret-from-endpoint"))
        with _api(api_url, api_key, False) as client:
            keys.append(client.endpoints.get_secret(secret_from_endpoint))
    if not keys:
        raise _usage("give --secret whsec_... or --secret-from-endpoint ID: unsigned webhooks cannot be verified")
    try:
        Verifier.of(keys)
    except SigningError as error:
        raise _usage(f"--secret: {error}") from None
    try:
        listener.run(keys, host, port, tolerance_seconds=tolerance_seconds)
    except OSError as error:
        # The address cannot be bound (taken, not this machine's, privileged, unknown host): a
        # configuration error, said in one line with exit 2 as `hookledger api` does, not a traceback.
        if not (isinstance(error, socket.gaierror) or error.errno in _BIND_ERRNOS):
            raise
        from delivery.platform.config import ConfigError  # only here: the settings cost more to import than listen

        raise ConfigError(
            f"cannot listen on {host}:{port} ({error.strerror or error}); pass a free --port (0: any) or another --host"
        ) from None
