"""What one HTTP attempt came back with, the same from either of the sender's clients.

A client (delivery.engine.wire_pool's, or delivery.engine.sender_aiohttp's) answers a POST with
an Answer, or with the text of its failure; the sender turns either into a SendResult. The texts
are stored in delivery_attempts.error and read by dashboards, backpressure (the connect timeout's
prefix) and tests, so both clients make them here, in one place, with one meaning.
"""

from __future__ import annotations

from typing import NamedTuple

from delivery.engine.backpressure import CONNECT_TIMEOUT_ERROR_PREFIX
from delivery.errors import AddressRefusedError

ERROR_CHARS_MAX = 512
# What delivery_attempts.status_code holds (its status_code_range CHECK); both parsers take any three digits.
STATUS_CODES_STORABLE = range(100, 600)

CONNECTION_REFUSED = "connection refused"
CONNECTION_RESET = "connection reset"
BODY_ERROR_PREFIX = "response body: "


class Answer(NamedTuple):
    """A response whose head arrived: its status (within STATUS_CODES_STORABLE), its reason
    phrase, the two headers the sender reads, and at most excerpt_bytes_max bytes of its body.
    body_error says why the body broke off (the excerpt keeps what had arrived), None when it
    was read to its end or to the excerpt's bound."""

    status_code: int
    reason: str | None
    retry_after: str | None
    date: str | None
    excerpt: bytes
    body_error: str | None


def connect_timeout_text(timeout_ms: int) -> str:
    # delivery.engine.backpressure slows the endpoint down on this prefix.
    return f"{CONNECT_TIMEOUT_ERROR_PREFIX} after {timeout_ms} ms"


def timeout_text(timeout_ms: int) -> str:
    return f"timeout after {timeout_ms} ms"


def dns_text(reason: object, host: str) -> str:
    return bounded(f"dns: {reason} (host {host})")


def tls_text(error: BaseException) -> str:
    return bounded(f"tls: {error}")


def invalid_status_text(status_code: int) -> str:
    # Not HTTP, whatever it parses as: a failed attempt without a status, like a broken connection.
    return f"invalid http status {status_code}"


def connection_error_text(error: BaseException) -> str:
    return bounded(f"connection error: {type(error).__name__}: {error}")


def refusal_text(refused: AddressRefusedError) -> str:
    return bounded(f"ssrf: address {refused.address} refused ({refused.category})")


def bounded(text: str) -> str:
    text = storable(text)
    return text if len(text) <= ERROR_CHARS_MAX else text[: ERROR_CHARS_MAX - 3] + "..."


def storable(text: str) -> str:
    """Text a receiver controls, made fit for a PostgreSQL text column: NUL (valid UTF-8, refused by
    PostgreSQL) and lone surrogates (from a surrogateescape decoding of a reason phrase, which
    cannot be encoded) become replacement characters. One unstorable answer would otherwise fail the
    transaction recording its whole batch."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    if not text.isascii():
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text
