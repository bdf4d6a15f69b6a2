"""Key generation and parsing: the text formats, the accepted lengths, and the HMAC fast path."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from hypothesis import given, settings
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import strategies as st

from signing import errors
from signing.keys import (
    Ed25519SigningKey,
    Ed25519VerifyingKey,
    HmacSecret,
    generate_key_pair,
    generate_secret,
    parse_signing_key,
    parse_verifying_key,
)


def test_generated_secret_is_whsec_and_32_bytes():
    """A new secret is `whsec_` plus standard base64 of 32 random bytes, different every time."""
    secret = generate_secret()
    assert secret.startswith("whsec_")
    assert len(base64.b64decode(secret[len("whsec_") :], validate=True)) == 32
    assert generate_secret() != secret


def test_generated_key_pair_is_whsk_and_whpk_of_one_key():
    """A new pair is `whsk_` (the 32-byte seed, as Go's `ed25519.NewKeyFromSeed` reads it) and the
    matching `whpk_` (32 bytes)."""
    private_text, public_text = generate_key_pair()
    assert private_text.startswith("whsk_") and public_text.startswith("whpk_")
    seed = base64.b64decode(private_text[5:], validate=True)
    assert len(seed) == 32 and len(base64.b64decode(public_text[5:])) == 32
    # What the Go library does with a whsk_ key: derive the key pair from exactly 32 bytes.
    derived = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()
    assert derived == parse_verifying_key(public_text).raw == parse_verifying_key(private_text).raw
    assert parse_signing_key(private_text).serialize() == private_text


@pytest.mark.parametrize("byte_count", [24, 32, 48, 64])
def test_secret_lengths_from_24_to_64_bytes_parse_with_and_without_prefix(byte_count):
    """Secrets of 24 to 64 bytes parse, with the `whsec_` prefix or without, padded or not."""
    raw = bytes(range(byte_count))
    encoded = base64.b64encode(raw).decode()
    for text in (f"whsec_{encoded}", encoded, f"whsec_{encoded.rstrip('=')}"):
        parsed = parse_signing_key(text)
        assert isinstance(parsed, HmacSecret)
        assert parsed.serialize() == f"whsec_{encoded}"


@pytest.mark.parametrize(
    "text, error",
    [
        ("whsec_" + base64.b64encode(bytes(23)).decode(), errors.KeyLengthError),
        ("whsec_" + base64.b64encode(bytes(65)).decode(), errors.KeyLengthError),
        ("whsec_", errors.InvalidKeyError),
        ("whsec_not base64!", errors.InvalidKeyError),
        ("whsec_" + "A" * 300, errors.InvalidKeyError),
        ("whsk_" + base64.b64encode(bytes(31)).decode(), errors.KeyLengthError),
        ("whpk_" + base64.b64encode(bytes(32)).decode(), errors.InvalidKeyError),
        ("whsec_ü", errors.InvalidKeyError),
    ],
)
def test_bad_signing_keys_raise_invalid_key_errors(text, error):
    """Wrong lengths, non-base64, and a public key used for signing raise `InvalidKeyError`s."""
    with pytest.raises(error):
        parse_signing_key(text)


def test_ed25519_accepts_seed_and_expanded_forms_and_rejects_a_mismatched_public_half():
    """A `whsk_` key may be the 32-byte seed or seed+public; a wrong public half is refused."""
    key = Ed25519SigningKey.generate()
    expanded = base64.b64decode(key.serialize()[5:]) + key.public_key.raw
    from_seed = parse_signing_key(key.serialize())
    from_expanded = parse_signing_key("whsk_" + base64.b64encode(expanded).decode())
    assert from_seed.public_key.raw == from_expanded.public_key.raw == key.public_key.raw
    # A stored 64-byte key is written back in the seed form.
    assert from_expanded.serialize() == key.serialize()
    tampered = expanded[:32] + bytes(32)
    with pytest.raises(errors.InvalidKeyError, match="public half"):
        parse_signing_key("whsk_" + base64.b64encode(tampered).decode())


def test_a_private_key_reduces_to_its_public_half_for_verification():
    """Receivers may be handed a `whsk_` key; verification then uses only its public half."""
    private_text, public_text = generate_key_pair()
    verifying = parse_verifying_key(private_text)
    assert isinstance(verifying, Ed25519VerifyingKey)
    assert verifying.serialize() == public_text


def test_parsed_key_objects_pass_through_and_non_keys_are_refused():
    """Parsed keys are accepted as they are; anything that is neither text nor key is an error."""
    secret = HmacSecret.generate()
    assert parse_signing_key(secret) is secret
    assert parse_verifying_key(secret) is secret
    with pytest.raises(errors.InvalidKeyError):
        parse_signing_key(b"whsec_abc")  # type: ignore[arg-type]


def test_repr_never_shows_the_secret():
    """A secret in a log line or traceback shows a fingerprint, not the key."""
    secret_text = generate_secret()
    assert secret_text[6:] not in repr(parse_signing_key(secret_text))
    private_text, _public_text = generate_key_pair()
    assert private_text[5:] not in repr(parse_signing_key(private_text))


@settings(max_examples=200, deadline=None)
@given(key=st.binary(min_size=24, max_size=64), prefix=st.binary(max_size=80), body=st.binary(max_size=300))
def test_precomputed_hmac_equals_the_standard_library(key, prefix, body):
    """The precomputed-pad HMAC is exactly `hmac.new(key, prefix + body, sha256)` for every key size."""
    expected = hmac.new(key, prefix + body, hashlib.sha256).digest()
    assert HmacSecret(key).digest(prefix, body) == expected
