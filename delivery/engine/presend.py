"""The pre-send check: load what a claimed delivery needs, or settle it if it cannot be sent.

Runs after the claim committed and before the send, in one read: account still active,
endpoint still there and enabled. What fails the check dies here through billing.settle,
quoting the claimed attempt (death paths 2 and 3).
"""

from __future__ import annotations

import logging
import uuid
from typing import NamedTuple

import asyncpg

from billing.errors import LedgerMismatch
from billing.settle import DeadReason, Settled, settle
from delivery import tracing
from delivery.engine import claims
from delivery.engine.claims import Claimed

logger = logging.getLogger(__name__)


class Outgoing(NamedTuple):
    """A claimed delivery with everything the sender needs (a NamedTuple: cheap on the hot path)."""

    claimed: Claimed
    url: str
    timeout_ms: int
    secret: bytes | None  # ciphertext (signing.at_rest)
    previous_secret: bytes | None  # still signs until it expires (rotation)
    event_type: str
    payload: bytes
    # The id the delivery is sent under when it is not its own (a replay: that of the delivery it
    # replays); None for every other delivery.
    webhook_id: uuid.UUID | None = None
    headers: str | None = None  # the endpoint's custom headers as stored (delivery.store.endpoint_headers)
    rate_limit_per_second: int | None = None  # delivery.engine.throttle; None: no limit


# Claimed deliveries by (account_id, id) pairs: the accounts name the shards to read.
_LOAD = ("SELECT d.id, d.webhook_id, " + claims.SEND_COLUMNS
         + " FROM unnest($2::uuid[], $1::uuid[]) AS r(account_id, id)"
         + " JOIN deliveries d ON d.account_id = r.account_id AND d.id = r.id" + claims.SEND_JOINS
         + " WHERE d.account_id = ANY($2::uuid[])")


def reason_not_to_send(row) -> DeadReason | None:
    if row["account_status"] != "active" or row["payload"] is None:
        return DeadReason.ACCOUNT_CLOSED
    if row["endpoint_deleted"]:
        return DeadReason.ENDPOINT_DELETED
    if not row["enabled"]:
        return DeadReason.ENDPOINT_DISABLED
    return None


async def load_for_send(pool: asyncpg.Pool, claimed: list[Claimed]) -> tuple[list[Outgoing], list[Settled]]:
    """Split claimed deliveries into those to send and those settled by the check."""
    if not claimed:
        return [], []
    rows = {row["id"]: row for row in await pool.fetch(_LOAD, [c.id for c in claimed], [c.account_id for c in claimed])}
    return await check_loaded(pool, [(item, rows[item.id]) for item in claimed])


async def check_loaded(
    pool: asyncpg.Pool, loaded: list[tuple[Claimed, asyncpg.Record]]
) -> tuple[list[Outgoing], list[Settled]]:
    """The check on rows already read (claims.SEND_COLUMNS, e.g. returned by the claim itself)."""
    outgoing: list[Outgoing] = []
    settled: list[Settled] = []
    for item, row in loaded:
        reason = reason_not_to_send(row)
        if reason is not None:
            try:
                with tracing.attempt_span("delivery.settle", item.id, item.attempt, dead_reason=reason.value) as span:
                    settled.append(await settle(pool, item.id, reason, account_id=item.account_id, attempt=item.attempt))
                    tracing.set_outcome(span, settled[-1].outcome)
            except LedgerMismatch:
                # Neither sent nor settled: it stays stuck for the audit, and the rest of the
                # batch goes on instead of losing an attempt to this one delivery.
                logger.error("delivery %s not settled: its ledger disagrees", item.id, exc_info=True)
            continue
        outgoing.append(
            Outgoing(item, row["url"], row["timeout_ms"], row["secret"], row["previous_secret"],
                     row["event_type"], row["payload"], row["webhook_id"], row["headers"],
                     row["rate_limit_per_second"])
        )
    return outgoing, settled


def delivery_ids(items: list[Outgoing]) -> list[uuid.UUID]:
    return [item.claimed.id for item in items]
