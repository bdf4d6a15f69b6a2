"""CLI commands for an account's applications, through the SDK (the HTTP API):

    hookledger applications create|list|show|update|delete|send|add-endpoint|endpoints|usage|portal-link

APP is an application's id or its uid. Output, --json and exit codes as in client_commands.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console

from delivery.cli import output
from delivery.cli.client_commands import emit, endpoint_rows, ENDPOINT_COLUMNS, next_page, payload_of, shown_time
from delivery.cli.common import API_URL_DEFAULT, ApiKey, ApiUrl, AsJson, Cursor, Limit, api, parse_time

if TYPE_CHECKING:
    from delivery.client import models

applications_app = typer.Typer(no_args_is_help=True,
                               help="Applications: your customers, each with its own endpoints; you pay for all.")

App = Annotated[str, typer.Argument(metavar="APP", show_default=False, help="The application's id or uid.")]
_COLUMNS = (*output.ids("id"), *output.texts("uid", "name", "default", "rate limit/s", "created"))


def _rows(applications) -> list[tuple]:
    return [(a.id, a.uid or "-", a.name, "yes" if a.is_default else "", a.rate_limit_per_second or "-",
             shown_time(a.created_at)) for a in applications]


def _print(application: models.Application):
    return lambda console: output.print_rows(console, "application", _COLUMNS, _rows([application]))


def _metadata(pairs: list[str] | None) -> dict[str, str] | None:
    if pairs is None:
        return None
    metadata = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not equals or not name:
            raise output.usage(f"--metadata takes NAME=VALUE; got {pair!r}")
        metadata[name] = value
    return metadata


Metadata = Annotated[Optional[list[str]], typer.Option("--metadata", "-m", metavar="NAME=VALUE",
                                                       help="A metadata pair (repeat).")]
RateLimit = Annotated[Optional[int], typer.Option(
    "--rate-limit", metavar="N", help="Deliveries a second each of its endpoints without a limit of its own gets at most.")]


@applications_app.command("create")
def create(
    name: Annotated[str, typer.Argument(metavar="NAME", show_default=False, help="What you call this customer.")],
    uid: Annotated[Optional[str], typer.Option("--uid", metavar="UID", help="Your own id for it (usable as APP).")] = None,
    metadata: Metadata = None, rate_limit: RateLimit = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Create an application."""
    with api(api_url, api_key, as_json) as client:
        application = client.applications.create(name, uid=uid, metadata=_metadata(metadata),
                                                  rate_limit_per_second=rate_limit)
    emit(application, as_json, _print(application))


@applications_app.command("list")
def list_(limit: Limit = None, cursor: Cursor = None,
          api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """Your applications, oldest first (the default one first)."""
    with api(api_url, api_key, as_json) as client:
        page = client.applications.list(limit=limit, cursor=cursor)

    def render(console: Console) -> None:
        output.print_rows(console, f"{len(page.data)} applications", _COLUMNS, _rows(page.data))
        next_page(console, page.next_cursor)

    emit(page, as_json, render)


@applications_app.command("show")
def show(app: App, api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """Show one application."""
    with api(api_url, api_key, as_json) as client:
        application = client.applications.get(app)
    emit(application, as_json, _print(application))


@applications_app.command("update")
def update(
    app: App, name: Annotated[Optional[str], typer.Option("--name", metavar="NAME")] = None,
    uid: Annotated[Optional[str], typer.Option("--uid", metavar="UID")] = None, metadata: Metadata = None,
    rate_limit: RateLimit = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Change an application's name, uid, metadata (replaced whole) or rate limit."""
    from delivery.client import UNSET

    changes = {"name": name, "uid": uid, "metadata": _metadata(metadata), "rate_limit_per_second": rate_limit}
    changes = {field: value if value is not None else UNSET for field, value in changes.items()}
    with api(api_url, api_key, as_json) as client:
        application = client.applications.update(app, **changes)
    emit(application, as_json, _print(application))


@applications_app.command("delete")
def delete(app: App, api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """Delete an application and its endpoints; their pending deliveries are refunded."""
    with api(api_url, api_key, as_json) as client:
        deleted = client.applications.delete(app)
    emit(deleted, as_json, lambda console: console.print(
        f"deleted application {deleted.id} and {deleted.endpoints_deleted} endpoints;"
        f" {deleted.refunded_now} pending deliveries refunded now", markup=False, soft_wrap=True))


@applications_app.command("send")
def send(
    app: App,
    event_type: Annotated[str, typer.Argument(metavar="EVENT_TYPE", show_default=False, help="Like invoice.paid.")],
    payload_json: Annotated[str, typer.Argument(metavar="PAYLOAD_JSON", show_default=False,
                                                help="The payload as JSON, sent byte for byte; - reads stdin.")],
    idempotency_key: Annotated[Optional[str], typer.Option("--idempotency-key", metavar="KEY")] = None,
    channel: Annotated[Optional[list[str]], typer.Option("--channel", "-c", metavar="CHANNEL",
                                                         help="A channel of the message (repeat, at most 10).")] = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Send an event to this application's subscribed endpoints only; each delivery is charged to you."""
    payload = payload_of(payload_json)
    with api(api_url, api_key, as_json) as client:
        message = client.applications.send(app, event_type, payload, idempotency_key=idempotency_key,
                                           channels=channel or None)
    emit(message, as_json, lambda console: console.print(
        f"message {message.id}: {len(message.deliveries)} deliveries, {message.total_charged} credits charged",
        markup=False, soft_wrap=True))


@applications_app.command("add-endpoint")
def add_endpoint(
    app: App, url: Annotated[str, typer.Argument(metavar="URL", show_default=False)],
    event_type: Annotated[Optional[list[str]], typer.Option("--event-type", "-e", metavar="EVENT_TYPE",
                                                            help="Subscribe to this event type (repeat; none: all).")] = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Add an endpoint to an application."""
    with api(api_url, api_key, as_json) as client:
        endpoint = client.applications.create_endpoint(app, url, event_types=event_type or None)
    emit(endpoint, as_json, lambda console: output.print_rows(console, "endpoint", ENDPOINT_COLUMNS,
                                                               endpoint_rows([endpoint])))


@applications_app.command("endpoints")
def endpoints(app: App, api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """An application's endpoints."""
    with api(api_url, api_key, as_json) as client:
        found = client.applications.list_endpoints(app)
    emit({"data": found}, as_json, lambda console: output.print_rows(
        console, f"{len(found)} endpoints", ENDPOINT_COLUMNS, endpoint_rows(found)))


@applications_app.command("portal-link")
def portal_link(app: App, api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """A single-use link into the application's portal, for its customer (it signs in within 15 minutes)."""
    with api(api_url, api_key, as_json) as client:
        link = client.applications.portal_link(app)
    emit(link, as_json, lambda console: console.print(
        f"{link.url}\n(signs in once, before {shown_time(link.expires_at)} UTC)", markup=False, soft_wrap=True))


@applications_app.command("usage")
def usage(
    app: App,
    since: Annotated[Optional[str], typer.Option(metavar="TIME", help="From this time (ISO 8601).")] = None,
    until: Annotated[Optional[str], typer.Option(metavar="TIME", help="Up to this time, excluded.")] = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """What an application's deliveries cost you: charges, refunds, reclaims, from your ledger."""
    since_time, until_time = parse_time(since, "--since"), parse_time(until, "--until")
    with api(api_url, api_key, as_json) as client:
        result = client.applications.usage(app, since=since_time, until=until_time)
    emit(result, as_json, lambda console: console.print(
        f"{result.charges} charges ({result.charged} credits), {result.refunds} refunds ({result.refunded}),"
        f" {result.reclaims} reclaims ({result.reclaimed}): net {result.net} credits", markup=False, soft_wrap=True))
