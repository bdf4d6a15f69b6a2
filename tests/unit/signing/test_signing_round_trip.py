"""Sign then verify: HMAC, Ed25519, both at once, rotation, tolerance, and each malformed input."""

from __future__ import annotations

import base64
import inspect
import re

import pytest

import signing
from signing import errors
from signing.keys import Ed25519VerifyingKey, generate_key_pair, generate_secret
from signing.signatures import Signer, Verifier, parse_signature_header, sign, verify, webhook_headers

NOW = 1_700_000_000
BODY = b'{"type":"invoice.paid","data":{"id":"inv_1","amount":1200}}'
WEBHOOK_ID = "0b2c6a4e-1111-2222-3333-444455556666"


def headers_for(keys, *, webhook_id=WEBHOOK_ID, timestamp=NOW, body=BODY):
    return webhook_headers(webhook_id, timestamp, body, keys)


def test_hmac_round_trip():
    """A `v1` signature made with a secret verifies with that secret and returns id and time."""
    secret = generate_secret()
    headers = headers_for([secret])
    assert headers["webhook-signature"].startswith("v1,")
    verified = verify(headers, BODY, secret, now=NOW)
    assert (verified.id, verified.timestamp_seconds) == (WEBHOOK_ID, NOW)


def test_ed25519_round_trip():
    """A `v1a` signature made with `whsk_` verifies with the matching `whpk_` alone."""
    private_key, public_key = generate_key_pair()
    headers = headers_for([private_key])
    assert headers["webhook-signature"].startswith("v1a,")
    assert verify(headers, BODY, public_key, now=NOW).id == WEBHOOK_ID


def test_hmac_and_ed25519_together_each_verify_alone():
    """With both kinds signing, a receiver holding either key (or both) verifies."""
    secret = generate_secret()
    private_key, public_key = generate_key_pair()
    headers = headers_for([secret, private_key])
    versions = [entry.split(",")[0] for entry in headers["webhook-signature"].split(" ")]
    assert versions == ["v1", "v1a"]
    for keys in ([secret], [public_key], [secret, public_key]):
        assert verify(headers, BODY, keys, now=NOW).id == WEBHOOK_ID


def test_rotation_old_and_new_secrets_both_sign_and_either_receiver_verifies():
    """During rotation both secrets sign; a receiver with only the old or only the new verifies."""
    old_secret, new_secret = generate_secret(), generate_secret()
    headers = headers_for([old_secret, new_secret])
    assert len(headers["webhook-signature"].split(" ")) == 2
    assert verify(headers, BODY, [old_secret], now=NOW).id == WEBHOOK_ID
    assert verify(headers, BODY, [new_secret], now=NOW).id == WEBHOOK_ID
    with pytest.raises(errors.NoMatchingSignatureError):
        verify(headers, BODY, [generate_secret()], now=NOW)


def test_rotation_after_the_old_secret_expires_only_the_new_one_verifies():
    """Once only the new secret signs, a receiver still holding just the old secret is refused."""
    old_secret, new_secret = generate_secret(), generate_secret()
    headers = headers_for([new_secret])
    with pytest.raises(errors.NoMatchingSignatureError):
        verify(headers, BODY, [old_secret], now=NOW)
    assert verify(headers, BODY, [old_secret, new_secret], now=NOW).id == WEBHOOK_ID


def test_signer_is_reusable_and_matches_the_function():
    """A cached `Signer` gives the same header as `sign` with the key text."""
    secret = generate_secret()
    signer = Signer([secret])
    assert signer.sign(WEBHOOK_ID, NOW, BODY) == sign(WEBHOOK_ID, NOW, BODY, [secret])
    assert sign(WEBHOOK_ID, NOW, BODY, signer) == signer.sign(WEBHOOK_ID, NOW, BODY)
    assert signer.headers(WEBHOOK_ID, NOW, BODY)["webhook-timestamp"] == str(NOW)


def test_header_names_are_case_insensitive_and_svix_headers_are_read():
    """Plain dicts with any case work, and `svix-*` headers are read when `webhook-*` are absent."""
    secret = generate_secret()
    headers = headers_for([secret])
    shouted = {name.upper(): value for name, value in headers.items()}
    assert verify(shouted, BODY, secret, now=NOW).id == WEBHOOK_ID
    svix_style = {name.replace("webhook-", "Svix-"): value for name, value in headers.items()}
    assert verify(svix_style, BODY, secret, now=NOW).id == WEBHOOK_ID


@pytest.mark.parametrize(
    "now, error",
    [
        (NOW + 300, None),
        (NOW - 300, None),
        (NOW + 301, errors.TimestampTooOldError),
        (NOW - 301, errors.TimestampTooNewError),
    ],
)
def test_timestamp_tolerance_is_300_seconds_both_ways(now, error):
    """The default tolerance accepts exactly 300 s of skew in either direction, not 301."""
    secret = generate_secret()
    headers = headers_for([secret])
    if error is None:
        verify(headers, BODY, secret, now=now)
    else:
        with pytest.raises(error):
            verify(headers, BODY, secret, now=now)


def test_a_nan_clock_refuses_instead_of_skipping_the_replay_check():
    """A broken clock (NaN) must not turn the tolerance check off."""
    secret = generate_secret()
    with pytest.raises(errors.TimestampTooOldError):
        verify(headers_for([secret]), BODY, secret, now=float("nan"))


def test_tolerance_is_configurable():
    """A receiver may choose its own tolerance in seconds."""
    secret = generate_secret()
    headers = headers_for([secret])
    verify(headers, BODY, secret, now=NOW + 3600, tolerance_seconds=3600)
    with pytest.raises(errors.TimestampTooOldError):
        verify(headers, BODY, secret, now=NOW + 11, tolerance_seconds=10)


SECRET = generate_secret()
GOOD = webhook_headers(WEBHOOK_ID, NOW, BODY, [SECRET])
GOOD_SIGNATURE = GOOD["webhook-signature"]


def with_header(name, value):
    headers = dict(GOOD)
    if value is None:
        del headers[name]
    else:
        headers[name] = value
    return headers


@pytest.mark.parametrize(
    "headers, body, error",
    [
        (with_header("webhook-id", None), BODY, errors.MissingHeaderError),
        (with_header("webhook-timestamp", None), BODY, errors.MissingHeaderError),
        (with_header("webhook-signature", None), BODY, errors.MissingHeaderError),
        (with_header("webhook-id", ""), BODY, errors.MissingHeaderError),
        (with_header("webhook-signature", "   "), BODY, errors.MissingHeaderError),
        (with_header("webhook-id", "x" * 257), BODY, errors.InvalidReceivedIdError),
        (with_header("webhook-id", "has space"), BODY, errors.InvalidReceivedIdError),
        (with_header("webhook-id", "ünicode"), BODY, errors.InvalidReceivedIdError),
        (with_header("webhook-timestamp", "soon"), BODY, errors.InvalidTimestampError),
        (with_header("webhook-timestamp", "-1"), BODY, errors.InvalidTimestampError),
        (with_header("webhook-timestamp", "1.5"), BODY, errors.InvalidTimestampError),
        (with_header("webhook-timestamp", "1_700_000_000"), BODY, errors.InvalidTimestampError),
        (with_header("webhook-timestamp", "١٧٠٠٠٠٠٠٠٠"), BODY, errors.InvalidTimestampError),
        (with_header("webhook-timestamp", "9" * 13), BODY, errors.InvalidTimestampError),
        (with_header("webhook-timestamp", str(NOW - 1000)), BODY, errors.TimestampTooOldError),
        (with_header("webhook-timestamp", str(NOW + 1000)), BODY, errors.TimestampTooNewError),
        (with_header("webhook-signature", GOOD_SIGNATURE.replace(",", "")), BODY, errors.MissingCommaError),
        (with_header("webhook-signature", "v2," + GOOD_SIGNATURE[3:]), BODY, errors.UnknownVersionError),
        (with_header("webhook-signature", "v1,@@@@"), BODY, errors.InvalidBase64Error),
        (with_header("webhook-signature", "v1,AAAA"), BODY, errors.SignatureLengthError),
        (with_header("webhook-signature", "v1a," + GOOD_SIGNATURE[3:]), BODY, errors.SignatureLengthError),
        (with_header("webhook-signature", "v1,ü"), BODY, errors.InvalidBase64Error),
        (with_header("webhook-signature", "v1,x " * 17), BODY, errors.SignatureHeaderTooLongError),
        (with_header("webhook-signature", "v1," + "A" * 5000), BODY, errors.SignatureHeaderTooLongError),
        (GOOD, b"", errors.EmptyBodyError),
        (GOOD, BODY + b" ", errors.NoMatchingSignatureError),
        (with_header("webhook-id", WEBHOOK_ID + "x"), BODY, errors.NoMatchingSignatureError),
        (with_header("webhook-timestamp", str(NOW + 1)), BODY, errors.NoMatchingSignatureError),
    ],
)
def test_each_malformed_input_raises_its_own_verification_error(headers, body, error):
    """Every kind of bad header or body raises its own `VerificationError` subclass, nothing else."""
    with pytest.raises(error) as raised:
        verify(headers, body, SECRET, now=NOW)
    assert isinstance(raised.value, errors.VerificationError)
    assert str(raised.value).startswith(error.__doc__.strip())


def test_unknown_versions_beside_a_known_one_are_skipped():
    """A future version listed beside `v1` does not break verification (forward compatibility)."""
    headers = with_header("webhook-signature", "v9,whatever " + GOOD_SIGNATURE)
    assert verify(headers, BODY, SECRET, now=NOW).id == WEBHOOK_ID
    assert [version for version, _ in parse_signature_header(headers["webhook-signature"])] == ["v1"]


@pytest.mark.parametrize(
    "bad_entry",
    ["junk", "v1,@@@@", "v1,AAAA", "v1a,AAAA", "v1a," + GOOD_SIGNATURE[3:]],
    ids=["no comma", "not base64", "short v1", "short v1a", "v1a of v1 length"],
)
def test_a_malformed_entry_beside_a_valid_signature_is_skipped(bad_entry):
    """The spec tries each signature until one matches: a malformed entry before or after the
    valid one is skipped; alone, it still raises its own error, and beside a wrong signature it
    is named in the no-match detail."""
    for value in (f"{bad_entry} {GOOD_SIGNATURE}", f"{GOOD_SIGNATURE} {bad_entry}"):
        assert verify(with_header("webhook-signature", value), BODY, SECRET, now=NOW).id == WEBHOOK_ID
    with pytest.raises(errors.VerificationError) as alone:
        verify(with_header("webhook-signature", bad_entry), BODY, SECRET, now=NOW)
    assert not isinstance(alone.value, errors.NoMatchingSignatureError)
    with pytest.raises(errors.NoMatchingSignatureError, match=re.escape(f"skipped: {alone.value.reason}")):
        verify(with_header("webhook-signature", f"{bad_entry} {GOOD_SIGNATURE}"), BODY + b" ", SECRET, now=NOW)


def test_signatures_tried_per_header_are_capped_so_forged_v1a_entries_cost_little(monkeypatch):
    """16 forged `v1a` entries against 2 `whpk_` keys check at most 4 of them (8 body hashes, not
    32); a valid `v1a` past the fourth is not tried, and the detail says so; a valid `v1` after
    them still is (HMACs are computed once, whatever the count)."""
    private_key, public_key = generate_key_pair()
    keys = [public_key, generate_key_pair()[1], SECRET]
    valid_v1a = headers_for([private_key])["webhook-signature"]
    forged = " ".join("v1a," + base64.b64encode(bytes([n]) * 64).decode() for n in range(15))
    checks = []
    real_verify = Ed25519VerifyingKey.verify
    monkeypatch.setattr(Ed25519VerifyingKey, "verify", lambda key, *args: checks.append(1) or real_verify(key, *args))
    with pytest.raises(errors.NoMatchingSignatureError, match="12 not tried: at most 8 are, 4 of them v1a"):
        verify(with_header("webhook-signature", f"{forged} {valid_v1a}"), BODY, keys, now=NOW)
    assert len(checks) == 4 * 2
    assert verify(with_header("webhook-signature", f"{forged} {GOOD_SIGNATURE}"), BODY, keys, now=NOW)
    assert verify(with_header("webhook-signature", f"{valid_v1a} {forged}"), BODY, keys, now=NOW)


def test_the_timestamp_is_checked_before_the_signatures():
    """A stale request is refused for its timestamp before its signature header is even parsed."""
    stale = dict(GOOD, **{"webhook-timestamp": str(NOW - 1000), "webhook-signature": "junk"})
    with pytest.raises(errors.TimestampTooOldError):
        verify(stale, BODY, SECRET, now=NOW)


def test_hmac_signatures_do_not_verify_with_public_keys_and_vice_versa():
    """A `v1` header against only `whpk_` keys, or `v1a` against only secrets, is no match."""
    private_key, public_key = generate_key_pair()
    with pytest.raises(errors.NoMatchingSignatureError):
        verify(GOOD, BODY, public_key, now=NOW)
    with pytest.raises(errors.NoMatchingSignatureError):
        verify(headers_for([private_key]), BODY, SECRET, now=NOW)


@pytest.mark.parametrize(
    "webhook_id, timestamp, error",
    [
        ("with.dot", NOW, errors.InvalidWebhookIdError),
        ("", NOW, errors.InvalidWebhookIdError),
        ("line\nbreak", NOW, errors.InvalidWebhookIdError),
        (WEBHOOK_ID, -1, errors.InvalidSigningTimestampError),
        (WEBHOOK_ID, 1.5, errors.InvalidSigningTimestampError),
    ],
)
def test_signing_refuses_ids_and_timestamps_that_would_sign_ambiguous_content(webhook_id, timestamp, error):
    """Sending ids never carry dots or whitespace (header injection, ambiguous split); times are ints."""
    with pytest.raises(error):
        sign(webhook_id, timestamp, BODY, [SECRET])


def test_no_keys_is_an_error_on_both_sides():
    """An empty key list is a configuration mistake, reported as such rather than "no match"."""
    with pytest.raises(errors.NoKeysError):
        Signer([])
    with pytest.raises(errors.NoKeysError):
        Verifier([])


def test_every_error_is_a_signing_error_with_a_docstring_message():
    """Each exception class descends from `SigningError` and its docstring is its message."""
    classes = [value for _, value in inspect.getmembers(errors, inspect.isclass) if issubclass(value, Exception)]
    assert len(classes) > 20
    for error_class in classes:
        assert issubclass(error_class, errors.SigningError)
        assert error_class.__doc__ and str(error_class()) == error_class.__doc__.strip()
    assert str(errors.MissingHeaderError("webhook-id")).endswith("(webhook-id)")


def test_public_api_is_exported():
    """The package root re-exports everything a sender or receiver needs."""
    for name in signing.__all__:
        assert getattr(signing, name) is not None
    assert base64.b64decode(signing.sign(WEBHOOK_ID, NOW, BODY, [SECRET])[3:])
