"""An endpoint's custom headers (Svix's endpoint headers): what may be set, and how they are stored.

An endpoint may carry up to ENDPOINT_HEADERS_MAX headers of its own, sent with every request to
it beside the Standard Webhooks headers. They sit outside the signature, as Svix's do: the
signed content is `{webhook-id}.{webhook-timestamp}.{body}`, so a receiver cannot tell a custom
header from one added or changed on the way. They are for routing and for what sits in front of
the receiver (a gateway's token, a tenant name), never for proving who sent the request.

What may not be set, and why:
- `webhook-*` and `svix-*`: the signature's own headers, and the names receivers read them
  under (the svix libraries read `svix-id` before `webhook-id`): a custom one would make a
  receiver verify, or dedupe on, something we did not sign.
- hop-by-hop headers (RFC 7230 6.1, and `proxy-connection`, `http2-settings`): they describe
  one connection, not the request, and proxies drop or act on them.
- what frames or describes the body, or is ours to send: `content-length`, `content-type`,
  `content-encoding`, `transfer-encoding`, `expect`, `host`, `user-agent`, `accept-encoding`
  (we ask for identity, so that an answer cannot be a compression bomb).
Names are RFC 7230 tokens, unique without regard to case; values printable ASCII without CR or
LF, not starting or ending with a space (a receiver would strip it, so the value would differ).

Stored in endpoints.headers as a JSON object, NULL when there are none (so that the claim's
join returns nothing to decode for nearly every endpoint). Not encrypted: shown to the
account's keys (its API, its dashboard) and erased with the account.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Annotated

import msgspec

ENDPOINT_HEADERS_MAX = 20
HEADER_NAME_LENGTH_MAX = 64
HEADER_VALUE_LENGTH_MAX = 1024
# Every name and value together, counted as sent ("name: value"): within the 8 KiB that common
# servers take for a request's whole header block, with room for ours.
HEADERS_BYTES_MAX = 4096
# The column's CHECK (octet_length of the stored JSON): the bytes above, quoted and escaped.
STORED_BYTES_MAX = 16384
# Parsed header sets kept for the hot path; emptied when full, which costs only a parse.
PARSED_CACHED_MAX = 4096

REFUSED_PREFIXES = ("webhook-", "svix-")
HOP_BY_HOP_NAMES = frozenset((
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection", "te", "trailer",
    "transfer-encoding", "upgrade", "http2-settings",
))
PLATFORM_NAMES = frozenset((
    "content-length", "content-type", "content-encoding", "expect", "host", "user-agent", "accept-encoding",
))
REFUSED_NAMES = HOP_BY_HOP_NAMES | PLATFORM_NAMES

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")

NAME_RULE = "an RFC 7230 token (letters, digits and ! # $ % & ' * + - . ^ _ ` | ~)"
VALUE_RULE = "printable ASCII (no CR, LF or other control characters), not starting or ending with a space"
_DESCRIPTION = (
    f"Custom headers sent with every request to the endpoint, outside the signature. At most"
    f" {ENDPOINT_HEADERS_MAX}; each name {NAME_RULE} of 1 to {HEADER_NAME_LENGTH_MAX} characters, unique"
    f" without regard to case; each value {VALUE_RULE}, 1 to {HEADER_VALUE_LENGTH_MAX} characters;"
    f" {HEADERS_BYTES_MAX} bytes in all. Refused: webhook-* and svix-*, hop-by-hop headers (connection,"
    f" upgrade, ...), and {', '.join(sorted(PLATFORM_NAMES))}. null or {{}}: none."
)

# The body field's type. Only the count is left to msgspec; names and values are checked by
# `refusals`, which says what is wrong with which header. The patterns are for the document.
_Name = Annotated[str, msgspec.Meta(extra_json_schema={
    "minLength": 1, "maxLength": HEADER_NAME_LENGTH_MAX, "pattern": "^[!#$%&'*+\\-.^_`|~0-9A-Za-z]+$"})]
_Value = Annotated[str, msgspec.Meta(extra_json_schema={
    "minLength": 1, "maxLength": HEADER_VALUE_LENGTH_MAX, "pattern": "^[\\x21-\\x7e]([\\x20-\\x7e]*[\\x21-\\x7e])?$"})]
Headers = Annotated[dict[_Name, _Value], msgspec.Meta(max_length=ENDPOINT_HEADERS_MAX, description=_DESCRIPTION)]


def refusals(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """Each header refused, as (field, why), the field `headers.<name>`; empty when all may be sent."""
    found: list[tuple[str, str]] = []
    seen: set[str] = set()
    total_bytes = 0
    for name, value in headers.items():
        field = f"headers.{name[:HEADER_NAME_LENGTH_MAX]}"
        lowered = name.lower()
        if not 1 <= len(name) <= HEADER_NAME_LENGTH_MAX or not _TOKEN.fullmatch(name):
            found.append((field, f"the name must be {NAME_RULE}, 1 to {HEADER_NAME_LENGTH_MAX} characters"))
        elif lowered.startswith(REFUSED_PREFIXES):
            found.append((field, "webhook-* and svix-* headers are the signature's own; they cannot be set"))
        elif lowered in REFUSED_NAMES:
            found.append((field, f"{lowered} is set by the platform or describes the connection; it cannot be set"))
        elif lowered in seen:
            found.append((field, "given twice (names are compared without regard to case)"))
        if not isinstance(value, str) or not 1 <= len(value) <= HEADER_VALUE_LENGTH_MAX or not _VALUE.fullmatch(value):
            found.append((field, f"the value must be {VALUE_RULE}, 1 to {HEADER_VALUE_LENGTH_MAX} characters"))
        seen.add(lowered)
        total_bytes += len(name) + 2 + (len(value) if isinstance(value, str) else 0)
    if len(headers) > ENDPOINT_HEADERS_MAX:
        found.append(("headers", f"at most {ENDPOINT_HEADERS_MAX} headers"))
    if total_bytes > HEADERS_BYTES_MAX and not found:
        found.append(("headers", f"{total_bytes} bytes in all (names, values, and 2 for each ': '); at most"
                                 f" {HEADERS_BYTES_MAX}"))
    return found


def stored(headers: Mapping[str, str] | None) -> str | None:
    """The column's value: the headers as a JSON object, or NULL for none."""
    return json.dumps(dict(headers), separators=(",", ":")) if headers else None


def loaded(column: str | None) -> dict[str, str] | None:
    """The headers as stored (asyncpg hands jsonb over as its text), or None for none."""
    return None if column is None else json.loads(column)


def for_sending(column: str | None) -> Mapping[str, str] | None:
    """The headers to send, from the column's text: parsed once per distinct text (the hot path)."""
    if column is None:
        return None
    return _parsed(column)


def as_sent(column: str | None) -> str | None:
    """What an attempt records of the headers it sent (delivery_attempts.sent_headers): the column's
    text when every header in it is sent (always, for headers the API stored), else the JSON of
    those that were; None when none were."""
    if column is None:
        return None
    return _sent_text(column)


@functools.lru_cache(maxsize=PARSED_CACHED_MAX)
def _sent_text(column: str) -> str | None:
    sent = _parsed(column)
    if not sent:
        return None
    headers = json.loads(column)
    return column if len(sent) == len(headers) else stored(sent)


@functools.lru_cache(maxsize=PARSED_CACHED_MAX)
def _parsed(column: str) -> Mapping[str, str]:
    # The API stores only headers that pass `refusals`; one written past it (by hand, in SQL) is
    # left out rather than sent: it could stand in for a signature header, or make the client
    # refuse the whole request (a CR or LF), which would fail every attempt of the delivery.
    headers = json.loads(column)
    if not isinstance(headers, dict):
        return {}
    return {name: value for name, value in headers.items() if not refusals({name: value})}
