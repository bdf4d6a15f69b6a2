"""CLI commands for the event catalog, through the SDK (the HTTP API):

    hookledger event-types create|list|show|update

A schema is given as JSON text (or - to read it from stdin). Output, --json and exit codes as in
client_commands.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.console import Console

from delivery.cli import output
from delivery.cli.client_commands import emit, next_page
from delivery.cli.common import API_URL_DEFAULT, ApiKey, ApiUrl, AsJson, Cursor, Limit, api

if TYPE_CHECKING:
    from delivery.client import models

event_types_app = typer.Typer(no_args_is_help=True,
                              help="The event catalog: your event types, their descriptions and payload schemas.")

Name = Annotated[str, typer.Argument(metavar="NAME", show_default=False, help="Like invoice.paid.")]
SchemaText = Annotated[Optional[str], typer.Option(
    "--schema", metavar="JSON", help="A JSON Schema (draft 2020-12) every payload must pass; - reads stdin.")]
_COLUMNS = (*output.texts("name", "archived", "schema", "description"),)


def _schema(text: str | None) -> Any:
    raw = sys.stdin.read() if text == "-" else text
    try:
        return json.loads(raw)
    except ValueError as error:
        raise output.usage(f"--schema is not JSON: {error}") from None


def _rows(event_types) -> list[tuple]:
    return [(e.name, "yes" if e.archived else "", "yes" if e.schema is not None else "", e.description)
            for e in event_types]


def _print(event_type: models.EventType):
    return lambda console: output.print_rows(console, "event type", _COLUMNS, _rows([event_type]))


@event_types_app.command("create")
def create(
    name: Name, description: Annotated[str, typer.Option("--description", metavar="TEXT")] = "",
    schema: SchemaText = None, archived: Annotated[bool, typer.Option("--archived")] = False,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Add an event type to your catalog."""
    parsed = None if schema is None else _schema(schema)
    with api(api_url, api_key, as_json) as client:
        created = client.event_types.create(name, description=description, schema=parsed, archived=archived)
    emit(created, as_json, _print(created))


@event_types_app.command("list")
def list_(limit: Limit = None, cursor: Cursor = None,
          include_archived: Annotated[bool, typer.Option("--include-archived")] = False,
          api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """Your event types, oldest first."""
    with api(api_url, api_key, as_json) as client:
        page = client.event_types.list(limit=limit, cursor=cursor, include_archived=include_archived)

    def render(console: Console) -> None:
        output.print_rows(console, f"{len(page.data)} event types", _COLUMNS, _rows(page.data))
        next_page(console, page.next_cursor)

    emit(page, as_json, render)


@event_types_app.command("show")
def show(name: Name, api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False) -> None:
    """Show one event type (with --json, its schema)."""
    with api(api_url, api_key, as_json) as client:
        found = client.event_types.get(name)
    emit(found, as_json, _print(found))


@event_types_app.command("update")
def update(
    name: Name, description: Annotated[Optional[str], typer.Option("--description", metavar="TEXT")] = None,
    schema: SchemaText = None, no_schema: Annotated[bool, typer.Option("--no-schema", help="Drop its schema.")] = False,
    archived: Annotated[Optional[bool], typer.Option("--archive/--unarchive")] = None,
    api_url: ApiUrl = API_URL_DEFAULT, api_key: ApiKey = None, as_json: AsJson = False,
) -> None:
    """Change an event type's description or schema, or archive it (no new messages of it)."""
    from delivery.client import UNSET

    if schema is not None and no_schema:
        raise output.usage("give --schema or --no-schema, not both")
    changes: dict[str, Any] = {"description": UNSET if description is None else description,
                               "schema": None if no_schema else UNSET if schema is None else _schema(schema),
                               "archived": UNSET if archived is None else archived}
    with api(api_url, api_key, as_json) as client:
        updated = client.event_types.update(name, **changes)
    emit(updated, as_json, _print(updated))
