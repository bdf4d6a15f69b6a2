"""Erasure of payloads and response excerpts: at once for one message (expunge), and after each
account's retention period for every finished message (the worker's `retention` cron).

What is erased: `messages.payload`, and the `response_excerpt` and `sent_headers` (the endpoint's
custom headers as sent: the customer's values) of every attempt of the message's deliveries. What stays: every row (ids, sizes, states, times, status codes), and the ledger,
which nothing here touches. `messages.payload_erased_at` and `payload_erased_by` record when and
by whom, never what.

Only a message whose deliveries have all finished (delivered or dead) is erased, and the check
is made under the rows' locks: the message row, then its deliveries in id order, FOR UPDATE.
A claim takes deliveries with FOR UPDATE SKIP LOCKED, so while an erasure holds them no claim
takes them, and a delivery claimed first is `sending` when the erasure reads it and keeps its
message's payload. A finished delivery never goes back to pending (replays are new messages), so
once checked, nothing can send the message again; and if anything ever did, the pre-send check
settles a delivery whose payload is NULL instead of sending it (delivery.engine.presend).

The retention job works in small batches: each is one short transaction that takes at most
BATCH_SIZE messages with SKIP LOCKED (never waiting on a claim, a send's record or an expunge).
A run goes on until nothing is due, for at most RUN_SECONDS_MAX (the worker's cron starts one a
minute, so a run ends before the next is due) and BATCHES_PER_RUN_MAX batches, so the job erases
for most of each minute while a backlog lasts, at the rate scripts/bench_retention.py measures.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from billing.database import Executor, transaction

ERASED_BY_RETENTION = "retention"
BATCH_SIZE = 500  # messages per transaction: each holds its rows' locks for a few milliseconds
BATCHES_PER_RUN_MAX = 4_000  # 2,000,000 messages: a bound behind RUN_SECONDS_MAX, which ends a run first
RUN_SECONDS_MAX = 45.0  # a run's time budget: the cron starts one a minute
BACKLOG_COUNTED_MAX = 1_000_000  # the backlog gauge counts up to this many messages

# The message of an account, locked (an expunge waits for a concurrent one, then finds it done).
_LOCK_MESSAGE = (
    "SELECT id, event_type, payload_erased_at, payload_erased_by FROM messages"
    " WHERE id = $1 AND account_id = $2 FOR UPDATE"
)
# The message's deliveries, locked in id order (the platform's lock order for delivery rows).
_LOCK_DELIVERIES = (
    "SELECT id, state, next_attempt_at, leased_until FROM deliveries"
    " WHERE message_id = $1 AND account_id = $2 ORDER BY id FOR UPDATE"
)
# Erase one message's payload, recording who and when: when is the clock's after the locks were
# taken, not the transaction's start (now()), which can be earlier than an attempt this one
# waited for.
_ERASE_MESSAGE = (
    "UPDATE messages SET payload = NULL, payload_erased_at = clock_timestamp(), payload_erased_by = $3"
    " WHERE id = $1 AND account_id = $2 RETURNING payload_erased_at, payload_erased_by"
)
# Erase the response excerpts, and the custom headers sent, of these deliveries' attempts.
_ERASE_EXCERPTS = (
    "UPDATE delivery_attempts SET response_excerpt = NULL, sent_headers = NULL"
    " WHERE delivery_id = ANY($1::uuid[]) AND (response_excerpt IS NOT NULL OR sent_headers IS NOT NULL)"
)
# One batch of the retention job, in one statement (one round trip). The oldest kept payloads
# past their account's retention whose deliveries have all finished (as of the statement's
# snapshot), per account through ix_messages_retained, locked with SKIP LOCKED; then their
# deliveries, locked in id order with SKIP LOCKED (a lock returns the row's latest committed
# state). A message keeps its payload when one of its deliveries is locked elsewhere (a claim, a
# record in flight) or live after all; every other one loses its payload and its attempts'
# response excerpts and custom headers sent (only the attempts that still hold either are
# written), erased at the clock's time once the locks are held. Nothing here waits on a lock.
# Answers how many messages were taken and how many erased.
_ERASE_BATCH = (
    "WITH candidates AS ("
    "   SELECT c.id FROM accounts a CROSS JOIN LATERAL ("
    "     SELECT m.id FROM messages m"
    "     WHERE m.account_id = a.id AND m.payload IS NOT NULL"
    "       AND m.created_at < now() - a.payload_retention_days * interval '1 day'"
    "       AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.message_id = m.id AND d.state IN ('pending', 'sending'))"
    "     ORDER BY m.created_at LIMIT $1 FOR UPDATE OF m SKIP LOCKED) c"
    "   LIMIT $1),"
    " locked AS ("
    "   SELECT id, message_id, state FROM deliveries WHERE message_id IN (SELECT id FROM candidates)"
    "   ORDER BY id FOR UPDATE SKIP LOCKED),"
    " held AS ("
    "   SELECT d.message_id FROM deliveries d LEFT JOIN locked l ON l.id = d.id"
    "   WHERE d.message_id IN (SELECT id FROM candidates) AND (l.id IS NULL OR l.state IN ('pending', 'sending'))),"
    " erasable AS (SELECT id FROM candidates WHERE id NOT IN (SELECT message_id FROM held)),"
    " excerpts AS ("
    "   UPDATE delivery_attempts SET response_excerpt = NULL, sent_headers = NULL"
    "   WHERE delivery_id IN (SELECT l.id FROM locked l WHERE l.message_id IN (SELECT id FROM erasable))"
    "     AND (response_excerpt IS NOT NULL OR sent_headers IS NOT NULL)),"
    " erased AS ("
    "   UPDATE messages SET payload = NULL, payload_erased_at = clock_timestamp(), payload_erased_by = $2"
    "   WHERE id IN (SELECT id FROM erasable) RETURNING 1)"
    " SELECT (SELECT count(*) FROM candidates) AS taken, (SELECT count(*) FROM erased) AS erased"
)
# How many kept payloads are past their retention (finished or not), up to BACKLOG_COUNTED_MAX.
_BACKLOG = (
    "SELECT count(*) FROM (SELECT 1 FROM accounts a CROSS JOIN LATERAL ("
    "   SELECT 1 FROM messages m WHERE m.account_id = a.id AND m.payload IS NOT NULL"
    "     AND m.created_at < now() - a.payload_retention_days * interval '1 day' LIMIT $1) c LIMIT $1) b"
)


class MessageNotFound(Exception):
    """No such message in this account."""


class MessageLive(Exception):
    """The message has deliveries still live; it can be erased once they have finished."""

    def __init__(self, live: int, next_change_at: datetime | None) -> None:
        super().__init__(f"{live} deliveries of the message are still pending or sending")
        self.live = live
        self.next_change_at = next_change_at  # the soonest a live delivery is next tried or its lease ends


@dataclass(frozen=True)
class Erased:
    message_id: uuid.UUID
    event_type: str
    payload_erased_at: datetime
    payload_erased_by: str


async def expunge(executor: Executor, account_id: uuid.UUID, message_id: uuid.UUID, erased_by: str) -> Erased:
    """Erase one message's payload and its attempts' response excerpts now. Idempotent: a second
    call answers the first one's time and author. MessageNotFound, or MessageLive while any of
    its deliveries is pending or sending."""
    async with transaction(executor) as connection:
        message = await connection.fetchrow(_LOCK_MESSAGE, message_id, account_id)
        if message is None:
            raise MessageNotFound(f"no message {message_id}")
        deliveries = await connection.fetch(_LOCK_DELIVERIES, message_id, account_id)
        live = [row for row in deliveries if row["state"] in ("pending", "sending")]
        if live:
            changes = [row["leased_until"] or row["next_attempt_at"] for row in live]
            raise MessageLive(len(live), min(changes))
        # Again when erased already: an attempt recorded late (a stale answer) may have added an excerpt.
        await connection.execute(_ERASE_EXCERPTS, [row["id"] for row in deliveries])
        if message["payload_erased_at"] is not None:
            return Erased(message_id, message["event_type"], message["payload_erased_at"], message["payload_erased_by"])
        erased = await connection.fetchrow(_ERASE_MESSAGE, message_id, account_id, erased_by)
    return Erased(message_id, message["event_type"], erased["payload_erased_at"], erased["payload_erased_by"])


async def erase_batch(pool: asyncpg.Pool, *, batch_size: int = BATCH_SIZE) -> tuple[int, int]:
    """One batch of the retention job, one statement. Returns (messages taken, messages erased):
    a taken message is left when one of its deliveries is locked elsewhere or live after all."""
    async with pool.acquire() as connection:
        row = await connection.fetchrow(_ERASE_BATCH, batch_size, ERASED_BY_RETENTION)
    return row["taken"], row["erased"]


@dataclass(frozen=True)
class RetentionRun:
    batches: int
    erased: int
    seconds: float


async def run_retention(pool: asyncpg.Pool, *, batch_size: int = BATCH_SIZE,
                        batches_max: int = BATCHES_PER_RUN_MAX, seconds_max: float = RUN_SECONDS_MAX) -> RetentionRun:
    """Erase what is past retention, batch by batch, until a batch finds nothing to erase, or
    batches_max batches ran, or seconds_max passed (the next run goes on)."""
    started = time.monotonic()
    erased = batches = 0
    while batches < batches_max and (batches == 0 or time.monotonic() - started < seconds_max):
        taken, erased_now = await erase_batch(pool, batch_size=batch_size)
        batches += 1
        erased += erased_now
        if erased_now == 0 or taken < batch_size:
            break
    return RetentionRun(batches, erased, time.monotonic() - started)


async def backlog(executor: Executor) -> int:
    """Kept payloads past their account's retention (live or not), counted up to BACKLOG_COUNTED_MAX."""
    return await executor.fetchval(_BACKLOG, BACKLOG_COUNTED_MAX)
