"""Endpoint secrets encrypted at rest: round trip, rotation, tampering, unknown keys, keyring text."""

from __future__ import annotations

import base64

import pytest

from signing import errors
from signing.at_rest import (
    Keyring,
    ciphertext_key_id,
    decrypt_secret,
    encrypt_secret,
    format_keyring,
    generate_at_rest_key,
    parse_keyring,
)
from signing.keys import generate_key_pair, generate_secret


def keyring_text(*key_ids: str) -> str:
    return ",".join(f"{key_id}:{base64.b64encode(generate_at_rest_key()).decode()}" for key_id in key_ids)


def test_round_trip_of_hmac_and_ed25519_secrets():
    """What is encrypted decrypts to the same text, and the ciphertext does not contain it."""
    keyring = parse_keyring(keyring_text("k1"))
    for secret in (generate_secret(), generate_key_pair()[0]):
        ciphertext = encrypt_secret(secret, keyring, context=b"endpoint-1")
        assert secret.encode() not in ciphertext
        assert len(ciphertext) <= 1024  # the endpoints.secret column's CHECK
        assert decrypt_secret(ciphertext, keyring, context=b"endpoint-1") == secret


def test_encrypting_twice_gives_different_ciphertexts():
    """A fresh nonce each time: equal secrets are not recognisable from their ciphertexts."""
    keyring = parse_keyring(keyring_text("k1"))
    assert encrypt_secret("whsec_same", keyring) != encrypt_secret("whsec_same", keyring)


def test_rotation_old_ciphertext_decrypts_after_a_new_current_key_is_added():
    """After "k2" becomes current, rows sealed under "k1" still decrypt; new rows use "k2"."""
    old_text = keyring_text("k1")
    old_keyring = parse_keyring(old_text)
    old_ciphertext = encrypt_secret("whsec_old", old_keyring)
    rotated = parse_keyring(keyring_text("k2") + "," + old_text)
    assert rotated.current_key_id == "k2"
    assert decrypt_secret(old_ciphertext, rotated) == "whsec_old"
    new_ciphertext = encrypt_secret("whsec_new", rotated)
    assert ciphertext_key_id(new_ciphertext) == "k2" and ciphertext_key_id(old_ciphertext) == "k1"


def test_unknown_key_id_is_reported_by_name():
    """A ciphertext sealed by a key that has left the keyring names the missing id."""
    ciphertext = encrypt_secret("whsec_x", parse_keyring(keyring_text("gone")))
    with pytest.raises(errors.UnknownKeyIdError, match="gone"):
        decrypt_secret(ciphertext, parse_keyring(keyring_text("k1")))


def test_every_single_bit_flip_is_detected():
    """Flipping any bit of the nonce, ciphertext or tag fails authentication (header bits too)."""
    keyring = parse_keyring(keyring_text("k1"))
    ciphertext = encrypt_secret("whsec_tamper", keyring)
    for position in range(len(ciphertext)):
        for bit in (0x01, 0x80):
            tampered = bytearray(ciphertext)
            tampered[position] ^= bit
            with pytest.raises(errors.AtRestError):
                decrypt_secret(bytes(tampered), keyring)


def test_context_binds_the_ciphertext_to_its_record():
    """A ciphertext copied onto another endpoint (different context) does not decrypt."""
    keyring = parse_keyring(keyring_text("k1"))
    ciphertext = encrypt_secret("whsec_bound", keyring, context=b"endpoint-1")
    with pytest.raises(errors.TamperedCiphertextError):
        decrypt_secret(ciphertext, keyring, context=b"endpoint-2")


@pytest.mark.parametrize("ciphertext", [b"", b"\x01", b"\x02\x02k1" + bytes(40), b"\x01\x02k1" + bytes(10)])
def test_malformed_ciphertexts_are_reported(ciphertext):
    """Too short or an unknown format version is `MalformedCiphertextError`, not an IndexError."""
    with pytest.raises(errors.MalformedCiphertextError):
        decrypt_secret(ciphertext, parse_keyring(keyring_text("k1")))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "k1",
        "k1:not-base64!",
        "k1:" + base64.b64encode(bytes(16)).decode(),
        "bad id:" + base64.b64encode(bytes(32)).decode(),
        "k1:{0},k1:{0}".format(base64.b64encode(bytes(32)).decode()),
    ],
)
def test_malformed_keyrings_are_refused(text):
    """Missing colon, bad base64, 16-byte keys, bad ids and repeated ids are `InvalidKeyringError`."""
    with pytest.raises(errors.InvalidKeyringError):
        parse_keyring(text)


def test_keyring_text_round_trips_and_hides_keys_in_repr():
    """`format_keyring` writes what `parse_keyring` reads, current first; repr shows no key."""
    text = keyring_text("k2", "k1")
    keyring = parse_keyring(text)
    assert format_keyring(keyring) == text
    assert parse_keyring(" k2 : " + text.split(",")[0].split(":")[1] + " ").current_key_id == "k2"
    assert text.split(",")[0].split(":")[1] not in repr(keyring)
    with pytest.raises(errors.InvalidKeyringError):
        Keyring({"k1": generate_at_rest_key()}, current_key_id="k9")
