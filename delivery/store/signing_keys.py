"""An endpoint's signing key: its kind, a new one of a kind, and what of it is ever shown.

Two kinds, as Standard Webhooks has them:
- `hmac`: a `whsec_` secret, shared with the receiver; it signs `v1` and is shown to the account.
- `ed25519`: a `whsk_` private key, made here and sealed at rest like a secret; it signs `v1a`.
  Only its `whpk_` public key is ever shown (the API, the dashboard, a stored idempotent
  answer): a receiver that verifies with it holds nothing that could sign. The spec prefers
  this kind where receivers cannot keep a secret.

The key is chosen by the account only for `hmac` (a `whsec_` it sends, so that a retried
rotation to it changes nothing); an Ed25519 private key never leaves the platform, so it is
always generated here.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from signing import generate_key_pair, generate_secret, parse_verifying_key
from signing.keys import ED25519_PRIVATE_PREFIX, ED25519_PUBLIC_PREFIX

HMAC = "hmac"
ED25519 = "ed25519"
KEY_TYPES = (HMAC, ED25519)
KeyType = Literal["hmac", "ed25519"]
KEY_TYPE_DESCRIPTION = (
    "hmac: a whsec_ secret, signing v1 (HMAC-SHA256); ed25519: an Ed25519 key pair, signing v1a, of which"
    " only the whpk_ public key is shown."
)


def key_type_of(key: str) -> KeyType:
    """The kind of a stored key (`whsk_...` is Ed25519, anything else an HMAC secret)."""
    return ED25519 if key.startswith(ED25519_PRIVATE_PREFIX) else HMAC


def new_key(key_type: str) -> str:
    """A new signing key of the kind: a `whsec_` secret, or an Ed25519 `whsk_` private key."""
    if key_type == ED25519:
        private_key, _ = generate_key_pair()
        return private_key
    assert key_type == HMAC, f"not a signing key type: {key_type!r}"
    return generate_secret()


def shown(key: str) -> str:
    """What may be shown of a stored key: a `whsec_` secret itself, the `whpk_` of a `whsk_`."""
    if key.startswith(ED25519_PRIVATE_PREFIX):
        return parse_verifying_key(key).serialize()
    return key


def shown_key_type(shown_key: str) -> KeyType:
    """The kind of a key as shown (`whpk_...` is Ed25519)."""
    return ED25519 if shown_key.startswith(ED25519_PUBLIC_PREFIX) else HMAC


# The body field's type, with what the document says of it.
KeyTypeField = Annotated[KeyType, msgspec.Meta(description=KEY_TYPE_DESCRIPTION)]
