"""The event catalog on the create path: a message of a type with a JSON Schema must pass it
(422 naming each failing path, nothing written), and a message of an archived type is refused.

Each API process keeps an account's catalog (its types that have a schema or are archived, with
their compiled validators) for CATALOG_CACHE_SECONDS: one query per account in that time, then
nothing more on the create path for accounts without schemas than a dictionary lookup. A change
made through this process is seen at once; one made through another process within that time.

Schemas are JSON Schema draft 2020-12 (the `jsonschema` package), checked against the metaschema
when they are written. Only local references are followed: a `$ref` to another document is
refused by the validator's registry, which retrieves nothing.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import jsonschema
import msgspec
import referencing.exceptions

from delivery.api.problems import FieldError, validation
from delivery.store import event_types as store

CATALOG_CACHE_SECONDS = 5.0
CATALOG_CACHE_ACCOUNTS_MAX = 10_000
PAYLOAD_ERRORS_MAX = 20
ERROR_MESSAGE_CHARS_MAX = 300
_VALIDATOR = jsonschema.Draft202012Validator

# account -> (expires at, {event type name: (validator or None, archived)})
_catalogs: dict[uuid.UUID, tuple[float, dict[str, tuple[object | None, bool]]]] = {}
# account -> the read of its catalog in flight: the creates that miss the cache at once share one read.
_reading: dict[uuid.UUID, asyncio.Task] = {}


def path_of(prefix: str, path) -> str:
    """A JSON path in the API's field style: payload.items[0].amount."""
    text = prefix
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def schema_errors(schema: object) -> list[FieldError]:
    """Why `schema` is not a JSON Schema (draft 2020-12): each error at its path under `schema`."""
    if not isinstance(schema, (dict, bool)):
        return [FieldError("schema", "must be a JSON Schema: an object or a boolean")]
    errors = sorted(_VALIDATOR(_VALIDATOR.META_SCHEMA).iter_errors(schema), key=lambda error: list(error.path))
    found = [FieldError(path_of("schema", error.path), error.message[:ERROR_MESSAGE_CHARS_MAX])
             for error in errors[:PAYLOAD_ERRORS_MAX]]
    found += [FieldError(path, "may refer only within this schema (a $ref starting with #)")
              for path in _outside_references(schema, "schema")]
    return found[:PAYLOAD_ERRORS_MAX]


def _outside_references(value: object, path: str) -> list[str]:
    """The paths of every $ref or $dynamicRef that points outside the schema (nothing is fetched)."""
    found = []
    if isinstance(value, dict):
        for name, inner in value.items():
            if name in ("$ref", "$dynamicRef") and not (isinstance(inner, str) and inner.startswith("#")):
                found.append(f"{path}.{name}")
            else:
                found += _outside_references(inner, f"{path}.{name}")
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found += _outside_references(inner, f"{path}[{index}]")
    return found


def forget(account_id: uuid.UUID) -> None:
    """This process changed the account's catalog: read it again at the next message (a read
    already in flight may have begun before the change, so it is not shared from now on)."""
    _catalogs.pop(account_id, None)
    _reading.pop(account_id, None)


async def _catalog(pool, account_id: uuid.UUID) -> dict[str, tuple[object | None, bool]]:
    cached = _catalogs.get(account_id)
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    reading = _reading.get(account_id)
    if reading is None:
        reading = _reading[account_id] = asyncio.ensure_future(_read(pool, account_id))
        reading.add_done_callback(lambda task: _reading.pop(account_id) if _reading.get(account_id) is task else None)
    return await asyncio.shield(reading)


async def _read(pool, account_id: uuid.UUID) -> dict[str, tuple[object | None, bool]]:
    started = time.monotonic()
    entries = {name: (None if schema is None else _VALIDATOR(schema), archived)
               for name, schema, archived in await store.catalog(pool, account_id)}
    if _reading.get(account_id) is asyncio.current_task():  # not forgotten meanwhile: keep it
        if len(_catalogs) >= CATALOG_CACHE_ACCOUNTS_MAX:
            _catalogs.clear()
        _catalogs[account_id] = (started + CATALOG_CACHE_SECONDS, entries)
    return entries


def channels_of(channels: list[str] | None) -> tuple[str, ...] | None:
    """A message's channels as billing takes them; 422 for one given twice."""
    if channels is None:
        return None
    if len(set(channels)) != len(channels):
        raise validation([FieldError("channels", "lists a channel twice")])
    return tuple(channels)


async def check_message(pool, account_id: uuid.UUID, event_type: str, payload: bytes) -> None:
    """422 when the account's catalog refuses the message: its type archived, or its payload
    failing its type's schema (each failing path named, at most PAYLOAD_ERRORS_MAX)."""
    entry = (await _catalog(pool, account_id)).get(event_type)
    if entry is None:
        return
    validator, archived = entry
    if archived:
        raise validation([FieldError("event_type", "is archived in the event catalog: no new messages of it")],
                         "the event type is archived")
    if validator is None:
        return
    document = msgspec.json.decode(payload)
    try:
        errors = sorted(validator.iter_errors(document), key=lambda error: list(error.absolute_path))
    except referencing.exceptions.Unresolvable as error:
        raise validation([FieldError("event_type", f"its schema refers to what it does not hold ({error})"[
            :ERROR_MESSAGE_CHARS_MAX])], "the event type's schema cannot be applied") from None
    if errors:
        raise validation([FieldError(path_of("payload", error.absolute_path), error.message[:ERROR_MESSAGE_CHARS_MAX])
                          for error in errors[:PAYLOAD_ERRORS_MAX]], "the payload does not match its event type's schema")
