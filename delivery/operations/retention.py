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

The retention job works in small batches: each is one statement, one short transaction, that
takes at most BATCH_SIZE messages with SKIP LOCKED (never waiting on a claim, a send's record or an
expunge). A run goes on while work is due: until a batch erases nothing or finds less than a full
batch, for at most RUN_SECONDS_MAX and BATCHES_PER_RUN_MAX batches, yielding between batches. Each
batch starts where the run's previous one reached in each account, so a long run does not slow
down walking the index entries of the payloads it erased. One run at a time across every worker:
the run holds a session advisory lock (the cron's `unique` only keeps two workers from taking the
same minute's tick; a run longer than a minute would otherwise meet the next tick's). So while a
backlog lasts the job erases nearly all the time, at the rate scripts/bench_retention.py measures.

Accounts. An expunge names its account in every statement. A retention batch spans accounts by
design (the oldest payloads of every account, in one statement) and addresses every row it locks
or writes by its account and id; on a distributed engine it is a multi-shard statement, and a run
per group of accounts (as the claims take them) is the way to route it to one shard.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from billing.database import Executor, transaction

ERASED_BY_RETENTION = "retention"
BATCH_SIZE = 1_000  # messages per batch (one statement): each holds its rows' locks for tens of milliseconds
BATCHES_PER_RUN_MAX = 20_000  # a bound behind RUN_SECONDS_MAX, which ends a run first
# A run goes on while work is due, up to this long: the worker's cron starts one a minute (second
# 30), the ticks during a run find its lock taken and return, and a run cut short at this bound
# ends ten seconds before the tick that starts the next one.
RUN_SECONDS_MAX = 290.0
# The run's advisory lock: a namespace of its own ("hlre"; account deletion's is "hlde"), key 0.
RUN_LOCK_NAMESPACE = 0x686C_7265
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
    " WHERE account_id = $2 AND delivery_id = ANY($1::uuid[])"
    "   AND (response_excerpt IS NOT NULL OR sent_headers IS NOT NULL)"
)
# One batch of the retention job, in one statement (one round trip). The oldest kept payloads
# past their account's retention whose deliveries have all finished (as of the statement's
# snapshot), per account through ix_messages_retained from where the run's previous batch reached
# in that account ($3, $4: the index entries of the payloads it erased are dead but stay until
# VACUUM, and walking them again each batch made the run slow down as it went), locked with SKIP
# LOCKED; then their deliveries, locked in id order with SKIP LOCKED (a lock returns the row's
# latest committed state). A message keeps its payload when one of its deliveries is locked
# elsewhere (a claim, a record in flight) or live after all; every other one loses its payload and
# its attempts' response excerpts and custom headers sent (only the attempts that still hold
# either are written), erased at the clock's time once the locks are held. Nothing here waits on
# a lock. Answers how many messages were taken and erased, and where the batch
# reached in each account (the newest created_at it took there). Every row is addressed by its
# account and id; the batch itself spans accounts (allowed: see the module's docstring).
_ERASE_BATCH = (
    "WITH candidates AS ("
    "   SELECT c.id, c.account_id, c.created_at FROM accounts a"
    "   LEFT JOIN unnest($3::uuid[], $4::timestamptz[]) AS run_cursor (account_id, reached)"
    "     ON run_cursor.account_id = a.id"
    "   CROSS JOIN LATERAL ("
    "     SELECT m.id, m.account_id, m.created_at FROM messages m"
    "     WHERE m.account_id = a.id AND m.payload IS NOT NULL"
    "       AND m.created_at >= coalesce(run_cursor.reached, '-infinity')"
    "       AND m.created_at < now() - a.payload_retention_days * interval '1 day'"
    "       AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.account_id = m.account_id AND d.message_id = m.id"
    "         AND d.state IN ('pending', 'sending'))"
    "     ORDER BY m.created_at LIMIT $1 FOR UPDATE OF m SKIP LOCKED) c"
    "   LIMIT $1),"
    " locked AS ("
    "   SELECT id, account_id, message_id, state FROM deliveries"
    "   WHERE (account_id, message_id) IN (SELECT account_id, id FROM candidates)"
    "   ORDER BY id FOR UPDATE SKIP LOCKED),"
    " held AS ("
    "   SELECT d.message_id FROM deliveries d LEFT JOIN locked l ON l.account_id = d.account_id AND l.id = d.id"
    "   WHERE (d.account_id, d.message_id) IN (SELECT account_id, id FROM candidates)"
    "     AND (l.id IS NULL OR l.state IN ('pending', 'sending'))),"
    " erasable AS (SELECT id, account_id FROM candidates WHERE id NOT IN (SELECT message_id FROM held)),"
    " excerpts AS ("
    "   UPDATE delivery_attempts SET response_excerpt = NULL, sent_headers = NULL"
    "   WHERE (account_id, delivery_id) IN (SELECT l.account_id, l.id FROM locked l"
    "       WHERE l.message_id IN (SELECT id FROM erasable))"
    "     AND (response_excerpt IS NOT NULL OR sent_headers IS NOT NULL)),"
    " erased AS ("
    "   UPDATE messages SET payload = NULL, payload_erased_at = clock_timestamp(), payload_erased_by = $2"
    "   WHERE (account_id, id) IN (SELECT account_id, id FROM erasable) RETURNING 1),"
    " reached AS (SELECT account_id, max(created_at) AS created_at FROM candidates GROUP BY account_id)"
    " SELECT (SELECT count(*) FROM candidates) AS taken, (SELECT count(*) FROM erased) AS erased,"
    "   array_agg(account_id) AS reached_accounts, array_agg(created_at) AS reached_at FROM reached"
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
        await connection.execute(_ERASE_EXCERPTS, [row["id"] for row in deliveries], account_id)
        if message["payload_erased_at"] is not None:
            return Erased(message_id, message["event_type"], message["payload_erased_at"], message["payload_erased_by"])
        erased = await connection.fetchrow(_ERASE_MESSAGE, message_id, account_id, erased_by)
    return Erased(message_id, message["event_type"], erased["payload_erased_at"], erased["payload_erased_by"])


async def erase_batch(executor: Executor, *, batch_size: int = BATCH_SIZE,
                      reached: dict[uuid.UUID, datetime] | None = None) -> tuple[int, int]:
    """One batch of the retention job, one statement. Returns (messages taken, messages erased):
    a taken message is left when one of its deliveries is locked elsewhere or live after all.
    `reached`, a run's own map of where it has reached in each account, is read (the batch starts
    there) and moved on; without it the batch starts at each account's oldest kept payload."""
    reached = {} if reached is None else reached
    row = await executor.fetchrow(_ERASE_BATCH, batch_size, ERASED_BY_RETENTION, list(reached), list(reached.values()))
    for account_id, created_at in zip(row["reached_accounts"] or (), row["reached_at"] or (), strict=True):
        reached[account_id] = created_at
    return row["taken"], row["erased"]


@dataclass(frozen=True)
class RetentionRun:
    batches: int
    erased: int
    seconds: float
    ran_elsewhere: bool = False  # another worker's run held the lock: this one did nothing


async def run_retention(pool: asyncpg.Pool, *, batch_size: int = BATCH_SIZE,
                        batches_max: int = BATCHES_PER_RUN_MAX, seconds_max: float = RUN_SECONDS_MAX) -> RetentionRun:
    """Erase what is past retention, batch by batch, while work is due: until a batch erases
    nothing or takes less than a full batch, or batches_max batches ran, or seconds_max passed
    (the next run goes on). One run at a time across every worker: a session advisory lock, held
    by the run's one connection (PostgreSQL releases it if the worker dies), which runs the batches
    too; a run that finds it taken returns at once. Between batches the run yields to the event
    loop and holds no row lock."""
    started = time.monotonic()
    async with pool.acquire() as connection:
        if not await connection.fetchval("SELECT pg_try_advisory_lock($1, 0)", RUN_LOCK_NAMESPACE):
            return RetentionRun(0, 0, time.monotonic() - started, ran_elsewhere=True)
        try:
            reached: dict[uuid.UUID, datetime] = {}
            erased = batches = 0
            while batches < batches_max and (batches == 0 or time.monotonic() - started < seconds_max):
                taken, erased_now = await erase_batch(connection, batch_size=batch_size, reached=reached)
                batches += 1
                erased += erased_now
                if erased_now == 0 or taken < batch_size:
                    break
                await asyncio.sleep(0)
        finally:
            await connection.execute("SELECT pg_advisory_unlock($1, 0)", RUN_LOCK_NAMESPACE)
    return RetentionRun(batches, erased, time.monotonic() - started)


async def backlog(executor: Executor) -> int:
    """Kept payloads past their account's retention (live or not), counted up to BACKLOG_COUNTED_MAX."""
    return await executor.fetchval(_BACKLOG, BACKLOG_COUNTED_MAX)
