"""The event catalog on the create path: a message of a type with a JSON Schema must pass it
(422 naming each failing path, nothing written), and a message of an archived type is refused.

Each API process keeps an account's catalog (its types that have a schema or are archived, with
their compiled validators) in an EventCatalog: one query per account, then nothing more on the
create path for accounts without schemas than a dictionary lookup. Every change, made through
whichever process, reaches every process at its commit: the writing statement NOTIFYs the
account's id (delivery.store.event_types.CHANGED_CHANNEL), and each process, listening
(delivery.api.cache_notices), drops that account's catalog. While that listening connection is
down the whole cache is emptied (a notice may have gone by unheard), and CATALOG_CACHE_SECONDS
bounds an entry's age in any case. The process that made a change also drops it itself before it
answers, so its own next request never waits on the notice.

Schemas are JSON Schema draft 2020-12 (the `jsonschema` package), checked against the metaschema
when they are written. Only local references are followed: a `$ref` to another document is
refused by the validator's registry, which retrieves nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import jsonschema
import msgspec
import referencing.exceptions

from delivery.api.problems import FieldError, validation
from delivery.store import event_types as store

logger = logging.getLogger(__name__)
# A backstop: every change is heard at its commit (above); this bounds an entry's age should one not be.
CATALOG_CACHE_SECONDS = 5.0
CATALOG_CACHE_ACCOUNTS_MAX = 10_000
PAYLOAD_ERRORS_MAX = 20
ERROR_MESSAGE_CHARS_MAX = 300
_VALIDATOR = jsonschema.Draft202012Validator


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


_Catalog = dict[str, tuple[object | None, bool]]  # event type name -> (validator or None, archived)


class EventCatalog:
    """One API process's cache of its accounts' catalogs, kept for the create path."""

    def __init__(self, pool) -> None:
        self._pool = pool
        self._catalogs: dict[uuid.UUID, tuple[float, _Catalog]] = {}  # account -> (expires at, its catalog)
        # account -> the read of its catalog in flight: the creates that miss the cache at once share one read.
        self._reading: dict[uuid.UUID, asyncio.Task] = {}

    def forget(self, account_id: uuid.UUID) -> None:
        """The account's catalog changed: read it again at the next message (a read already in
        flight may have begun before the change, so it is neither shared from now on nor kept)."""
        self._catalogs.pop(account_id, None)
        self._reading.pop(account_id, None)

    def clear(self) -> None:
        """Forget every account's catalog: a change may have gone by unheard."""
        self._catalogs.clear()
        self._reading.clear()

    def listeners(self) -> dict[str, object]:
        """The channel this cache hears changes on, with its asyncpg listener."""
        return {store.CHANGED_CHANNEL: self._on_changed}

    def _on_changed(self, connection, pid: int, channel: str, payload: str) -> None:
        try:
            account_id = uuid.UUID(payload)
        except ValueError:
            logger.warning("a malformed event catalog notice (%r): every catalog is read again", payload[:80])
            self.clear()
            return
        self.forget(account_id)

    async def check_message(self, account_id: uuid.UUID, event_type: str, payload: bytes) -> None:
        """422 when the account's catalog refuses the message: its type archived, or its payload
        failing its type's schema (each failing path named, at most PAYLOAD_ERRORS_MAX)."""
        entry = (await self._catalog(account_id)).get(event_type)
        if entry is not None:
            _check(entry, payload)

    async def _catalog(self, account_id: uuid.UUID) -> _Catalog:
        cached = self._catalogs.get(account_id)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        reading = self._reading.get(account_id)
        if reading is None:
            reading = self._reading[account_id] = asyncio.ensure_future(self._read(account_id))
            reading.add_done_callback(
                lambda task: self._reading.pop(account_id) if self._reading.get(account_id) is task else None)
        return await asyncio.shield(reading)

    async def _read(self, account_id: uuid.UUID) -> _Catalog:
        started = time.monotonic()
        entries = {name: (None if schema is None else _VALIDATOR(schema), archived)
                   for name, schema, archived in await store.catalog(self._pool, account_id)}
        if self._reading.get(account_id) is asyncio.current_task():  # not forgotten meanwhile: keep it
            if len(self._catalogs) >= CATALOG_CACHE_ACCOUNTS_MAX:
                self._catalogs.clear()
            self._catalogs[account_id] = (started + CATALOG_CACHE_SECONDS, entries)
        return entries


def channels_of(channels: list[str] | None) -> tuple[str, ...] | None:
    """A message's channels as billing takes them; 422 for one given twice."""
    if channels is None:
        return None
    if len(set(channels)) != len(channels):
        raise validation([FieldError("channels", "lists a channel twice")])
    return tuple(channels)


def _check(entry: tuple[object | None, bool], payload: bytes) -> None:
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
