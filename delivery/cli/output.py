"""What every command prints with: the consoles, tables whose ids are never cut, JSON, and one-line errors.

Ids are printed whole, always: a table keeps each id column at the id's full width (never
wrapped, never cut with an ellipsis), and when the terminal is too narrow for that the rows are
printed as a list, one `field  value` line each, instead. A value someone copies into the next
command must come out as it is.

Output that is not a terminal (a pipe, a file, a CI log) is WIDTH_NOT_A_TERMINAL columns wide
unless COLUMNS says otherwise, not rich's 80: at 80 a table folds its rows and a long line (a
key, a URL) is split in two.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

WIDTH_NOT_A_TERMINAL = 200
TEXT_COLUMN_WIDTH_MIN = 12  # a text column may fold down to this before the table turns into a list
EXIT_USAGE = 2


def _width(stream) -> int | None:
    """None (rich decides: the terminal's width, or COLUMNS) unless the stream is not a terminal and
    COLUMNS is not set."""
    if os.environ.get("COLUMNS", "").isdigit():
        return None
    isatty = getattr(stream, "isatty", None)
    return None if isatty is not None and isatty() else WIDTH_NOT_A_TERMINAL


def out() -> Console:
    """stdout, built per command so that the width and the stream are this run's (tests swap sys.stdout)."""
    return Console(highlight=False, width=_width(sys.stdout))


def err() -> Console:
    return Console(stderr=True, highlight=False, width=_width(sys.stderr))


def error_line(message: str) -> None:
    """`error: message` on stderr, as one line: never wrapped, so a script or a test reads it whole."""
    err().print(f"[red]error[/red]: {escape(message)}", soft_wrap=True)


def usage(message: str) -> typer.Exit:
    """A usage error: the reason on stderr, exit 2. Raise what it returns."""
    error_line(message)
    return typer.Exit(EXIT_USAGE)


def print_json(value: Any) -> None:
    """Machine output: JSON on stdout, the only thing there (msgspec Structs, dicts, lists, ids, times)."""
    print(msgspec.json.format(msgspec.json.encode(value, enc_hook=str), indent=2).decode())


@dataclass(frozen=True)
class Column:
    name: str
    is_id: bool = False  # an id (or another value to copy whole): its column never wraps or cuts it


def ids(*names: str) -> tuple[Column, ...]:
    return tuple(Column(name, is_id=True) for name in names)


def texts(*names: str) -> tuple[Column, ...]:
    return tuple(Column(name) for name in names)


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def print_rows(console: Console, title: str, columns: Sequence[Column], rows: Sequence[Sequence[Any]]) -> None:
    """A table of `rows`, or, when the console is too narrow for every id whole, the same rows as a list."""
    cells = [[_cell(value) for value in row] for row in rows]
    table = Table(title=title)
    widths = []
    for index, column in enumerate(columns):
        longest = max([len(column.name), *(len(row[index]) for row in cells)])
        widths.append(longest if column.is_id else min(longest, TEXT_COLUMN_WIDTH_MIN))
        if column.is_id:
            table.add_column(column.name, no_wrap=True, min_width=longest)
        else:
            table.add_column(column.name, overflow="fold", min_width=widths[-1])
    for row in cells:
        table.add_row(*row)
    # Each column's narrowest, a space of padding either side, and a border between and around.
    if sum(widths) + 3 * len(columns) + 1 <= console.width:
        console.print(table)
        return
    console.print(title, markup=False, soft_wrap=True)
    label_width = max(len(column.name) for column in columns)
    for row in cells:
        console.print()
        for column, value in zip(columns, row, strict=True):
            console.print(f"  {column.name:<{label_width}}  {value}", markup=False, soft_wrap=True)


def print_fields(console: Console, pairs: Sequence[tuple[str, Any]]) -> None:
    """One record as `field  value` lines (never wrapped): what `show` commands print."""
    label_width = max(len(name) for name, _ in pairs)
    for name, value in pairs:
        console.print(f"{name:<{label_width}}  {_cell(value)}", markup=False, soft_wrap=True)
