"""Sign and verify Standard Webhooks: `{webhook-id}.{webhook-timestamp}.{body}`.

The header format follows the public Standard Webhooks libraries; the error handling does not:
every malformed input becomes a `VerificationError` subclass, never a `ValueError` from
unpacking, and the clock is an argument so tests (and receivers with their own clock) control it.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from signing import errors
from signing.keys import (
    Ed25519SigningKey,
    Ed25519VerifyingKey,
    HmacSecret,
    SigningKey,
    VerifyingKey,
    parse_signing_key,
    parse_verifying_key,
)

TOLERANCE_SECONDS_DEFAULT = 300
WEBHOOK_ID_LENGTH_MAX = 256
TIMESTAMP_DIGITS_MAX = 12
SIGNATURE_HEADER_LENGTH_MAX = 4096
SIGNATURES_COUNT_MAX = 16
# Usable entries checked per header, and how many of them may be `v1a`. Every `v1` entry is
# compared with the same HMACs, computed once per secret; every `v1a` entry costs one hash of the
# whole body per `whpk_` key, so an unsigned request could otherwise buy 16 x keys body hashes.
# A sender signs with each active key, two or three during a rotation.
SIGNATURES_TRIED_MAX = 8
ED25519_SIGNATURES_TRIED_MAX = 4
KEYS_COUNT_MAX = 16

HMAC_VERSION = "v1"
ED25519_VERSION = "v1a"
# Versions we can check, and the decoded length each signature must have.
_SIGNATURE_BYTES = {HMAC_VERSION: 32, ED25519_VERSION: 64}

# What we send: printable ASCII without spaces or dots. The spec asks that ids carry no dot, so
# that the dot-separated signed content cannot be split in two ways.
_SENT_ID = re.compile(r"[\x21-\x2d\x2f-\x7e]{1,%d}" % WEBHOOK_ID_LENGTH_MAX)
# What we accept: other senders may use dots; the timestamp tolerance already rules out the
# re-splitting attack, which would need a timestamp made of body digits.
_RECEIVED_ID = re.compile(r"[\x21-\x7e]{1,%d}" % WEBHOOK_ID_LENGTH_MAX)
_TIMESTAMP = re.compile(r"[0-9]{1,%d}" % TIMESTAMP_DIGITS_MAX)
_HEADER_PREFIXES = ("webhook-", "svix-")

Headers = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class VerifiedWebhook:
    """What a verified request proves: the sender made this id at this time."""

    id: str
    timestamp_seconds: int


class Signer:
    """Signs with every active key: during rotation the old and the new secret both sign."""

    __slots__ = ("_hmac_secrets", "_ed25519_keys")

    def __init__(self, keys: Iterable[str | SigningKey]) -> None:
        parsed = _parse_all(keys, parse_signing_key)
        self._hmac_secrets = tuple(key for key in parsed if isinstance(key, HmacSecret))
        self._ed25519_keys = tuple(key for key in parsed if isinstance(key, Ed25519SigningKey))

    def sign(self, webhook_id: str, timestamp_seconds: int, body: bytes) -> str:
        """The `webhook-signature` header value: `v1,...` and `v1a,...` entries, space-separated."""
        signed_prefix = _signed_prefix_for_sending(webhook_id, timestamp_seconds)
        entries = [
            "v1," + _encode(secret.digest(signed_prefix, body)) for secret in self._hmac_secrets
        ]
        if self._ed25519_keys:
            message = signed_prefix + body
            entries.extend("v1a," + _encode(key.sign(message)) for key in self._ed25519_keys)
        return " ".join(entries)

    def headers(self, webhook_id: str, timestamp_seconds: int, body: bytes) -> dict[str, str]:
        """The three Standard Webhooks headers for one delivery."""
        return {
            "webhook-id": webhook_id,
            "webhook-timestamp": str(timestamp_seconds),
            "webhook-signature": self.sign(webhook_id, timestamp_seconds, body),
        }


class Verifier:
    """A receiver's trusted keys, parsed once: `whsec_` secrets and `whpk_` public keys."""

    __slots__ = ("_hmac_secrets", "_ed25519_keys")

    def __init__(self, keys: Iterable[str | SigningKey | VerifyingKey]) -> None:
        parsed = _parse_all(keys, parse_verifying_key)
        self._hmac_secrets = tuple(key for key in parsed if isinstance(key, HmacSecret))
        self._ed25519_keys = tuple(key for key in parsed if isinstance(key, Ed25519VerifyingKey))

    @classmethod
    def of(cls, keys: Verifier | str | SigningKey | VerifyingKey | Iterable[str | SigningKey | VerifyingKey]) -> Verifier:
        """`keys` itself when it is a Verifier, else a Verifier of one key or of several."""
        if isinstance(keys, Verifier):
            return keys
        if isinstance(keys, (str, HmacSecret, Ed25519SigningKey, Ed25519VerifyingKey)):
            keys = (keys,)
        return cls(keys)

    def verify(
        self,
        headers: Headers,
        body: bytes,
        *,
        tolerance_seconds: float = TOLERANCE_SECONDS_DEFAULT,
        now: float | None = None,
    ) -> VerifiedWebhook:
        """Checks the headers and body; raises a `VerificationError` subclass on any problem."""
        webhook_id, timestamp_text, signature_text = _read_headers(headers)
        timestamp_seconds = _parse_timestamp(timestamp_text)
        # Every check that costs nothing comes before any signature is decoded or computed.
        _check_tolerance(timestamp_seconds, tolerance_seconds, time.time() if now is None else now)
        if isinstance(body, str):
            # Lone surrogates cannot be valid UTF-8, but they must not crash verification.
            body = body.encode("utf-8", "surrogatepass")
        if not body:
            raise errors.EmptyBodyError()
        entries = _parse_entries(signature_text)
        signed_prefix = f"{webhook_id}.{timestamp_text}.".encode("ascii")
        if not self._matches(entries.signatures, signed_prefix, body):
            raise errors.NoMatchingSignatureError(entries.unused_detail())
        return VerifiedWebhook(webhook_id, timestamp_seconds)

    def _matches(self, signatures: tuple[tuple[str, bytes], ...], signed_prefix: bytes, body: bytes) -> bool:
        # Each expected HMAC is computed once, however many `v1` entries the header lists.
        expected_hmacs: list[bytes] | None = None
        message: bytes | None = None
        for version, signature in signatures:
            if version == HMAC_VERSION:
                if expected_hmacs is None:
                    expected_hmacs = [secret.digest(signed_prefix, body) for secret in self._hmac_secrets]
                for expected in expected_hmacs:
                    # compare_digest takes time independent of where the bytes differ, so a
                    # receiver cannot be used as an oracle to guess a signature byte by byte.
                    if hmac.compare_digest(expected, signature):
                        return True
            elif self._ed25519_keys:
                if message is None:
                    message = signed_prefix + body
                for key in self._ed25519_keys:
                    if key.verify(signature, message):
                        return True
        return False


def sign(
    webhook_id: str,
    timestamp_seconds: int,
    body: bytes,
    keys: Signer | Iterable[str | SigningKey],
) -> str:
    """The `webhook-signature` value. For many messages, build one `Signer` and reuse it."""
    signer = keys if isinstance(keys, Signer) else Signer(keys)
    return signer.sign(webhook_id, timestamp_seconds, body)


def webhook_headers(
    webhook_id: str,
    timestamp_seconds: int,
    body: bytes,
    keys: Signer | Iterable[str | SigningKey],
) -> dict[str, str]:
    """`webhook-id`, `webhook-timestamp` and `webhook-signature` for one delivery."""
    signer = keys if isinstance(keys, Signer) else Signer(keys)
    return signer.headers(webhook_id, timestamp_seconds, body)


def verify(
    headers: Headers,
    body: bytes,
    keys: Verifier | str | SigningKey | VerifyingKey | Iterable[str | SigningKey | VerifyingKey],
    *,
    tolerance_seconds: float = TOLERANCE_SECONDS_DEFAULT,
    now: float | None = None,
) -> VerifiedWebhook:
    """Verifies one request against any of `keys`; see `Verifier.verify`."""
    return Verifier.of(keys).verify(headers, body, tolerance_seconds=tolerance_seconds, now=now)


def parse_signature_header(value: str) -> tuple[tuple[str, bytes], ...]:
    """The (version, signature bytes) pairs we check, in header order; unusable entries are skipped.

    As the spec asks, each signature is tried until one matches, so one bad entry does not hide
    a good one: an unknown version (a sender may add a future one beside `v1`) and a malformed
    entry (no comma, not base64, wrong length) are skipped. At most `SIGNATURES_TRIED_MAX` usable
    entries are kept, `ED25519_SIGNATURES_TRIED_MAX` of them `v1a`; later ones are not tried.
    A header with no usable entry raises the first malformed entry's error, or
    `UnknownVersionError` when every entry had a version we do not know.
    """
    return _parse_entries(value).signatures


@dataclass(frozen=True, slots=True)
class _Entries:
    """A header's usable signatures, and what was left out of them, for the no-match detail."""

    signatures: tuple[tuple[str, bytes], ...]
    first_problem: errors.VerificationError | None
    untried_count: int

    def unused_detail(self) -> str | None:
        notes = []
        if self.untried_count:
            notes.append(
                f"{self.untried_count} not tried: at most {SIGNATURES_TRIED_MAX} are,"
                f" {ED25519_SIGNATURES_TRIED_MAX} of them v1a"
            )
        if self.first_problem is not None:
            notes.append(f"skipped: {self.first_problem}")
        return "; ".join(notes) or None


def _parse_entries(value: str) -> _Entries:
    if len(value) > SIGNATURE_HEADER_LENGTH_MAX:
        raise errors.SignatureHeaderTooLongError(f"{len(value)} characters")
    entries = value.split()
    if not entries:
        raise errors.MissingHeaderError("webhook-signature")
    if len(entries) > SIGNATURES_COUNT_MAX:
        raise errors.SignatureHeaderTooLongError(f"{len(entries)} signatures")
    signatures: list[tuple[str, bytes]] = []
    first_problem: errors.VerificationError | None = None
    untried_count = ed25519_count = 0
    for entry in entries:
        try:
            parsed = _parse_entry(entry)
        except errors.VerificationError as problem:
            first_problem = first_problem or problem
            continue
        if parsed is None:
            continue
        is_ed25519 = parsed[0] == ED25519_VERSION
        if len(signatures) == SIGNATURES_TRIED_MAX or (is_ed25519 and ed25519_count == ED25519_SIGNATURES_TRIED_MAX):
            untried_count += 1
            continue
        ed25519_count += is_ed25519
        signatures.append(parsed)
    if not signatures:
        raise first_problem or errors.UnknownVersionError(repr(value[:32]))
    return _Entries(tuple(signatures), first_problem, untried_count)


def _parse_entry(entry: str) -> tuple[str, bytes] | None:
    """One `version,base64` entry; None for a version we do not know."""
    version, comma, encoded = entry.partition(",")
    if not comma:
        raise errors.MissingCommaError(repr(entry[:16]))
    length_expected = _SIGNATURE_BYTES.get(version)
    if length_expected is None:
        return None
    signature = _decode_signature(encoded, version)
    if len(signature) != length_expected:
        raise errors.SignatureLengthError(f"{version} has {len(signature)} bytes")
    return version, signature


def _read_headers(headers: Headers) -> tuple[str, str, str]:
    """id, timestamp and signature; `svix-*` headers are read when `webhook-*` are absent."""
    for prefix in _HEADER_PREFIXES:
        signature_text = _header(headers, prefix + "signature")
        if signature_text is not None:
            break
    else:
        raise errors.MissingHeaderError("webhook-signature")
    webhook_id = _header(headers, prefix + "id")
    timestamp_text = _header(headers, prefix + "timestamp")
    for name, value in (("id", webhook_id), ("timestamp", timestamp_text), ("signature", signature_text)):
        if not isinstance(value, str) or not value:
            raise errors.MissingHeaderError(prefix + name)
    if not _RECEIVED_ID.fullmatch(webhook_id):
        raise errors.InvalidReceivedIdError(repr(webhook_id[:32]))
    return webhook_id, timestamp_text, signature_text


def _header(headers: Headers, name: str) -> object:
    """Case-insensitive lookup that is fast for aiohttp's CIMultiDict and works for plain dicts."""
    value = headers.get(name)
    if value is not None:
        return value
    for key, candidate in headers.items():
        if isinstance(key, str) and key.lower() == name:
            return candidate
    return None


def _parse_timestamp(text: str) -> int:
    # int() alone would also accept "+1", " 1", "1_000" and non-ASCII digits.
    if not _TIMESTAMP.fullmatch(text):
        raise errors.InvalidTimestampError(repr(text[:32]))
    return int(text)


def _check_tolerance(timestamp_seconds: int, tolerance_seconds: float, now: float) -> None:
    # Written as "not inside" rather than "outside" so that a NaN clock or tolerance refuses
    # the request instead of silently skipping the replay check.
    if not timestamp_seconds >= now - tolerance_seconds:
        raise errors.TimestampTooOldError(f"{now - timestamp_seconds:.0f} s old")
    if not timestamp_seconds <= now + tolerance_seconds:
        raise errors.TimestampTooNewError(f"{timestamp_seconds - now:.0f} s ahead")


def _decode_signature(encoded: str, version: str) -> bytes:
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as error:
        raise errors.InvalidBase64Error(version) from error


def _signed_prefix_for_sending(webhook_id: str, timestamp_seconds: int) -> bytes:
    if not isinstance(webhook_id, str) or not _SENT_ID.fullmatch(webhook_id):
        raise errors.InvalidWebhookIdError(repr(webhook_id)[:40])
    if type(timestamp_seconds) is not int or timestamp_seconds < 0:
        raise errors.InvalidSigningTimestampError(repr(timestamp_seconds))
    return f"{webhook_id}.{timestamp_seconds}.".encode("ascii")


def _encode(signature: bytes) -> str:
    return binascii.b2a_base64(signature, newline=False).decode("ascii")


def _parse_all(keys, parse) -> tuple:
    if isinstance(keys, (str, bytes)):
        # A lone string is a sequence of characters; treating it as one key avoids a confusing
        # "not a valid key" for each character.
        keys = (keys,)
    parsed = tuple(parse(key) for key in keys)
    if not parsed:
        raise errors.NoKeysError()
    if len(parsed) > KEYS_COUNT_MAX:
        raise errors.TooManyKeysError(f"{len(parsed)} keys")
    return parsed
