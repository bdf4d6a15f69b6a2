"""Property-based fuzzing of the header parser and `verify`.

Two properties: nothing but a `SigningError` subclass ever escapes, whatever the headers, body
or clock; and any single-byte change to the body, the id or the timestamp fails verification.
Example counts are bounded so the file runs in a few seconds.
"""

from __future__ import annotations

import base64

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from signing import errors
from signing.keys import generate_key_pair, generate_secret
from signing.signatures import Verifier, parse_signature_header, webhook_headers

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NOW = 1_700_000_000
SECRET = generate_secret()
PRIVATE_KEY, PUBLIC_KEY = generate_key_pair()
VERIFIER = Verifier([SECRET, PUBLIC_KEY])
# Large enough that a changed timestamp reaches the signature check instead of the clock check.
TOLERANCE_EVERYTHING_SECONDS = 10**13

header_names = st.sampled_from(
    ["webhook-id", "webhook-timestamp", "webhook-signature", "Webhook-Signature", "svix-signature", "svix-id", "x"]
)
signature_entries = st.one_of(
    st.text(max_size=40),
    st.builds(
        lambda version, value: f"{version},{value}", st.sampled_from(["v1", "v1a", "v2", ""]), st.text(max_size=100)
    ),
    st.builds(
        lambda version, raw: f"{version},{base64.b64encode(raw).decode()}",
        st.sampled_from(["v1", "v1a"]),
        st.binary(max_size=70),
    ),
)
signature_headers = st.lists(signature_entries, max_size=20).map(" ".join)
header_values = st.one_of(st.text(max_size=60), signature_headers, st.integers().map(str), st.none(), st.integers())


def verify_or_signing_error(headers, body, now=NOW, tolerance_seconds=300):
    try:
        return VERIFIER.verify(headers, body, now=now, tolerance_seconds=tolerance_seconds)
    except errors.SigningError:
        return None


@FUZZ
@given(value=st.one_of(st.text(max_size=200), signature_headers))
def test_the_signature_header_parser_raises_only_signing_errors(value):
    """Any text given to the header parser parses or raises a `SigningError` subclass."""
    try:
        parsed = parse_signature_header(value)
    except errors.SigningError:
        return
    assert all(version in ("v1", "v1a") for version, _signature in parsed)


@FUZZ
@given(
    headers=st.dictionaries(header_names, header_values, max_size=7),
    body=st.one_of(st.binary(max_size=200), st.text(max_size=50)),
    now=st.one_of(st.integers(min_value=-(2**40), max_value=2**40), st.floats()),
)
def test_verify_on_random_headers_raises_only_signing_errors(headers, body, now):
    """Random headers, bodies (bytes or text) and clocks never crash verify or verify by chance."""
    assert verify_or_signing_error(headers, body, now=now) is None


def signed_request(body: bytes, webhook_id: str = "msg_fuzz") -> dict[str, str]:
    return webhook_headers(webhook_id, NOW, body, [SECRET, PRIVATE_KEY])


@FUZZ
@given(data=st.data(), body=st.binary(min_size=1, max_size=300))
def test_mutated_signature_headers_raise_only_signing_errors(data, body):
    """Random edits of a valid signature header either still verify or raise a `SigningError`."""
    headers = signed_request(body)
    signature = headers["webhook-signature"]
    position = data.draw(st.integers(min_value=0, max_value=len(signature)))
    insert = data.draw(st.text(max_size=3))
    cut = data.draw(st.integers(min_value=0, max_value=3))
    headers["webhook-signature"] = signature[:position] + insert + signature[position + cut :]
    verify_or_signing_error(headers, body)


@FUZZ
@given(data=st.data(), body=st.binary(min_size=1, max_size=300))
def test_any_single_byte_change_to_the_body_fails(data, body):
    """Changing, inserting or deleting one body byte makes verification fail."""
    headers = signed_request(body)
    assert VERIFIER.verify(headers, body, now=NOW).id == "msg_fuzz"
    position = data.draw(st.integers(min_value=0, max_value=len(body) - 1))
    original = body[position]
    replacement = data.draw(st.integers(min_value=0, max_value=255).filter(lambda byte: byte != original))
    changed = [
        body[:position] + bytes([replacement]) + body[position + 1 :],
        body[:position] + bytes([replacement]) + body[position:],
        body[:position] + body[position + 1 :],
    ]
    for mutated in changed:
        with pytest.raises(errors.VerificationError):
            VERIFIER.verify(headers, mutated, now=NOW)


@FUZZ
@given(
    data=st.data(),
    webhook_id=st.text(
        alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters="."),
        min_size=1,
        max_size=40,
    ),
    field=st.sampled_from(["webhook-id", "webhook-timestamp"]),
)
def test_any_single_character_change_to_the_id_or_timestamp_fails(data, webhook_id, field):
    """Changing one character of the id or the timestamp fails, even with an unlimited tolerance."""
    body = b'{"type":"fuzz"}'
    headers = signed_request(body, webhook_id)
    value = headers[field]
    position = data.draw(st.integers(min_value=0, max_value=len(value) - 1))
    replacement = data.draw(st.characters(max_codepoint=0x2FF).filter(lambda character: character != value[position]))
    headers[field] = value[:position] + replacement + value[position + 1 :]
    with pytest.raises(errors.VerificationError):
        VERIFIER.verify(headers, body, now=NOW, tolerance_seconds=TOLERANCE_EVERYTHING_SECONDS)
