"""Interoperability with the public `standardwebhooks` and `svix` Python libraries, both ways.

Both reference libraries read the real clock, so these tests sign with the current time. Neither
implements Ed25519 (`v1a`): they skip such entries, which is what lets a header carry `v1` and
`v1a` signatures at once.
"""

from __future__ import annotations

import datetime
import json
import time

import pytest
import standardwebhooks
import svix.webhooks

from signing import errors
from signing.keys import generate_key_pair, generate_secret
from signing.signatures import verify, webhook_headers

BODY = json.dumps({"type": "invoice.paid", "data": {"id": "inv_1", "note": "café ☕"}}, ensure_ascii=False).encode()
WEBHOOK_ID = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"


def now_seconds() -> int:
    return int(time.time())


def as_datetime(seconds: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)


def reference_headers(signature: str, timestamp: int, prefix: str = "webhook-") -> dict[str, str]:
    return {f"{prefix}id": WEBHOOK_ID, f"{prefix}timestamp": str(timestamp), f"{prefix}signature": signature}


def test_what_we_sign_standardwebhooks_verifies():
    """A header we make with one secret passes `standardwebhooks.Webhook.verify`."""
    secret = generate_secret()
    headers = webhook_headers(WEBHOOK_ID, now_seconds(), BODY, [secret])
    assert standardwebhooks.Webhook(secret).verify(BODY, headers) == json.loads(BODY)


def test_what_we_sign_with_several_keys_standardwebhooks_verifies_for_each_secret():
    """A rotation header (two `v1` and one `v1a`) passes the reference library for either secret."""
    old_secret, new_secret = generate_secret(), generate_secret()
    private_key, _public_key = generate_key_pair()
    headers = webhook_headers(WEBHOOK_ID, now_seconds(), BODY, [old_secret, new_secret, private_key])
    assert len(headers["webhook-signature"].split(" ")) == 3
    for secret in (old_secret, new_secret):
        standardwebhooks.Webhook(secret).verify(BODY, headers)
    with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
        standardwebhooks.Webhook(generate_secret()).verify(BODY, headers)


@pytest.mark.parametrize("prefix", ["webhook-", "svix-"])
def test_what_we_sign_svix_verifies_under_either_header_prefix(prefix):
    """svix's `Webhook.verify` accepts our signature under `webhook-*` and under `svix-*` names."""
    old_secret, new_secret = generate_secret(), generate_secret()
    ours = webhook_headers(WEBHOOK_ID, now_seconds(), BODY, [old_secret, new_secret])
    headers = {name.replace("webhook-", prefix): value for name, value in ours.items()}
    for secret in (old_secret, new_secret):
        svix.webhooks.Webhook(secret).verify(BODY, headers)


def test_what_standardwebhooks_signs_we_verify():
    """A signature from `standardwebhooks.Webhook.sign` verifies with our `verify`."""
    secret = generate_secret()
    timestamp = now_seconds()
    signature = standardwebhooks.Webhook(secret).sign(WEBHOOK_ID, as_datetime(timestamp), BODY.decode())
    verified = verify(reference_headers(signature, timestamp), BODY, secret)
    assert (verified.id, verified.timestamp_seconds) == (WEBHOOK_ID, timestamp)


def test_what_svix_signs_with_several_secrets_we_verify_with_any_one():
    """Several svix `v1,` signatures joined by spaces (svix's own rotation form) verify with each key."""
    secrets = [generate_secret() for _ in range(3)]
    timestamp = now_seconds()
    signature = " ".join(
        svix.webhooks.Webhook(secret).sign(WEBHOOK_ID, as_datetime(timestamp), BODY.decode()) for secret in secrets
    )
    for prefix in ("webhook-", "svix-"):
        headers = reference_headers(signature, timestamp, prefix)
        for secret in secrets:
            assert verify(headers, BODY, [secret]).id == WEBHOOK_ID
        with pytest.raises(errors.NoMatchingSignatureError):
            verify(headers, BODY, [generate_secret()])


def test_unprefixed_and_unpadded_secrets_agree_with_the_reference():
    """A secret given without `whsec_` (as svix users sometimes paste it) signs the same for both."""
    secret = generate_secret()
    bare = secret[len("whsec_") :].rstrip("=")
    timestamp = now_seconds()
    signature = standardwebhooks.Webhook(bare).sign(WEBHOOK_ID, as_datetime(timestamp), BODY.decode())
    assert webhook_headers(WEBHOOK_ID, timestamp, BODY, [bare])["webhook-signature"] == signature
