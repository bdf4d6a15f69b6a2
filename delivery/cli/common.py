"""What the command modules share: the `accounts` and `deliveries` sub-apps, the options every
command takes (spelled and worded once), parsing of ids and times, the API client of one command,
and the check of the commands that work on PostgreSQL directly.

Which commands go where: every command that has an API route goes through the API
(HOOKLEDGER_API_URL) with an API key, the operator's with the operator key. Three work on
PostgreSQL directly and say so in one line when DATABASE_URL is not set, rather than start an
empty embedded server of their own: `audit` (one snapshot, set-based SQL), `accounts repair`
(ledger adjustments that no route writes) and `deliveries replay` (money-moving replays whose
in-doubt outcome is resolved against the database; see delivery.operations.dead_letters).
`accounts delete --inline` too, which runs the deletion job in this process.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from delivery.cli import output

if TYPE_CHECKING:
    # The SDK (httpx) is imported by the commands that call the API, when they run: see delivery.cli.main.
    from delivery.client import Client, HookledgerError

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3
API_URL_DEFAULT = "http://127.0.0.1:8000"

accounts_app = typer.Typer(no_args_is_help=True,
                           help="Accounts (operator key): create, top up, show, delete, and repair a deletion that waits.")
deliveries_app = typer.Typer(no_args_is_help=True,
                             help="Deliveries: list yours; the operator's dead letters, inspect, replay.")

ApiUrl = Annotated[str, typer.Option("--api-url", envvar="HOOKLEDGER_API_URL", metavar="URL",
                                     help="The hookledger API.")]
ApiKey = Annotated[Optional[str], typer.Option("--api-key", envvar="HOOKLEDGER_API_KEY", show_default=False,
                                               metavar="KEY", help="Your account's API key (hl_live_...).")]
OperatorKey = Annotated[Optional[str], typer.Option(
    "--api-key", envvar=["HOOKLEDGER_OPERATOR_KEY", "HOOKLEDGER_API_KEY"], show_default=False, metavar="KEY",
    help="The operator key.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON on stdout (and nothing else there).")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
Limit = Annotated[Optional[int], typer.Option(min=1, max=100, metavar="N", help="Rows per page, 1-100 (default 50).")]
Cursor = Annotated[Optional[str], typer.Option("--cursor", metavar="CURSOR", help="The next cursor a previous page printed.")]
AccountId = Annotated[str, typer.Argument(metavar="ACCOUNT_ID", show_default=False, help="The account's id.")]
EndpointId = Annotated[str, typer.Argument(metavar="ENDPOINT_ID", show_default=False, help="The endpoint's id.")]
DeliveryId = Annotated[str, typer.Argument(metavar="DELIVERY_ID", show_default=False, help="The delivery's id.")]


def parse_id(value: str, what: str) -> uuid.UUID:
    """An id given on the command line (every command's, the API's too): a malformed one is bad
    input, said on stderr with exit 2 before anything is asked of PostgreSQL or the API."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise output.usage(f"{what} must be an id like 0193a7e8-0000-7000-8000-000000000001; got {value!r}") from None


def check_ids(*pairs: tuple[str | None, str]) -> None:
    """Each (id given, what it names) is an id, or a usage error before the API is asked (which would
    answer a malformed id as a missing row, exit 1 as for a refusal). None: not given."""
    for value, what in pairs:
        if value is not None:
            parse_id(value, what)


def parse_time(value: str | None, what: str) -> datetime | None:
    """A time given on the command line, in UTC when it names no zone; a malformed one as parse_id."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise output.usage(f"{what} must be an ISO 8601 time like 2026-12-01T10:00:00Z; got {value!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def require_database(command: str) -> None:
    """Refuse, in one line and before anything starts, a command on PostgreSQL without DATABASE_URL.

    Without it the settings would name an embedded server in the data directory: an operator
    command would start an empty one there and fail on its missing tables.
    """
    if not os.environ.get("DATABASE_URL"):
        raise output.usage(f"`hookledger {command}` works on PostgreSQL directly: set DATABASE_URL to the platform's"
                           " database (postgresql://...)")


def confirm(question: str, yes: bool, refusal: str) -> bool:
    """True to go on: --yes, or the person at the terminal said yes. Without a terminal to ask on
    (a script, a pipe) and without --yes: a usage error saying `refusal`, never a silent default.
    The question goes to stderr, so that stdout stays JSON under --json."""
    if yes:
        return True
    can_ask(refusal)
    return typer.confirm(question, err=True)


def can_ask(refusal: str) -> None:
    """A usage error saying `refusal` unless there is a terminal to ask on: checked before anything is asked of
    the API or PostgreSQL, so that a script without --yes learns it at once and changes nothing."""
    if not sys.stdin.isatty():
        raise output.usage(f"{refusal}: pass --yes (there is no terminal to ask on)")


@contextmanager
def api(api_url: str, api_key: str | None, as_json: bool, *, key_names: str = "HOOKLEDGER_API_KEY") -> Iterator[Client]:
    """A client for one command; an API error is printed (one line, or problem JSON under --json)
    and becomes the exit code: 1 refused, 3 failed or unreachable."""
    from delivery.client import APIConnectionError, Client, HookledgerError, ServerError

    if not api_key:
        raise output.usage(f"no API key: set {key_names} or pass --api-key")
    try:
        client = Client(api_url, api_key)
    except ValueError as error:
        raise output.usage(f"--api-url / HOOKLEDGER_API_URL: {error}") from None
    try:
        with client:
            yield client
    except HookledgerError as error:
        if isinstance(error, APIConnectionError):
            error = APIConnectionError(
                f"cannot reach the hookledger API at {api_url} ({error.detail}); is `hookledger api` (or"
                " `hookledger run`) running there? Point HOOKLEDGER_API_URL or --api-url at it")
        report(error, as_json)
        unavailable = isinstance(error, (ServerError, APIConnectionError)) or error.status is None
        raise typer.Exit(EXIT_UNAVAILABLE if unavailable else EXIT_REFUSED) from None


def report(error: HookledgerError, as_json: bool) -> None:
    """An API error on stderr: problem JSON under --json, else one line (and the request id)."""
    import msgspec

    if as_json:
        problem = {"status": error.status, "type": error.type, "title": error.title, "detail": error.detail,
                   "errors": [{"field": e.field, "message": e.message} for e in error.errors],
                   "request_id": error.request_id}
        print(msgspec.json.encode(problem).decode(), file=sys.stderr)
        return
    output.error_line(str(error))
    if error.request_id:
        output.err().print(f"request id {error.request_id}", markup=False)
