#!/usr/bin/env python
"""Signs and verifies per second, ours beside the public `standardwebhooks` library, same run.

HMAC (`v1`) is compared with `standardwebhooks.Webhook`. That library has no Ed25519 (`v1a`),
so Ed25519 is compared with our own HMAC, to show what choosing asymmetric keys costs.
The body is a realistic 1 KiB JSON event. Prints a table; writes no files.

    .venv/bin/python scripts/bench_signing.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from collections.abc import Callable
from pathlib import Path

import standardwebhooks

from signing import Signer, Verifier, generate_key_pair, generate_secret

BATCH_CALLS = 1000
BODY_BYTES = 1024
WEBHOOK_ID = "0b2c6a4e-5f1d-4c8e-9a3b-7d6e5f4a3b2c"


def realistic_body() -> bytes:
    """A minified JSON event padded to exactly BODY_BYTES with a description field."""
    event = {
        "type": "invoice.payment_succeeded",
        "timestamp": "2024-05-01T12:34:56.789012Z",
        "data": {
            "id": "in_1P9xYz2eZvKYlo2C",
            "customer": "cus_Q1w2E3r4T5y6",
            "amount_paid": 4200,
            "currency": "eur",
            "lines": [{"id": f"il_{n}", "amount": 1050, "quantity": 1, "price": "price_basic"} for n in range(4)],
            "description": "",
        },
    }
    filler_bytes = BODY_BYTES - len(json.dumps(event, separators=(",", ":")).encode())
    event["data"]["description"] = "x" * filler_bytes
    body = json.dumps(event, separators=(",", ":")).encode()
    assert len(body) == BODY_BYTES
    return body


def rate_per_second(operation: Callable[[], object], seconds: float) -> float:
    """Calls `operation` in batches until `seconds` have passed; returns calls per second."""
    operation()  # warm up caches and lazy imports outside the timed part
    calls = 0
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        for _ in range(BATCH_CALLS):
            operation()
        calls += BATCH_CALLS
    return calls / (time.perf_counter() - started)


def measure(seconds: float) -> list[tuple[str, float, str, float]]:
    body = realistic_body()
    body_text = body.decode()
    secret = generate_secret()
    private_key, public_key = generate_key_pair()
    reference = standardwebhooks.Webhook(secret)
    hmac_signer, ed25519_signer = Signer([secret]), Signer([private_key])
    hmac_verifier, ed25519_verifier = Verifier([secret]), Verifier([public_key])

    # The reference reads the real clock, so every header is signed now and verified within
    # the 5-minute tolerance; measurements of a few seconds stay well inside it.
    timestamp = int(time.time())
    moment = datetime.datetime.fromtimestamp(timestamp, tz=datetime.timezone.utc)
    hmac_headers = hmac_signer.headers(WEBHOOK_ID, timestamp, body)
    ed25519_headers = ed25519_signer.headers(WEBHOOK_ID, timestamp, body)
    assert reference.sign(WEBHOOK_ID, moment, body_text) == hmac_headers["webhook-signature"]

    ours_hmac_sign = rate_per_second(lambda: hmac_signer.sign(WEBHOOK_ID, timestamp, body), seconds)
    reference_sign = rate_per_second(lambda: reference.sign(WEBHOOK_ID, moment, body_text), seconds)
    ours_hmac_verify = rate_per_second(lambda: hmac_verifier.verify(hmac_headers, body), seconds)
    reference_verify = rate_per_second(lambda: reference.verify(body, hmac_headers, json_parse=False), seconds)
    ours_ed25519_sign = rate_per_second(lambda: ed25519_signer.sign(WEBHOOK_ID, timestamp, body), seconds)
    ours_ed25519_verify = rate_per_second(lambda: ed25519_verifier.verify(ed25519_headers, body), seconds)
    return [
        ("sign v1 (HMAC-SHA256)", ours_hmac_sign, "standardwebhooks", reference_sign),
        ("verify v1 (HMAC-SHA256)", ours_hmac_verify, "standardwebhooks", reference_verify),
        ("sign v1a (Ed25519)", ours_ed25519_sign, "our HMAC sign", ours_hmac_sign),
        ("verify v1a (Ed25519)", ours_ed25519_verify, "our HMAC verify", ours_hmac_verify),
    ]


def print_table(rows: list[tuple[str, float, str, float]], seconds: float) -> None:
    print(f"1 KiB JSON body, about {seconds:g} s per measurement, one process, one core")
    print(f"{'operation':<26}{'ours /s':>12}  {'compared with':<18}{'theirs /s':>12}{'ours/theirs':>13}")
    for operation, ours, reference_name, reference in rows:
        print(f"{operation:<26}{ours:>12,.0f}  {reference_name:<18}{reference:>12,.0f}{ours / reference:>12.2f}x")
    print("standardwebhooks has no Ed25519; the v1a rows compare with our own HMAC instead.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each measurement")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    arguments = parser.parse_args()
    rows = measure(arguments.seconds)
    print_table(rows, arguments.seconds)
    if arguments.json:
        arguments.json.write_text(json.dumps({
            "benchmark": "signing", "body_bytes": BODY_BYTES, "seconds": arguments.seconds,
            "rows": [{"operation": operation, "ours_per_second": ours, "compared_with": reference_name,
                      "theirs_per_second": reference, "ratio": ours / reference}
                     for operation, ours, reference_name, reference in rows],
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
