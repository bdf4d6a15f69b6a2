"""Endpoint secrets encrypted at rest with AES-256-GCM, under a keyring that can rotate.

Ciphertext layout (bytes): format version (1) | key id length (1) | key id (ASCII) |
nonce (12) | AES-GCM ciphertext and tag. The key id travels with the ciphertext, so after a new
current key is added, old rows still decrypt with the key that sealed them. The version and key
id are authenticated as associated data, together with the caller's `context` (for example the
endpoint id), so a ciphertext copied onto another row fails to decrypt instead of silently
moving a secret between endpoints.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from signing import errors

FORMAT_VERSION = 1
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
KEY_ID_LENGTH_MAX = 32
KEYRING_KEYS_MAX = 16
_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,%d}" % KEY_ID_LENGTH_MAX)


@dataclass(frozen=True)
class Keyring:
    """Encryption keys by id; `current_key_id` encrypts, any key in `keys` decrypts."""

    keys: Mapping[str, bytes] = field(repr=False)
    current_key_id: str
    _ciphers: Mapping[str, AESGCM] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 1 <= len(self.keys) <= KEYRING_KEYS_MAX:
            raise errors.InvalidKeyringError(f"{len(self.keys)} keys")
        for key_id, key in self.keys.items():
            if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
                raise errors.InvalidKeyringError(f"key id {key_id!r}")
            if not isinstance(key, bytes) or len(key) != KEY_BYTES:
                raise errors.InvalidKeyringError(f"key {key_id!r} is not {KEY_BYTES} bytes")
        if self.current_key_id not in self.keys:
            raise errors.InvalidKeyringError(f"current key id {self.current_key_id!r} is not in the keyring")
        # Frozen, so the cipher objects are built once here rather than on every call.
        object.__setattr__(self, "_ciphers", {key_id: AESGCM(key) for key_id, key in self.keys.items()})


def generate_at_rest_key() -> bytes:
    """A new random 32-byte AES-256 key."""
    return secrets.token_bytes(KEY_BYTES)


def parse_keyring(text: str) -> Keyring:
    """`"k2:<base64>,k1:<base64>"`: the first key is current, the rest still decrypt."""
    keys: dict[str, bytes] = {}
    for entry in text.split(","):
        key_id, colon, encoded = entry.partition(":")
        key_id = key_id.strip()
        if not colon:
            raise errors.InvalidKeyringError(f"entry {key_id[:KEY_ID_LENGTH_MAX]!r} has no colon")
        if key_id in keys:
            raise errors.InvalidKeyringError(f"key id {key_id!r} appears twice")
        try:
            keys[key_id] = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError) as error:
            raise errors.InvalidKeyringError(f"key {key_id!r} is not base64") from error
    # Dictionaries keep insertion order, so the first key listed is the first key here.
    return Keyring(keys, current_key_id=next(iter(keys)))


def format_keyring(keyring: Keyring) -> str:
    """The text form `parse_keyring` reads, current key first."""
    order = [keyring.current_key_id] + [key_id for key_id in keyring.keys if key_id != keyring.current_key_id]
    return ",".join(f"{key_id}:{base64.b64encode(keyring.keys[key_id]).decode('ascii')}" for key_id in order)


def encrypt_secret(secret: str, keyring: Keyring, *, context: bytes = b"") -> bytes:
    """Seals `secret` under the current key; `context` must be given again to decrypt."""
    header = _header(keyring.current_key_id)
    nonce = secrets.token_bytes(NONCE_BYTES)
    sealed = keyring._ciphers[keyring.current_key_id].encrypt(nonce, secret.encode("utf-8"), header + context)
    return header + nonce + sealed


def decrypt_secret(ciphertext: bytes, keyring: Keyring, *, context: bytes = b"") -> str:
    """Opens a ciphertext from `encrypt_secret` with whichever keyring key sealed it."""
    key_id = ciphertext_key_id(ciphertext)
    cipher = keyring._ciphers.get(key_id)
    if cipher is None:
        raise errors.UnknownKeyIdError(repr(key_id))
    header_bytes = 2 + len(key_id)
    nonce = ciphertext[header_bytes : header_bytes + NONCE_BYTES]
    try:
        plaintext = cipher.decrypt(nonce, ciphertext[header_bytes + NONCE_BYTES :], ciphertext[:header_bytes] + context)
    except InvalidTag as error:
        raise errors.TamperedCiphertextError() from error
    return plaintext.decode("utf-8")


def ciphertext_key_id(ciphertext: bytes) -> str:
    """The id of the key that sealed `ciphertext`: a rotation job re-encrypts rows whose id is old."""
    ciphertext = bytes(ciphertext)
    if len(ciphertext) < 2 or ciphertext[0] != FORMAT_VERSION:
        raise errors.MalformedCiphertextError()
    key_id_length = ciphertext[1]
    if len(ciphertext) < 2 + key_id_length + NONCE_BYTES + TAG_BYTES:
        raise errors.MalformedCiphertextError(f"{len(ciphertext)} bytes")
    key_id = ciphertext[2 : 2 + key_id_length].decode("ascii", "replace")
    if not _KEY_ID.fullmatch(key_id):
        raise errors.MalformedCiphertextError("the key id is not valid")
    return key_id


def _header(key_id: str) -> bytes:
    encoded = key_id.encode("ascii")
    return bytes((FORMAT_VERSION, len(encoded))) + encoded
