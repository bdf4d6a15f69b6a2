"""CLI commands for operational webhooks, through the SDK (the HTTP API):

    hookledger operational create URL [-e TYPE ...] [--description TEXT] [--disabled] [--secret whsec_...]
    hookledger operational list | show ID | update ID [...] | delete ID | secret ID
    hookledger operational events [--type TYPE] [--limit N] [--cursor CURSOR]
    hookledger operational threshold [CREDITS | off]     (no argument: show it)

Same settings, output and exit codes as the other client commands (delivery.cli.client_commands).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import msgspec
import typer
from rich.console import Console

from delivery.cli import output
from delivery.cli.client_commands import emit, next_page, shown_time
from delivery.cli.common import API_URL_DEFAULT, ApiKey, ApiUrl, AsJson, Cursor, Limit, api, check_ids

operational_app = typer.Typer(no_args_is_help=True, help="Operational webhooks: where hookledger tells you about"
                                                         " disabled endpoints, dead deliveries, a low balance.")
OperationalEndpointId = Annotated[str, typer.Argument(metavar="ID", show_default=False,
                                                      help="The operational endpoint's id.")]
EventTypes = Annotated[Optional[list[str]], typer.Option("--event-type", "-e", metavar="EVENT_TYPE",
                                                         help="Only this operational event type (repeat; none: all).")]
_COLUMNS = (*output.ids("id", "url"), *output.texts("event types", "enabled", "description"))
_EVENT_COLUMNS = (*output.ids("id"), *output.texts("seq", "type", "at", "data"))


def _rows(endpoints) -> list[tuple]:
    return [(e.id, e.url, ", ".join(e.event_types) if e.event_types else "(all)", _enabled(e), e.description)
            for e in endpoints]


def _enabled(endpoint) -> str:
    if endpoint.enabled:
        return "yes"
    return f"no ({endpoint.disabled_reason})" if endpoint.disabled_reason else "no"


def _print(endpoint) -> Any:
    return lambda console: output.print_rows(console, "operational endpoint", _COLUMNS, _rows([endpoint]))


@operational_app.command("create")
def create(url: Annotated[str, typer.Argument(metavar="URL", show_default=False, help="Where to POST the events.")],
           event_type: EventTypes = None,
           description: Annotated[str, typer.Option(metavar="TEXT", help="A note for you.")] = "",
           disabled: Annotated[bool, typer.Option("--disabled", help="Create it disabled.")] = False,
           secret: Annotated[Optional[str], typer.Option(metavar="SECRET", help="Use this whsec_ secret.")] = None,
           api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """Create an operational endpoint and print the secret its events are signed with."""
    with api(api_url, api_key, as_json) as client:
        created = client.operational.create_endpoint(url, description=description, event_types=event_type or None,
                                                     enabled=not disabled, secret=secret)

    def render(console: Console) -> None:
        _print(created.endpoint)(console)
        console.print(f"signing secret: {created.secret}", markup=False, soft_wrap=True)

    emit(created, as_json, render)


@operational_app.command("list")
def list_(api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """List your operational endpoints."""
    with api(api_url, api_key, as_json) as client:
        found = client.operational.list_endpoints()
    emit({"data": found}, as_json, lambda console: output.print_rows(
        console, f"{len(found)} operational endpoints", _COLUMNS, _rows(found)))


@operational_app.command("show")
def show(endpoint_id: OperationalEndpointId, api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None,
         as_json: AsJson = False) -> None:
    """Show one operational endpoint."""
    check_ids((endpoint_id, "operational endpoint"))
    with api(api_url, api_key, as_json) as client:
        endpoint = client.operational.get_endpoint(endpoint_id)
    emit(endpoint, as_json, _print(endpoint))


@operational_app.command("update")
def update(endpoint_id: OperationalEndpointId,
           url: Annotated[Optional[str], typer.Option("--url", metavar="URL", help="A new URL.")] = None,
           event_type: EventTypes = None,
           all_events: Annotated[bool, typer.Option("--all-events", help="Every operational event type.")] = False,
           description: Annotated[Optional[str], typer.Option(metavar="TEXT", help="A new note.")] = None,
           enabled: Annotated[Optional[bool], typer.Option("--enable/--disable", show_default=False,
                                                           help="Turn sending on or off.")] = None,
           api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """Change an operational endpoint; only the options given change."""
    check_ids((endpoint_id, "operational endpoint"))
    if event_type and all_events:
        raise output.usage("give --event-type or --all-events, not both")
    changes: dict[str, Any] = {name: value for name, value in (("url", url), ("description", description),
                               ("enabled", enabled), ("event_types", event_type or None)) if value is not None}
    if all_events:
        changes["event_types"] = None
    if not changes:
        raise output.usage("nothing to change: give at least one option (see --help)")
    with api(api_url, api_key, as_json) as client:
        endpoint = client.operational.update_endpoint(endpoint_id, **changes)
    emit(endpoint, as_json, _print(endpoint))


@operational_app.command("delete")
def delete(endpoint_id: OperationalEndpointId, api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None,
           as_json: AsJson = False) -> None:
    """Delete an operational endpoint: nothing more is sent to it."""
    check_ids((endpoint_id, "operational endpoint"))
    with api(api_url, api_key, as_json) as client:
        client.operational.delete_endpoint(endpoint_id)
    emit({"id": endpoint_id, "deleted": True}, as_json, lambda console: console.print(
        f"deleted operational endpoint {endpoint_id}", markup=False, soft_wrap=True))


@operational_app.command("secret")
def secret(endpoint_id: OperationalEndpointId, api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None,
           as_json: AsJson = False) -> None:
    """Print the whsec_ secret an operational endpoint's events are signed with."""
    check_ids((endpoint_id, "operational endpoint"))
    with api(api_url, api_key, as_json) as client:
        value = client.operational.get_secret(endpoint_id)
    emit({"secret": value}, as_json, lambda console: console.print(value, markup=False, soft_wrap=True))


@operational_app.command("events")
def events(event_type: Annotated[Optional[str], typer.Option("--type", metavar="EVENT_TYPE",
                                                             help="Only this event type.")] = None,
           limit: Limit = None, cursor: Cursor = None,
           api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """Your operational events, oldest first (what you may have missed)."""
    with api(api_url, api_key, as_json) as client:
        page = client.operational.events(limit=limit, cursor=cursor, type=event_type)
    rows = [(event.id, event.seq, event.type, shown_time(event.timestamp), json.dumps(event.data)[:120]) for event in page]

    def render(console: Console) -> None:
        output.print_rows(console, f"{len(rows)} operational events", _EVENT_COLUMNS, rows)
        next_page(console, page.next_cursor)

    emit(page, as_json, render)


@operational_app.command("threshold")
def threshold(credits: Annotated[Optional[str], typer.Argument(
                  metavar="[CREDITS|off]", show_default=False,
                  help="Send balance.low when the balance falls below this; off: never. None: show it.")] = None,
              api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """Show or set your low balance threshold."""
    value: int | None = None
    if credits is not None and credits != "off":
        if not credits.isdigit() or not 1 <= int(credits) <= 2**63 - 1:
            raise output.usage("CREDITS must be a whole number of credits, at least 1, or off")
        value = int(credits)
    with api(api_url, api_key, as_json) as client:
        own = client.account() if credits is None else client.operational.set_low_balance_threshold(value)
    emit(msgspec.structs.asdict(own), as_json, lambda console: output.print_fields(console, (
        ("balance", own.balance), ("low balance threshold", own.low_balance_threshold or "off"))))
