"""Standard Webhooks keys: HMAC secrets (`whsec_`) and Ed25519 key pairs (`whsk_` / `whpk_`).

Keys are parsed once into objects that carry what the hot path needs: an HMAC secret keeps its
two SHA-256 states (RFC 2104 inner and outer pads) already fed with the key, so signing a message
copies two small hash states instead of rehashing the key; an Ed25519 key keeps its loaded
`cryptography` key object. Parsing a text key is cached, so callers that hold keys as text still
pay the parse once per key, not once per message.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import secrets
from typing import Union

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from signing.errors import InvalidKeyError, KeyLengthError

HMAC_PREFIX = "whsec_"
ED25519_PRIVATE_PREFIX = "whsk_"
ED25519_PUBLIC_PREFIX = "whpk_"

SECRET_BYTES_DEFAULT = 32
SECRET_BYTES_MIN = 24
SECRET_BYTES_MAX = 64
ED25519_SEED_BYTES = 32
ED25519_PUBLIC_BYTES = 32
# libsodium's secret key form: the 32-byte seed followed by the 32-byte public key. We wrote
# `whsk_` keys this way before; they are still read, and their public half must match the seed.
ED25519_EXPANDED_BYTES = 64
KEY_TEXT_LENGTH_MAX = 256
PARSED_KEYS_CACHED_MAX = 4096

_SHA256_BLOCK_BYTES = 64
_INNER_PAD = bytes(0x36 for _ in range(_SHA256_BLOCK_BYTES))
_OUTER_PAD = bytes(0x5C for _ in range(_SHA256_BLOCK_BYTES))


class HmacSecret:
    """A symmetric `whsec_` secret; it both signs (`v1`) and verifies."""

    __slots__ = ("_key", "_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        if not SECRET_BYTES_MIN <= len(key) <= SECRET_BYTES_MAX:
            raise KeyLengthError(f"an HMAC secret has {len(key)} bytes")
        self._key = bytes(key)
        # HMAC(k, m) = H((k ^ opad) || H((k ^ ipad) || m)). Keys up to one block are used as
        # they are, padded with zeros; SECRET_BYTES_MAX equals the block size, so no key here
        # needs the hash-the-long-key step.
        padded = self._key.ljust(_SHA256_BLOCK_BYTES, b"\0")
        self._inner = hashlib.sha256(bytes(a ^ b for a, b in zip(padded, _INNER_PAD)))
        self._outer = hashlib.sha256(bytes(a ^ b for a, b in zip(padded, _OUTER_PAD)))

    @classmethod
    def generate(cls, byte_count: int = SECRET_BYTES_DEFAULT) -> HmacSecret:
        return cls(secrets.token_bytes(byte_count))

    def digest(self, signed_prefix: bytes, body: bytes) -> bytes:
        """HMAC-SHA256 of `signed_prefix + body`, without building the concatenation."""
        inner = self._inner.copy()
        inner.update(signed_prefix)
        inner.update(body)
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def serialize(self) -> str:
        return HMAC_PREFIX + base64.b64encode(self._key).decode("ascii")

    def __repr__(self) -> str:
        return f"HmacSecret(fingerprint={_fingerprint(self._key)})"


class Ed25519VerifyingKey:
    """A `whpk_` public key: verifies `v1a` signatures and cannot make them."""

    __slots__ = ("_key", "raw")

    def __init__(self, raw: bytes) -> None:
        if len(raw) != ED25519_PUBLIC_BYTES:
            raise KeyLengthError(f"an Ed25519 public key has {len(raw)} bytes")
        try:
            self._key = Ed25519PublicKey.from_public_bytes(raw)
        except ValueError as error:
            raise InvalidKeyError("not an Ed25519 public key") from error
        self.raw = bytes(raw)

    def verify(self, signature: bytes, message: bytes) -> bool:
        try:
            self._key.verify(signature, message)
        except InvalidSignature:
            return False
        return True

    def serialize(self) -> str:
        return ED25519_PUBLIC_PREFIX + base64.b64encode(self.raw).decode("ascii")

    def __repr__(self) -> str:
        return f"Ed25519VerifyingKey({self.serialize()})"


class Ed25519SigningKey:
    """A `whsk_` private key: signs `v1a`; its public half verifies."""

    __slots__ = ("_key", "_seed", "public_key")

    def __init__(self, seed: bytes) -> None:
        if len(seed) != ED25519_SEED_BYTES:
            raise KeyLengthError(f"an Ed25519 seed has {len(seed)} bytes")
        self._seed = bytes(seed)
        self._key = Ed25519PrivateKey.from_private_bytes(self._seed)
        self.public_key = Ed25519VerifyingKey(self._key.public_key().public_bytes_raw())

    @classmethod
    def generate(cls) -> Ed25519SigningKey:
        return cls(secrets.token_bytes(ED25519_SEED_BYTES))

    @classmethod
    def from_bytes(cls, raw: bytes) -> Ed25519SigningKey:
        """Accepts the 32-byte seed, or libsodium's 64-byte seed-then-public-key form."""
        if len(raw) == ED25519_SEED_BYTES:
            return cls(raw)
        if len(raw) != ED25519_EXPANDED_BYTES:
            raise KeyLengthError(f"an Ed25519 private key has {len(raw)} bytes")
        key = cls(raw[:ED25519_SEED_BYTES])
        # A 64-byte key whose public half disagrees with its seed was assembled wrongly; signing
        # with it would make signatures that its own published public key rejects.
        if key.public_key.raw != raw[ED25519_SEED_BYTES:]:
            raise InvalidKeyError("the public half of the 64-byte key does not match its seed")
        return key

    def sign(self, message: bytes) -> bytes:
        return self._key.sign(message)

    def serialize(self) -> str:
        """The 32-byte seed, as the Standard Webhooks Go library reads `whsk_` (`ed25519.NewKeyFromSeed`).

        `from_bytes` still reads the 64-byte seed-then-public form that earlier versions wrote.
        """
        return ED25519_PRIVATE_PREFIX + base64.b64encode(self._seed).decode("ascii")

    def __repr__(self) -> str:
        return f"Ed25519SigningKey(public_key={self.public_key.serialize()})"


SigningKey = Union[HmacSecret, Ed25519SigningKey]
VerifyingKey = Union[HmacSecret, Ed25519VerifyingKey]


def generate_secret(byte_count: int = SECRET_BYTES_DEFAULT) -> str:
    """A new `whsec_` secret of `byte_count` random bytes."""
    return HmacSecret.generate(byte_count).serialize()


def generate_key_pair() -> tuple[str, str]:
    """A new Ed25519 pair as (`whsk_...` of the 32-byte seed, `whpk_...` of the 32-byte public key)."""
    key = Ed25519SigningKey.generate()
    return key.serialize(), key.public_key.serialize()


def parse_signing_key(key: str | SigningKey) -> SigningKey:
    """A `whsec_` or `whsk_` key (text or already parsed); unprefixed text is an HMAC secret."""
    if isinstance(key, (HmacSecret, Ed25519SigningKey)):
        return key
    if not isinstance(key, str):
        raise InvalidKeyError(f"expected text or a parsed key, got {type(key).__name__}")
    return _parse_signing_text(key)


def parse_verifying_key(key: str | SigningKey | VerifyingKey) -> VerifyingKey:
    """A `whsec_` or `whpk_` key; a `whsk_` key is accepted and reduced to its public half."""
    if isinstance(key, (HmacSecret, Ed25519VerifyingKey)):
        return key
    if isinstance(key, Ed25519SigningKey):
        return key.public_key
    if not isinstance(key, str):
        raise InvalidKeyError(f"expected text or a parsed key, got {type(key).__name__}")
    return _parse_verifying_text(key)


@functools.lru_cache(maxsize=PARSED_KEYS_CACHED_MAX)
def _parse_signing_text(text: str) -> SigningKey:
    if text.startswith(ED25519_PUBLIC_PREFIX):
        raise InvalidKeyError("a whpk_ public key cannot sign; use its whsk_ private key")
    if text.startswith(ED25519_PRIVATE_PREFIX):
        return Ed25519SigningKey.from_bytes(_decode_key_text(text[len(ED25519_PRIVATE_PREFIX) :]))
    return HmacSecret(_decode_key_text(text.removeprefix(HMAC_PREFIX)))


@functools.lru_cache(maxsize=PARSED_KEYS_CACHED_MAX)
def _parse_verifying_text(text: str) -> VerifyingKey:
    if text.startswith(ED25519_PUBLIC_PREFIX):
        return Ed25519VerifyingKey(_decode_key_text(text[len(ED25519_PUBLIC_PREFIX) :]))
    if text.startswith(ED25519_PRIVATE_PREFIX):
        return _parse_signing_text(text).public_key
    return HmacSecret(_decode_key_text(text.removeprefix(HMAC_PREFIX)))


def _decode_key_text(text: str) -> bytes:
    """Strict base64; missing padding is tolerated because some providers strip it."""
    if not text or len(text) > KEY_TEXT_LENGTH_MAX:
        raise InvalidKeyError(f"the base64 part has {len(text)} characters")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as error:
        raise InvalidKeyError("the part after the prefix is not base64") from error


def _fingerprint(key: bytes) -> str:
    """Enough of a hash to tell keys apart in logs without revealing them."""
    return hashlib.sha256(key).hexdigest()[:12]
