"""Query-string filters of the list pages, checked by the API's own `Query` (the same rules and messages).

A form submits empty fields for filters left blank; they mean "any" and are dropped first.
`datetime-local` inputs carry no zone: they are read as UTC, and the pages say so.
"""

from __future__ import annotations

import re
from urllib.parse import urlencode

from multidict import MultiDict, MultiDictProxy

from billing.messages import EVENT_TYPE_LENGTH_MAX
from delivery.api.problems import FieldError
from delivery.api.validation import BIGINT_MAX, Query

PAGE_SIZE = 50
_EVENT_TYPE = re.compile(r"[A-Za-z0-9_.:\-]{1,%d}" % EVENT_TYPE_LENGTH_MAX)
SEQ_DIGITS_MAX = 19


def given(query: MultiDictProxy) -> MultiDict:
    return MultiDict((name, value) for name, value in query.items() if value.strip())


def event_type(values: MultiDict, query: Query) -> str | None:
    """An event type filter (popped before `Query` sees the rest): letters, digits and _ . : -."""
    raw = values.popall("event_type", [])
    if len(raw) > 1:
        query.errors.append(FieldError("event_type", "given more than once"))
        return None
    if raw and not _EVENT_TYPE.fullmatch(raw[0]):
        query.errors.append(FieldError("event_type", "must be letters, digits and _ . : - (like invoice.paid)"))
        return None
    return raw[0] if raw else None


def seq_cursor(query: Query) -> int | None:
    cursor = query.cursor()
    if cursor is None:
        return None
    if cursor.isascii() and cursor.isdigit() and len(cursor) <= SEQ_DIGITS_MAX and int(cursor) <= BIGINT_MAX:
        return int(cursor)
    query.errors.append(FieldError("cursor", "is not a cursor this page made"))
    return None


def link(path: str, values: dict[str, object], **changes: object) -> str:
    """The same page with these filters (None drops one): for the next-page and export links."""
    merged = {**values, **changes}
    pairs = [(name, str(value)) for name, value in merged.items() if value not in (None, "")]
    return path + ("?" + urlencode(pairs) if pairs else "")


def form_value(value: object) -> str:
    """A filter as an input's value: datetimes back to the `datetime-local` form."""
    if hasattr(value, "strftime"):
        return value.strftime("%Y-%m-%dT%H:%M")
    return "" if value is None else str(value)
