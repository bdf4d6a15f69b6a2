"""Decrypted, parsed signing keys per endpoint, cached so the hot path signs without re-parsing.

Keyed by the ciphertexts themselves: a rotated or erased secret is a new key, so the cache can
never sign with a secret the database no longer holds. Bounded; emptied when full.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from signing import Keyring, Signer, decrypt_secret

logger = logging.getLogger(__name__)
SIGNERS_CACHED_MAX = 10_000


def endpoint_secret_context(endpoint_id: uuid.UUID) -> bytes:
    """Associated data binding a secret's ciphertext to its endpoint (a copied row won't decrypt)."""
    return b"endpoint:" + str(endpoint_id).encode()


class SignerCache:
    def __init__(self, keyring: Keyring | None, decrypt: Callable[[bytes, uuid.UUID], str] | None = None) -> None:
        self.keyring = keyring
        self._decrypt = decrypt or self._decrypt_with_keyring
        self._signers: dict[tuple, Signer | None] = {}

    def signer(self, endpoint_id: uuid.UUID, secret: bytes | None, previous_secret: bytes | None) -> Signer | None:
        """The signer for the endpoint's current (and, during rotation, previous) secret."""
        key = (endpoint_id, secret, previous_secret)
        signer = self._signers.get(key)
        if signer is None and key not in self._signers:
            if len(self._signers) >= SIGNERS_CACHED_MAX:
                self._signers.clear()
            secrets = [] if secret is None else [self._decrypt(secret, endpoint_id)]
            if previous_secret is not None:
                try:
                    secrets.append(self._decrypt(previous_secret, endpoint_id))
                except Exception as error:  # noqa: BLE001 - the current secret still signs
                    # A receiver still on the old secret fails to verify until it moves: better
                    # than sending nothing to the ones already on the new one.
                    logger.warning("endpoint %s: its previous signing secret cannot be decrypted (%r);"
                                   " signing with the current one only", endpoint_id, error)
            signer = Signer(secrets) if secrets else None
            self._signers[key] = signer
        return signer

    def _decrypt_with_keyring(self, ciphertext: bytes, endpoint_id: uuid.UUID) -> str:
        if self.keyring is None:
            raise RuntimeError("endpoint secrets are encrypted but no keyring is configured (HOOKLEDGER_SECRET_KEYS)")
        return decrypt_secret(ciphertext, self.keyring, context=endpoint_secret_context(endpoint_id))
