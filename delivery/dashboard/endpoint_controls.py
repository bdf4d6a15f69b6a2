"""The endpoint forms' controls beyond URL and event types: the rate limit, custom headers and the
signing key type, read from form text and checked by the API's own rules.

A form field is text, so each is parsed here first (an empty rate limit is no limit; headers are one
`Name: value` per line), then checked with what the API checks: the range of
billing.tables' RATE_LIMIT_PER_SECOND_MIN/MAX, delivery.store.endpoint_headers.refusals, and
delivery.store.signing_keys' kinds. Every problem found is returned as a sentence, all of them at
once, so a refused form says everything that is wrong and writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

from billing.tables import RATE_LIMIT_PER_SECOND_MAX, RATE_LIMIT_PER_SECOND_MIN
from delivery.store import endpoint_headers, signing_keys

# A form's text is bounded before it is split: far more than 20 headers of the largest size.
HEADERS_TEXT_CHARS_MAX = 2 * endpoint_headers.ENDPOINT_HEADERS_MAX * (
    endpoint_headers.HEADER_NAME_LENGTH_MAX + endpoint_headers.HEADER_VALUE_LENGTH_MAX + 4)
RATE_LIMIT_TEXT_CHARS_MAX = 32
KEY_TYPE_LABELS = {signing_keys.HMAC: "HMAC-SHA256 (whsec_ secret)", signing_keys.ED25519: "Ed25519 (whpk_ public key)"}


def rate_limit(text: object) -> tuple[int | None, list[str]]:
    """The form's rate limit per second: None for an empty field (no limit), else a whole number in range."""
    raw = text.strip() if isinstance(text, str) else ""
    if not raw:
        return None, []
    if len(raw) <= RATE_LIMIT_TEXT_CHARS_MAX and raw.isascii() and raw.isdigit():
        value = int(raw)
        if RATE_LIMIT_PER_SECOND_MIN <= value <= RATE_LIMIT_PER_SECOND_MAX:
            return value, []
    return None, [(f"Rate limit per second must be a whole number from {RATE_LIMIT_PER_SECOND_MIN} to"
                   f" {RATE_LIMIT_PER_SECOND_MAX:,}, or empty for no limit (it was “{raw[:RATE_LIMIT_TEXT_CHARS_MAX]}”)")]


def headers(text: object) -> tuple[dict[str, str] | None, list[str]]:
    """The form's custom headers, one `Name: value` per line (blank lines skipped): None when there
    are none, and every reason they are refused (then the headers are None too)."""
    raw = text if isinstance(text, str) else ""
    if len(raw) > HEADERS_TEXT_CHARS_MAX:
        return None, [f"Custom headers are longer than {HEADERS_TEXT_CHARS_MAX:,} characters"]
    parsed: dict[str, str] = {}
    errors: list[str] = []
    for number, line in enumerate(raw.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        name, colon, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if not colon or not name:
            errors.append(f"Custom headers line {number} (“{_cut(line)}”) must be written Name: value")
        elif name in parsed:
            errors.append(f"Custom header “{_cut(name)}” is given twice")
        else:
            parsed[name] = value
    for field, why in endpoint_headers.refusals(parsed):
        name = field.removeprefix("headers").removeprefix(".")
        errors.append(f"Custom header “{_cut(name)}”: {why}" if name else f"Custom headers: {why}")
    return (parsed or None) if not errors else None, errors


def headers_text(stored: Mapping[str, str] | None) -> str:
    """Headers as the form shows them: one `Name: value` per line."""
    return "\n".join(f"{name}: {value}" for name, value in (stored or {}).items())


def key_type(text: object, default: str) -> tuple[str, list[str]]:
    """The signing key type chosen (empty: `default`), one of signing_keys.KEY_TYPES."""
    raw = text.strip() if isinstance(text, str) else ""
    if not raw:
        return default, []
    if raw in signing_keys.KEY_TYPES:
        return raw, []
    return default, [f"Signing key type must be {' or '.join(signing_keys.KEY_TYPES)} (it was “{_cut(raw)}”)"]


def _cut(text: str, chars_max: int = 80) -> str:
    return text if len(text) <= chars_max else text[:chars_max] + "…"
