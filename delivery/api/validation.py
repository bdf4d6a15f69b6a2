"""Request bodies as msgspec Structs, and the checks on query strings and path ids.

Bodies are decoded straight into these Structs with unknown fields forbidden, so validation and
the OpenAPI schemas (`openapi.py` generates them from these same classes) cannot disagree.
Malformed JSON answers 400; JSON of the wrong shape answers 422 with one error per field.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Annotated

import msgspec

from billing import accounts as billing_accounts
from billing.messages import EVENT_TYPE_LENGTH_MAX
from delivery.api.problems import FieldError, Problem, validation
from delivery.endpoints import (
    DESCRIPTION_LENGTH_MAX,
    ENDPOINT_TIMEOUT_MS_MAX,
    ENDPOINT_TIMEOUT_MS_MIN,
    EVENT_TYPES_PER_ENDPOINT_MAX,
    SECRET_TEXT_LENGTH_MAX,
)
from delivery.ssrf import URL_CHARS_MAX

PAGE_LIMIT_MAX = 100
PAGE_LIMIT_DEFAULT = 50
CURSOR_LENGTH_MAX = 64

# Text that lands in PostgreSQL text columns: no NUL (PostgreSQL refuses it) and, for names and
# identifiers, no control characters at all.
_NO_CONTROLS = r"^[^\u0000-\u001f\u007f]*$"
_NO_NUL = r"^[^\u0000]*$"

EventType = Annotated[
    str,
    msgspec.Meta(
        min_length=1, max_length=EVENT_TYPE_LENGTH_MAX, pattern=r"^[A-Za-z0-9_.:\-]+$",
        description="Letters, digits and _ . : - (like invoice.paid).",
    ),
]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=billing_accounts.NAME_LENGTH_MAX, pattern=_NO_CONTROLS)]
Price = Annotated[int, msgspec.Meta(ge=0, le=billing_accounts.PRICE_MAX, description="Credits per delivery.")]
Amount = Annotated[int, msgspec.Meta(ge=1, le=billing_accounts.AMOUNT_MAX, description="Credits.")]
OrderId = Annotated[
    str, msgspec.Meta(min_length=1, max_length=billing_accounts.ORDER_ID_LENGTH_MAX, pattern=r"^[A-Za-z0-9_.:\-]+$")
]
Url = Annotated[str, msgspec.Meta(min_length=1, max_length=URL_CHARS_MAX)]
Description = Annotated[str, msgspec.Meta(max_length=DESCRIPTION_LENGTH_MAX, pattern=_NO_NUL)]
EventTypes = Annotated[
    list[EventType],
    msgspec.Meta(min_length=1, max_length=EVENT_TYPES_PER_ENDPOINT_MAX, description="null or absent: every event type."),
]
TimeoutMs = Annotated[int, msgspec.Meta(ge=ENDPOINT_TIMEOUT_MS_MIN, le=ENDPOINT_TIMEOUT_MS_MAX)]
SecretText = Annotated[
    str,
    msgspec.Meta(
        min_length=10, max_length=SECRET_TEXT_LENGTH_MAX, pattern=r"^whsec_[A-Za-z0-9+/]+={0,2}$",
        description="A Standard Webhooks secret: whsec_ and the base64 of 24 to 64 random bytes.",
    ),
]


class AccountCreate(msgspec.Struct, forbid_unknown_fields=True):
    name: Name
    price_per_delivery: Price | None = None


class TopupCreate(msgspec.Struct, forbid_unknown_fields=True):
    order_id: OrderId
    amount: Amount


class Empty(msgspec.Struct, forbid_unknown_fields=True):
    """A body that must be absent or an empty object."""


class EndpointCreate(msgspec.Struct, forbid_unknown_fields=True):
    url: Url
    description: Description = ""
    event_types: EventTypes | None = None
    timeout_ms: TimeoutMs = 15_000
    enabled: bool = True
    secret: SecretText | None = None


class EndpointPatch(msgspec.Struct, forbid_unknown_fields=True):
    url: Url | msgspec.UnsetType = msgspec.UNSET
    description: Description | msgspec.UnsetType = msgspec.UNSET
    event_types: EventTypes | None | msgspec.UnsetType = msgspec.UNSET
    enabled: bool | msgspec.UnsetType = msgspec.UNSET
    timeout_ms: TimeoutMs | msgspec.UnsetType = msgspec.UNSET


class SecretRotate(msgspec.Struct, forbid_unknown_fields=True):
    secret: SecretText | None = None


class MessageCreate(msgspec.Struct, forbid_unknown_fields=True):
    event_type: EventType
    # Raw: the exact bytes of the JSON value as the sender wrote it; they are what we send.
    payload: Annotated[msgspec.Raw, msgspec.Meta(description="Any JSON value; sent byte for byte.")]


REQUEST_BODIES = (AccountCreate, TopupCreate, EndpointCreate, EndpointPatch, SecretRotate, MessageCreate)

_decoders: dict[type, msgspec.json.Decoder] = {}
_FIELD_AT = re.compile(r" - at `\$\.?(.*)`$")
_NAMED_FIELD = re.compile(r"field `([^`]*)`")


def decode(body: bytes, kind: type, *, optional: bool = False):
    """Decode a request body into `kind`, or raise the 400/422 Problem that says what is wrong."""
    if optional and not body.strip():
        return kind()
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as error:
        raise validation([field_error(str(error))]) from None
    except msgspec.DecodeError as error:
        raise Problem(400, f"the body is not valid JSON: {error}", "malformed-json") from None


def field_error(message: str) -> FieldError:
    """A msgspec validation message as {field, message}: 'Expected `int`, got `str` - at `$.amount`'."""
    location = _FIELD_AT.search(message)
    path = location.group(1) if location else ""
    text = message[: location.start()] if location else message
    named = _NAMED_FIELD.search(text)
    if named:
        path = f"{path}.{named.group(1)}" if path else named.group(1)
    return FieldError(field=path or "$", message=text)


def path_id(raw: str) -> uuid.UUID | None:
    """A path id, or None for a malformed one (the handler answers 404, as for a missing row)."""
    if len(raw) > 64:
        return None
    try:
        return uuid.UUID(raw)
    except ValueError:
        return None


class Query:
    """Query-string parameters, collecting every error before answering 422 once.

    Like body fields, a parameter the route does not read is refused, not ignored: a typo in a
    filter (`?stat=dead`) would otherwise silently return everything.
    """

    def __init__(self, query) -> None:
        self._query = query
        self._read: set[str] = set()
        self.errors: list[FieldError] = []

    def _raw(self, name: str) -> str | None:
        self._read.add(name)
        values = self._query.getall(name, [])
        if len(values) > 1:
            self.errors.append(FieldError(name, "given more than once"))
            return None
        return values[0] if values else None

    def limit(self) -> int:
        raw = self._raw("limit")
        if raw is None:
            return PAGE_LIMIT_DEFAULT
        if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= PAGE_LIMIT_MAX:
            self.errors.append(FieldError("limit", f"must be an integer from 1 to {PAGE_LIMIT_MAX}"))
            return PAGE_LIMIT_DEFAULT
        return int(raw)

    def uuid(self, name: str) -> uuid.UUID | None:
        raw = self._raw(name)
        if raw is None:
            return None
        value = path_id(raw)
        if value is None:
            self.errors.append(FieldError(name, "must be a UUID"))
        return value

    def choice(self, name: str, choices: tuple[str, ...]) -> str | None:
        raw = self._raw(name)
        if raw is not None and raw not in choices:
            self.errors.append(FieldError(name, f"must be one of {', '.join(choices)}"))
            return None
        return raw

    def timestamp(self, name: str) -> datetime | None:
        raw = self._raw(name)
        if raw is None:
            return None
        try:
            value = datetime.fromisoformat(raw) if len(raw) <= 64 else None
        except ValueError:
            value = None
        if value is None:
            self.errors.append(FieldError(name, "must be an RFC 3339 timestamp like 2026-01-31T12:00:00Z"))
            return None
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)

    def cursor(self) -> str | None:
        raw = self._raw("cursor")
        if raw is not None and not (1 <= len(raw) <= CURSOR_LENGTH_MAX and raw.isascii()):
            self.errors.append(FieldError("cursor", "is not a cursor this API returned"))
            return None
        return raw

    def check(self) -> None:
        for name in sorted(set(self._query) - self._read):
            self.errors.append(FieldError(name[:64], "is not a query parameter of this route"))
        if self.errors:
            raise validation(self.errors, "the query string is not valid")
