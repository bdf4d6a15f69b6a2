#!/usr/bin/env python
"""What the message decode's own checks cost per request, beside msgspec's bare decode, same run.

`POST /v1/messages` decodes its body with `delivery.api.validation.decode_message`: msgspec's
decode into the envelope, then the checks msgspec leaves to us (the payload's UTF-8, each field
given once). The baseline is the same msgspec decoder alone. Both run over the same bodies,
interleaved in rounds, and the table gives microseconds per call and the difference: the cost of
the checks on the hot path. Prints a table; writes no files.

    .venv/bin/python scripts/bench_decode.py [--calls 200000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from delivery.api.validation import _MESSAGE_DECODER, decode_message  # noqa: E402

PAYLOAD_BYTES = 1024


def _body(text: str) -> bytes:
    """A message body whose payload is a JSON object padded to about PAYLOAD_BYTES."""
    payload = {"invoice": "in_1P9xYz2eZvKYlo2C", "amount": 4200, "currency": "eur", "note": ""}
    padding = PAYLOAD_BYTES - len(json.dumps(payload, ensure_ascii=False).encode())
    payload["note"] = (text * PAYLOAD_BYTES)[:max(padding // len(text.encode()), 0)]
    return json.dumps({"event_type": "invoice.paid", "payload": payload}, ensure_ascii=False,
                      separators=(",", ":")).encode()


BODIES = {
    "ASCII payload, compact envelope": _body("x"),
    "non-ASCII payload (UTF-8 checked)": _body("é"),
    # An escape in a name is not shown plain by the two regexes: the body is parsed to check it.
    "escaped name (the full-parse fallback)": _body("x").replace(b'{"event_type":', b'{"event\\u005ftype":'),
}


def _per_call_us(work: Callable[[bytes], object], body: bytes, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        work(body)
    return (time.perf_counter() - started) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200_000, help="calls per measurement (default 200000)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians reported (default 5)")
    args = parser.parse_args()
    print(f"{'body':<44} {'msgspec alone':>14} {'decode_message':>15} {'checks cost':>12} {'ratio':>6}")
    for name, body in BODIES.items():
        assert decode_message(body)[1] == bytes(_MESSAGE_DECODER.decode(body).payload)
        bare, ours = [], []
        for _ in range(args.rounds):
            bare.append(_per_call_us(_MESSAGE_DECODER.decode, body, args.calls))
            ours.append(_per_call_us(decode_message, body, args.calls))
        b, o = statistics.median(bare), statistics.median(ours)
        print(f"{name:<44} {b:>11.2f} µs {o:>12.2f} µs {o - b:>9.2f} µs {o / b:>5.2f}×")


if __name__ == "__main__":
    main()
