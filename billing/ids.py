"""Identifiers: time-ordered UUIDs (version 7 layout) and the derived ledger entry ids.

Time-ordered ids keep new rows at the right edge of the primary-key index, which keeps
inserts cheap. Ledger ids are derived from what they are about, never random, so a second
write of the same fact collides on the primary key instead of adding money.
"""

from __future__ import annotations

import os
import time
import uuid


def new_id() -> uuid.UUID:
    """A UUIDv7: 48 bits of Unix milliseconds, then random bits."""
    milliseconds = time.time_ns() // 1_000_000
    random_bits = int.from_bytes(os.urandom(10), "big")
    value = (milliseconds << 80) | random_bits
    value = (value & ~(0xF << 76)) | (0x7 << 76)  # version 7
    value = (value & ~(0x3 << 62)) | (0x2 << 62)  # RFC 4122 variant
    return uuid.UUID(int=value)


def charge_id(delivery_id: uuid.UUID) -> str:
    return f"charge:{delivery_id}"


def refund_id(delivery_id: uuid.UUID) -> str:
    return f"refund:{delivery_id}"


def reclaim_id(delivery_id: uuid.UUID) -> str:
    return f"reclaim:{delivery_id}"


def topup_id(order_id: str) -> str:
    return f"topup:{order_id}"


def topup_reversal_id(order_id: str) -> str:
    return f"topup_reversal:{order_id}"


def closeout_id(account_id: uuid.UUID) -> str:
    return f"closeout:{account_id}"
