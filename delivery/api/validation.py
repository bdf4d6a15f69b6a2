"""Request bodies as msgspec Structs, and the checks on query strings and path ids.

Bodies are decoded straight into these Structs with unknown fields forbidden, so validation and
the OpenAPI schemas (`openapi.py` generates them from these same classes) cannot disagree.
Malformed JSON answers 400; JSON of the wrong shape answers 422 with one error per field, every
wrong field at once, each said in words (never a regular expression). An integer field takes any
JSON number with a whole value (1, 1.0, 1e2), as JSON Schema's "integer" does, read exactly.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated

import msgspec

from billing import accounts as billing_accounts
from billing.ids import parse_id
from billing.messages import EVENT_TYPE_LENGTH_MAX
from billing.tables import (
    CHANNEL_LENGTH_MAX,
    ENDPOINT_CHANNELS_MAX,
    MESSAGE_CHANNELS_MAX,
    PAYLOAD_RETENTION_DAYS_DEFAULT,
    PAYLOAD_RETENTION_DAYS_MAX,
    PAYLOAD_RETENTION_DAYS_MIN,
    PORTAL_FRAME_ANCESTORS_MAX,
    RATE_LIMIT_PER_SECOND_MAX,
    RATE_LIMIT_PER_SECOND_MIN,
)
from delivery.api.problems import FieldError, Problem, validation
from delivery.store.endpoints import (
    DESCRIPTION_LENGTH_MAX,
    ENDPOINT_TIMEOUT_MS_MAX,
    ENDPOINT_TIMEOUT_MS_MIN,
    EVENT_TYPES_PER_ENDPOINT_MAX,
    SECRET_TEXT_LENGTH_MAX,
)
from delivery.engine.ssrf import URL_CHARS_MAX
from delivery.store.endpoint_headers import Headers
from delivery.store.signing_keys import KeyTypeField

PAGE_LIMIT_MAX = 100
PAGE_LIMIT_DEFAULT = 50
CURSOR_LENGTH_MAX = 64
BIGINT_MAX = 2**63 - 1  # PostgreSQL's bigint, the type of ledger seqs
SEQ_CURSOR_DIGITS_MAX = len(str(BIGINT_MAX))
# How deeply a message's payload may nest arrays and objects. Receivers must parse it: .NET's
# System.Text.Json refuses more than 64 levels by default (Ruby's JSON 100, serde_json 128), and
# our own decoder, bounded by Python's recursion limit, gives up near 1,000 (fewer the deeper the
# call stack it runs in). Checked on the create path for the cost of two byte counts (see
# payload_too_deep).
PAYLOAD_DEPTH_MAX = 64
PAYLOAD_TOO_DEEP = f"must not nest arrays and objects more than {PAYLOAD_DEPTH_MAX} levels deep"

# msgspec applies a pattern with re.search, where `$` also matches before a final newline ("a\n"
# would pass). `$(?!\n)` ends at the very end in Python's dialect and in ECMA-262's, the dialect of
# the OpenAPI document that shows these same patterns, so the check and the document agree.
_END = r"$(?!\n)"
# Text that lands in PostgreSQL text columns: no NUL (PostgreSQL refuses it) and, for names and
# identifiers, no control characters at all.
_NO_CONTROLS = r"^[^\u0000-\u001f\u007f]*" + _END
_NO_NUL = r"^[^\u0000]*" + _END
_IDENTIFIER = r"^[A-Za-z0-9_.:\-]+" + _END
_SECRET = r"^whsec_[A-Za-z0-9+/]+={0,2}" + _END
# What each pattern allows, in words: what a refusal says instead of the expression.
PATTERN_WORDS = {
    _IDENTIFIER: "may contain only letters, digits and _ . : - (like invoice.paid)",
    _NO_CONTROLS: "must not contain control characters (a newline, a tab, NUL)",
    _NO_NUL: "must not contain a NUL character",
    _SECRET: "must be whsec_ followed by base64 (a Standard Webhooks secret)",
}

EventType = Annotated[
    str,
    msgspec.Meta(
        min_length=1, max_length=EVENT_TYPE_LENGTH_MAX, pattern=_IDENTIFIER,
        description="Letters, digits and _ . : - (like invoice.paid).",
    ),
]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=billing_accounts.NAME_LENGTH_MAX, pattern=_NO_CONTROLS)]
Price = Annotated[int, msgspec.Meta(ge=0, le=billing_accounts.PRICE_MAX, description="Credits per delivery.")]
RetentionDays = Annotated[int, msgspec.Meta(
    ge=PAYLOAD_RETENTION_DAYS_MIN, le=PAYLOAD_RETENTION_DAYS_MAX,
    description="Days a message's payload and its attempts' response excerpts are kept once its deliveries"
                " have finished; then they are erased (the rows and the ledger stay).")]
Amount = Annotated[int, msgspec.Meta(ge=1, le=billing_accounts.AMOUNT_MAX, description="Credits.")]
Threshold = Annotated[int, msgspec.Meta(
    ge=1, le=billing_accounts.BALANCE_MAX,
    description="Credits: balance.low is sent once when the balance falls below this, and again after a top-up"
                " lifts it above; null: never.")]
# An https origin, scheme://host[:port] and nothing more: what a CSP frame-ancestors source names.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9\-]{0,61}[A-Za-z0-9])?"
_HTTPS_ORIGIN = (r"^https://" + _LABEL + r"(?:\." + _LABEL + r")*"
                 r"(?::(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]))?" + _END)
PATTERN_WORDS[_HTTPS_ORIGIN] = ("must be an https origin: https://, a host name and an optional :port, with no path,"
                                " query or trailing slash (like https://app.example.com)")
HttpsOrigin = Annotated[str, msgspec.Meta(min_length=9, max_length=300, pattern=_HTTPS_ORIGIN,
                                          description="An https origin, like https://app.example.com:8443")]
FrameAncestors = Annotated[list[HttpsOrigin], msgspec.Meta(
    max_length=PORTAL_FRAME_ANCESTORS_MAX,
    description="Origins allowed to embed the customer portal in an iframe (its CSP frame-ancestors);"
                " [] or null: none may, the default.")]
OrderId = Annotated[
    str, msgspec.Meta(min_length=1, max_length=billing_accounts.ORDER_ID_LENGTH_MAX, pattern=_IDENTIFIER)
]
Url = Annotated[str, msgspec.Meta(min_length=1, max_length=URL_CHARS_MAX)]
Description = Annotated[str, msgspec.Meta(max_length=DESCRIPTION_LENGTH_MAX, pattern=_NO_NUL)]
# A subscription: an event type, or a wildcard over a family of them ("invoice.*": every type that
# starts with "invoice.").
_SUBSCRIPTION = r"^[A-Za-z0-9_.:\-]+(?:\.\*)?" + _END
PATTERN_WORDS[_SUBSCRIPTION] = ("may contain only letters, digits and _ . : -, and may end in .* for every type that"
                                " starts with what comes before it (like invoice.*)")
Subscription = Annotated[str, msgspec.Meta(min_length=1, max_length=EVENT_TYPE_LENGTH_MAX, pattern=_SUBSCRIPTION,
                                           description="An event type, or a wildcard like invoice.*")]
Channel = Annotated[str, msgspec.Meta(min_length=1, max_length=CHANNEL_LENGTH_MAX, pattern=_IDENTIFIER,
                                      description="Letters, digits and _ . : -")]
MessageChannels = Annotated[list[Channel], msgspec.Meta(
    min_length=1, max_length=MESSAGE_CHANNELS_MAX,
    description="Only endpoints that filter on no channel, or on one of these, receive the message.")]
EndpointChannels = Annotated[list[Channel], msgspec.Meta(
    min_length=1, max_length=ENDPOINT_CHANNELS_MAX,
    description="Only messages with one of these channels; null or absent: every message.")]
EventTypes = Annotated[
    list[Subscription],
    msgspec.Meta(min_length=1, max_length=EVENT_TYPES_PER_ENDPOINT_MAX, description="null or absent: every event type."),
]
TimeoutMs = Annotated[int, msgspec.Meta(ge=ENDPOINT_TIMEOUT_MS_MIN, le=ENDPOINT_TIMEOUT_MS_MAX)]
RateLimit = Annotated[int, msgspec.Meta(
    ge=RATE_LIMIT_PER_SECOND_MIN, le=RATE_LIMIT_PER_SECOND_MAX,
    description="The most requests per second all workers together send to the endpoint; null: no limit."
                " A delivery the limit holds back waits, pending, and spends no attempt.")]
SecretText = Annotated[
    str,
    msgspec.Meta(
        min_length=10, max_length=SECRET_TEXT_LENGTH_MAX, pattern=_SECRET,
        description="A Standard Webhooks secret: whsec_ and the base64 of 24 to 64 random bytes.",
    ),
]


class AccountCreate(msgspec.Struct, forbid_unknown_fields=True):
    name: Name
    price_per_delivery: Price | None = None
    payload_retention_days: RetentionDays = PAYLOAD_RETENTION_DAYS_DEFAULT


class AccountPatch(msgspec.Struct, forbid_unknown_fields=True):
    payload_retention_days: RetentionDays | msgspec.UnsetType = msgspec.UNSET
    low_balance_threshold: Threshold | None | msgspec.UnsetType = msgspec.UNSET
    portal_frame_ancestors: FrameAncestors | None | msgspec.UnsetType = msgspec.UNSET


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
    signing_key_type: KeyTypeField | None = None  # absent: that of `secret`, else hmac
    headers: Headers | None = None
    rate_limit_per_second: RateLimit | None = None
    channels: EndpointChannels | None = None


class EndpointPatch(msgspec.Struct, forbid_unknown_fields=True):
    url: Url | msgspec.UnsetType = msgspec.UNSET
    description: Description | msgspec.UnsetType = msgspec.UNSET
    event_types: EventTypes | None | msgspec.UnsetType = msgspec.UNSET
    enabled: bool | msgspec.UnsetType = msgspec.UNSET
    timeout_ms: TimeoutMs | msgspec.UnsetType = msgspec.UNSET
    headers: Headers | None | msgspec.UnsetType = msgspec.UNSET
    rate_limit_per_second: RateLimit | None | msgspec.UnsetType = msgspec.UNSET
    channels: EndpointChannels | None | msgspec.UnsetType = msgspec.UNSET


class SecretRotate(msgspec.Struct, forbid_unknown_fields=True):
    secret: SecretText | None = None
    signing_key_type: KeyTypeField | None = None  # absent: that of `secret`, else the endpoint's current kind


class MessageCreate(msgspec.Struct, forbid_unknown_fields=True):
    event_type: EventType
    # Raw: the exact bytes of the JSON value as the sender wrote it; they are what we send.
    payload: Annotated[msgspec.Raw, msgspec.Meta(description=(
        f"Any JSON value, nesting arrays and objects at most {PAYLOAD_DEPTH_MAX} levels deep; sent byte for byte."))]
    channels: MessageChannels | None = None


REQUEST_BODIES = (AccountCreate, AccountPatch, TopupCreate, EndpointCreate, EndpointPatch, SecretRotate, MessageCreate)

_decoders: dict[type, msgspec.json.Decoder] = {}
_FIELD_AT = re.compile(r" - at `\$\.?(.*)`$")
_NAMED_FIELD = re.compile(r"field `([^`]*)`")


def decode(body: bytes, kind: type, *, optional: bool = False):
    """Decode a request body into `kind`, or raise the 400/422 Problem that says what is wrong.

    A name given twice in one object is refused (422), not settled by "the last one wins".
    """
    if optional and not body.strip():
        return kind()
    value = _decode(body, kind)
    name = _duplicate_name(body, top_level_only=False)
    if name is not None:
        raise validation([FieldError(name[:64], "given more than once")])
    return value


_MESSAGE_DECODER = msgspec.json.Decoder(MessageCreate)


def decode_message(body: bytes) -> tuple[MessageCreate, bytes]:
    """A POST /v1/messages body and its payload's bytes, or the 400/422 Problem.

    On the hot path, so the checks msgspec leaves to us are cheap: the payload is a Raw (skipped,
    not decoded), whose UTF-8 is checked here, and whose depth is bounded by two byte counts
    (payload_too_deep); and the two names are shown to be given once from the envelope alone,
    falling back to a full parse only for an envelope that is not plain. The payload's own
    objects are the sender's JSON, sent byte for byte; their names are not checked.
    """
    try:
        message = _MESSAGE_DECODER.decode(body)
    except msgspec.ValidationError as error:
        raise validation([field_error(str(error))]) from None
    except msgspec.DecodeError as error:
        raise _malformed(error) from None
    except RecursionError:  # skipping the payload, nested deeper than the decoder can follow
        raise validation([FieldError("payload", PAYLOAD_TOO_DEEP)]) from None
    payload = bytes(message.payload)
    if payload_too_deep(payload):
        raise validation([FieldError("payload", PAYLOAD_TOO_DEEP)])
    if not payload.isascii():
        try:
            payload.decode()
        except UnicodeDecodeError as error:
            raise Problem(400, f"the body is not valid JSON: the payload is not UTF-8 ({error.reason})",
                          "malformed-json") from None
    if not _plain_envelope(body, len(payload)):
        name = _duplicate_name(body, top_level_only=True)
        if name is not None:
            raise validation([FieldError(name[:64], "given more than once")])
    return message, payload


_ALL_BUT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))


def payload_too_deep(payload: bytes, depth_max: int = PAYLOAD_DEPTH_MAX) -> bool:
    """Whether `payload` (valid JSON) nests arrays and objects more than `depth_max` levels deep.

    A payload with no more than `depth_max` opening brackets in all (in strings too) cannot: two
    byte counts decide for nearly every payload. Else its strings are cut out (escaped backslashes
    and quotes dropped first, every other piece between quotes is a string) and its brackets kept;
    then each pass drops the innermost pairs, "[]", of every nest at once, so the brackets are gone
    after as many passes as the deepest nest has levels. Every step is a C loop over bytes. The two
    counts cost about 0.35 µs per KiB each; the full check, 2 ms for a 256 KiB payload made of
    36,000 arrays and objects (decoding it: 0.4 ms).
    """
    if payload.count(b"[") + payload.count(b"{") <= depth_max:
        return False
    outside_strings = b"".join(payload.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')[::2])
    brackets = outside_strings.translate(None, _ALL_BUT_BRACKETS).replace(b"{", b"[").replace(b"}", b"]")
    for passes in range(depth_max):
        if passes + len(brackets) // 2 <= depth_max:  # too few brackets left to nest deeper
            return False
        brackets = brackets.replace(b"[]", b"")
    return bool(brackets)


def _decode(body: bytes, kind: type):
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.json.Decoder(kind)
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as error:
        first = field_error(str(error))
    except msgspec.DecodeError as error:
        raise _malformed(error) from None
    # Off the hot path: read the body again as plain JSON, with whole-valued numbers as integers,
    # and either take it (1.0 for an integer) or say everything that is wrong with it at once.
    value = _plain_json(body)
    if value is _UNREADABLE:
        raise validation([first])
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError:
        pass
    raise validation(_field_errors(value, kind) or [first])


_UNREADABLE = object()
# A whole number of more digits stays a float (and is refused): int() of 1e999999999 would build a
# billion digits. 100 is far past every limit (a bigint has 19), so a range error still says the limit.
_WHOLE_DIGITS_MAX = 100


def _whole_number(text: str) -> int | float:
    """A JSON number with a fraction or an exponent: an int when its value is whole (1.0, 1e2), read exactly."""
    number = Decimal(text)
    if number == number.to_integral_value() and number.adjusted() < _WHOLE_DIGITS_MAX:
        return int(number)
    return float(text)


def _plain_json(body: bytes) -> object:
    try:
        return json.loads(body, parse_float=_whole_number)
    except (ValueError, RecursionError):  # past what Python's parser takes (an int of 5,000 digits, a deep nest)
        return _UNREADABLE


def _field_errors(value: object, kind: type) -> list[FieldError]:
    """Every field of `value` (plain JSON) that `kind` refuses, each checked alone; unknown and
    missing ones too. At most ERRORS_MAX, so a body of thousands of wrong names answers briefly."""
    if not isinstance(value, dict):
        return []
    fields = {info.encode_name: info for info in msgspec.structs.fields(kind)}
    errors = [FieldError(name[:64], _UNKNOWN_FIELD) for name in value if name not in fields]
    for name, info in fields.items():
        if name not in value:
            if info.required:
                errors.append(FieldError(name, "is required"))
            continue
        for found in _refusals(value[name], info.type):
            inner = "" if found.field == "$" else found.field
            errors.append(FieldError(name + ("" if not inner or inner.startswith("[") else ".") + inner, found.message))
    return errors[:ERRORS_MAX]


ERRORS_MAX = 20
_INDEX = re.compile(r"\[(\d+)\]")


def _refusals(value: object, kind: object) -> list[FieldError]:
    """What msgspec refuses in `value` as `kind`; past a refused item of an array, the items after it
    are checked too (msgspec stops at the first), up to ERRORS_MAX."""
    errors: list[FieldError] = []
    offset = 0
    while len(errors) < ERRORS_MAX:
        try:
            msgspec.convert(value, kind)
            return errors
        except msgspec.ValidationError as error:
            found = field_error(str(error))
        index = _INDEX.match(found.field)
        if index is None or not isinstance(value, list):
            return [*errors, found]
        position = int(index.group(1))
        errors.append(FieldError(f"[{offset + position}]{found.field[index.end():]}", found.message))
        value, offset = value[position + 1:], offset + position + 1
        if not value:
            return errors
    return errors


def _malformed(error: object) -> Problem:
    return Problem(400, f"the body is not valid JSON: {error}", "malformed-json")


# A MessageCreate body in one of its two plain layouts: the names unescaped and each once, the
# event type without escapes, whitespace anywhere between (`\s` is JSON's whitespace here: msgspec
# has already refused a \f or \v between tokens). The payload goes between head and tail.
_PLAIN_EVENT_TYPE = rb'"event_type"\s*:\s*"[A-Za-z0-9_.:\-]*"'
_HEAD_BEFORE_LAST_PAYLOAD = re.compile(rb'\{\s*' + _PLAIN_EVENT_TYPE + rb'\s*,\s*"payload"\s*:\s*').match
_TAIL_AFTER_LAST_PAYLOAD = re.compile(rb"\s*\}\s*").fullmatch
_HEAD_BEFORE_FIRST_PAYLOAD = re.compile(rb'\{\s*"payload"\s*:\s*').match
_TAIL_AFTER_FIRST_PAYLOAD = re.compile(rb"\s*,\s*" + _PLAIN_EVENT_TYPE + rb"\s*\}\s*").fullmatch


def _plain_envelope(body: bytes, payload_length: int) -> bool:
    """True when `body`, which msgspec decoded as a MessageCreate whose (last) payload is
    `payload_length` bytes, is `{"event_type": "...", "payload": P}` or `{"payload": P, "event_type": "..."}`.

    Then each name is there once: the head and tail admit no other member, and the bytes between
    them are exactly one value, the one decoded (another member there would make them longer than
    that value). Cost: two regexes over the envelope, never over the payload. False means "not
    shown" (escapes, a repeated name), and the caller parses the body to tell.
    """
    head = _HEAD_BEFORE_LAST_PAYLOAD(body)
    if head is not None:
        return _TAIL_AFTER_LAST_PAYLOAD(body, head.end() + payload_length) is not None
    head = _HEAD_BEFORE_FIRST_PAYLOAD(body)
    return head is not None and _TAIL_AFTER_FIRST_PAYLOAD(body, head.end() + payload_length) is not None


def _duplicate_name(body: bytes, *, top_level_only: bool) -> str | None:
    """The first name given twice in one object of `body` (already valid JSON to msgspec), or None."""
    found: list[str] = []

    def pairs(items: list[tuple[str, object]]) -> list:
        if not found:
            names = [name for name, _ in items]
            if len(set(names)) != len(names):
                found.append(next(name for index, name in enumerate(names) if name in names[:index]))
        return items

    try:
        if top_level_only:  # nested objects are parsed as lists of pairs and left unchecked
            pairs(json.loads(body, object_pairs_hook=lambda items: items))
        else:
            json.loads(body, object_pairs_hook=pairs)
    except (ValueError, RecursionError) as error:  # JSON msgspec skipped over, in a Raw
        raise _malformed(error) from None
    return found[0] if found else None


def field_error(message: str) -> FieldError:
    """A msgspec validation message as {field, message}, the message in words:
    'Expected `int` >= 1 - at `$.amount`' is {"amount", "must be at least 1"}."""
    location = _FIELD_AT.search(message)
    path = location.group(1) if location else ""
    text = message[: location.start()] if location else message
    named = _NAMED_FIELD.search(text)
    if named:
        path = f"{path}.{named.group(1)}" if path else named.group(1)
    return FieldError(field=path or "$", message=in_words(text))


_UNKNOWN_FIELD = "is not a field of this request"
_TYPE_WORDS = {"str": "a string", "int": "a whole number", "float": "a number with a fraction", "bool": "true or false",
               "array": "an array", "object": "an object", "null": "null", "datetime": "an RFC 3339 timestamp"}
_WORDING = (
    # msgspec quotes the pattern with its backslashes doubled.
    (re.compile(r"Expected `str` matching regex '(.*)'", re.DOTALL),
     lambda found: PATTERN_WORDS.get(found.group(1).encode().decode("unicode_escape"),
                                     "has characters that are not allowed")),
    (re.compile(r"Expected `str` of length >= 1"), lambda found: "must not be empty"),
    (re.compile(r"Expected `array` of length >= 1"), lambda found: "must not be empty"),
    (re.compile(r"Expected `str` of length >= (\d+)"), lambda found: f"must be at least {found.group(1)} characters"),
    (re.compile(r"Expected `str` of length <= (\d+)"), lambda found: f"must be at most {found.group(1)} characters"),
    (re.compile(r"Expected `array` of length >= (\d+)"), lambda found: f"must have at least {found.group(1)} items"),
    (re.compile(r"Expected `array` of length <= (\d+)"), lambda found: f"must have at most {found.group(1)} items"),
    (re.compile(r"Expected `int` >= (-?\d+)"), lambda found: f"must be at least {found.group(1)}"),
    (re.compile(r"Expected `int` <= (-?\d+)"), lambda found: f"must be at most {found.group(1)}"),
    (re.compile(r"Object missing required field `.*`"), lambda found: "is required"),
    (re.compile(r"Object contains unknown field `.*`"), lambda found: _UNKNOWN_FIELD),
    (re.compile(r"Invalid RFC3339 encoded datetime"),
     lambda found: "must be an RFC 3339 timestamp like 2026-01-31T12:00:00Z"),
    (re.compile(r"Expected `datetime` with a timezone component"),
     lambda found: "must have a timezone (Z or an offset), like 2026-01-31T12:00:00Z"),
    (re.compile(r"Expected `([^`]*)`, got `([^`]*)`"),
     lambda found: f"must be {_types_in_words(found.group(1))}, not {_types_in_words(found.group(2))}"),
)


def _types_in_words(types: str) -> str:
    return " or ".join(_TYPE_WORDS.get(name.strip(), name.strip()) for name in types.split("|"))


def in_words(message: str) -> str:
    """What a msgspec refusal means, for people: limits as numbers, patterns by what they allow."""
    for pattern, words in _WORDING:
        found = pattern.fullmatch(message)
        if found:
            return words(found)
    return message.replace("`", "")


def path_id(raw: str) -> uuid.UUID | None:
    """A path id, or None for a malformed one (the handler answers 404, as for a missing row).

    Hex digits and dashes only (billing.ids.parse_id): uuid.UUID would also take braces, a urn:
    prefix, and, through int(), spaces, control characters and underscores around the digits."""
    if len(raw) > 64:
        return None
    try:
        return parse_id(raw)
    except ValueError:
        return None


TIME_RANGE = "must be a time from 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z"


def in_utc(value: datetime) -> datetime | None:
    """`value` (with a timezone) in UTC, as the driver sends it; None when that leaves years 1 to
    9999 (0001-01-01T00:00:00+14:00 does)."""
    try:
        return value.astimezone(UTC)
    except OverflowError:
        return None


_CONTROL_CHARACTER = re.compile(r"[\x00-\x1f\x7f]")
# RFC 3339's shape, before datetime.fromisoformat reads it: that also takes week dates (2026-W01-1),
# the basic format (20260101T000000Z) and any one character between the date and the time. The
# seconds and the zone may be left out (a datetime-local input sends neither): see Query.timestamp.
_RFC_3339 = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[Tt ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,9})?)?"
                       r"(?:[Zz]|[+-][0-9]{2}:[0-9]{2})?)?")
_WHOLE_LIMIT = re.compile(r"([0-9]{1,3})(?:\.0{1,8})?")


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
        """The one value of `name`, or None. A control character refuses it: Python's parsers stop
        at a NUL (datetime.fromisoformat read "2026-01-01%0012:00:00Z" as noon) or skip others."""
        self._read.add(name)
        values = self._query.getall(name, [])
        if len(values) > 1:
            self.errors.append(FieldError(name, "given more than once"))
            return None
        if values and _CONTROL_CHARACTER.search(values[0]):
            self.errors.append(FieldError(name, "must not contain control characters (such as NUL, %00)"))
            return None
        return values[0] if values else None

    def limit(self) -> int:
        """1 to PAGE_LIMIT_MAX; a whole number written with a fraction of zeros (10.0) is that number,
        as JSON Schema's "integer" of the document allows."""
        raw = self._raw("limit")
        if raw is None:
            return PAGE_LIMIT_DEFAULT
        found = _WHOLE_LIMIT.fullmatch(raw)
        if not (found and 1 <= int(found.group(1)) <= PAGE_LIMIT_MAX):
            self.errors.append(FieldError("limit", f"must be a whole number from 1 to {PAGE_LIMIT_MAX}"))
            return PAGE_LIMIT_DEFAULT
        return int(found.group(1))

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

    def timestamp(self, name: str, *, required: bool = False, zone_required: bool = False) -> datetime | None:
        """An RFC 3339 time; without a timezone it is UTC, unless `zone_required` refuses it."""
        raw = self._raw(name)
        if raw is None:
            if required and name not in self._query:  # given but refused: _raw said why
                self.errors.append(FieldError(name, "is required"))
            return None
        try:
            # fromisoformat takes only an upper-case T and Z, which RFC 3339 lets be lower-case.
            value = datetime.fromisoformat(raw.upper()) if _RFC_3339.fullmatch(raw) else None
        except ValueError:
            value = None
        if value is None:
            self.errors.append(FieldError(name, "must be an RFC 3339 timestamp like 2026-01-31T12:00:00Z"))
            return None
        if value.tzinfo is None:
            if zone_required:
                self.errors.append(FieldError(name, "must have a timezone (Z or an offset), like 2026-01-31T12:00:00Z"))
                return None
            return value.replace(tzinfo=UTC)
        if in_utc(value) is None:
            self.errors.append(FieldError(name, TIME_RANGE))
            return None
        return value

    def cursor(self) -> str | None:
        raw = self._raw("cursor")
        if raw is not None and not (1 <= len(raw) <= CURSOR_LENGTH_MAX and raw.isascii()):
            self.errors.append(FieldError("cursor", "is not a cursor this API returned"))
            return None
        return raw

    def seq_cursor(self) -> int:
        """A cursor that is a ledger seq (a bigint): the seq to read after, 0 when none is given."""
        raw = self.cursor()
        if raw is None:
            return 0
        if raw.isascii() and raw.isdigit() and len(raw) <= SEQ_CURSOR_DIGITS_MAX and int(raw) <= BIGINT_MAX:
            return int(raw)
        self.errors.append(FieldError("cursor", "is not a cursor this API returned"))
        return 0

    def check(self) -> None:
        for name in sorted(set(self._query) - self._read):
            self.errors.append(FieldError(name[:64], "is not a query parameter of this route"))
        del self.errors[ERRORS_MAX:]
        if self.errors:
            raise validation(self.errors, "the query string is not valid")
