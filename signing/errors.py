"""One root exception for the package; each subclass's docstring is its message.

Receivers map every `VerificationError` to 401 and nothing else: a malformed header, a stale
timestamp and a wrong signature all mean "this request did not prove it came from the sender".
"""

from __future__ import annotations


class SigningError(Exception):
    """A webhook could not be signed, verified or decrypted."""

    def __init__(self, detail: str | None = None) -> None:
        # The docstring is the message, so the text a receiver logs is the text a reader finds
        # beside the class. The optional detail says which value was wrong.
        message = (self.__doc__ or type(self).__name__).strip()
        self.detail = detail
        super().__init__(f"{message} ({detail})" if detail else message)

    @property
    def reason(self) -> str:
        """The message without the detail, for a problem+json title."""
        return (self.__doc__ or type(self).__name__).strip()


# Keys and secrets.


class InvalidKeyError(SigningError):
    """The key is not a valid Standard Webhooks key (whsec_, whsk_ or whpk_ followed by base64)."""


class KeyLengthError(InvalidKeyError):
    """The key has the wrong number of bytes (secrets 24 to 64, Ed25519 seeds 32 or 64)."""


class NoKeysError(SigningError):
    """At least one key is needed to sign or verify."""


class TooManyKeysError(SigningError):
    """At most 16 keys may sign or verify at once (rotation needs two or three)."""


class InvalidWebhookIdError(SigningError):
    """The webhook id must be 1 to 256 printable ASCII characters without spaces or dots."""


class InvalidSigningTimestampError(SigningError):
    """The signing timestamp must be a non-negative integer number of unix seconds."""


# Verification: everything here means "reject with 401".


class VerificationError(SigningError):
    """The webhook did not verify."""


class MissingHeaderError(VerificationError):
    """A required header (webhook-id, webhook-timestamp or webhook-signature) is missing or empty."""


class InvalidReceivedIdError(VerificationError):
    """The webhook-id header is longer than 256 characters or holds unprintable characters."""


class InvalidTimestampError(VerificationError):
    """The webhook-timestamp header is not a non-negative integer number of seconds."""


class TimestampTooOldError(VerificationError):
    """The webhook-timestamp is older than the tolerance allows (a replay, or a slow clock)."""


class TimestampTooNewError(VerificationError):
    """The webhook-timestamp is further in the future than the tolerance allows."""


class SignatureHeaderTooLongError(VerificationError):
    """The webhook-signature header is longer, or lists more signatures, than we accept."""


class MissingCommaError(VerificationError):
    """A signature in webhook-signature has no comma between its version and its value."""


class UnknownVersionError(VerificationError):
    """No signature in webhook-signature has a version we know (v1 or v1a)."""


class InvalidBase64Error(VerificationError):
    """A signature in webhook-signature is not valid base64."""


class SignatureLengthError(VerificationError):
    """A signature has the wrong length (v1 is 32 bytes, v1a is 64 bytes)."""


class EmptyBodyError(VerificationError):
    """The request body is empty; a webhook always carries a payload."""


class NoMatchingSignatureError(VerificationError):
    """No signature in webhook-signature matches any of the keys."""


# Secrets at rest.


class AtRestError(SigningError):
    """A secret could not be encrypted or decrypted at rest."""


class InvalidKeyringError(AtRestError):
    """The keyring is malformed: expected "key_id:<base64 of 32 bytes>,..." with unique ids."""


class UnknownKeyIdError(AtRestError):
    """The ciphertext names an encryption key id that is not in the keyring."""


class MalformedCiphertextError(AtRestError):
    """The ciphertext is too short or has an unknown format version."""


class TamperedCiphertextError(AtRestError):
    """The ciphertext failed authentication: it was altered, or belongs to another record."""


# Deduplication.


class DedupeError(SigningError):
    """The deduplication store was used incorrectly."""


class InvalidTableNameError(DedupeError):
    """The table name must be a lowercase SQL identifier (optionally schema-qualified)."""


class NotInTransactionError(DedupeError):
    """The PostgreSQL claim must run inside the receiver's transaction, or it is not exactly-once."""


class ReceiptNotCommittableError(DedupeError):
    """The receipt cannot commit: a failed statement aborted the transaction, or it was deleted (use a savepoint)."""
