"""Create messages: fan out to subscribed endpoints and charge every delivery, all or nothing.

`create_messages` takes a batch of requests and writes it in ONE statement: that is what the
API's group commit feeds it (concurrent requests coalesced), and a single create is a batch of
one. Each request succeeds or fails on its own: one request's insufficient balance refuses that
request alone, and a refused request writes nothing.

A batch first goes direct (`billing.message_direct`): one autocommit statement in which
PostgreSQL fans out, locks the accounts in id order, and writes the batch only if every request
passes (every account active and covering its share, no key seen before), else nothing. One
round trip, and nothing decided in Python. A batch it does not take (one that targets endpoints
or replays a delivery: a replay) or that it wrote nothing of goes planned (`billing.message_plan`), unlocked first: it
reads its accounts and endpoints without locking them, decides every request in memory, and
writes in one autocommit statement that locks the accounts in id order and writes the batch only
if every account still passes what was decided (active, the same price, a balance covering its
charges), else nothing. A batch that wrote nothing there either (an account spent, closed or
repriced meanwhile, a key written meanwhile) is then decided again, locked: BEGIN, the read locks
the accounts in id order, the write, COMMIT. Every way writes a batch wholly or not at all, and
inside a caller's transaction only the locked way runs. Accounts are locked in id order every
way, so two batches never deadlock.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import uuid
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from billing import message_direct, operational_outbox
from billing.database import (
    OUTCOME_WAIT_SECONDS,
    Executor,
    OutcomeUnknown,
    ask_within,
    backend_alive_at,
    connection_of,
    outcome_after_backend_ends,
    runs_alone,
    transaction,
    transaction_status,
)
from billing.errors import BillingError, InsufficientBalance, InvalidInput
from billing.message_direct import DIRECT_READ_BACK, DIRECT_WRITE, DirectBatch
from billing.message_plan import CreatedDelivery, MessageCreated, MessageRequest, Plan
from billing.tables import (
    APPLICATION_UID_LENGTH_MAX,
    CHANNEL_LENGTH_MAX,
    MESSAGE_CHANNELS_MAX,
    TRACE_CONTEXT_LENGTH_MAX,
)

logger = logging.getLogger(__name__)

__all__ = [
    "BATCH_REQUESTS_MAX", "EVENT_TYPE_LENGTH_MAX", "IDEMPOTENCY_KEY_LENGTH_MAX", "OUTCOME_WAIT_SECONDS",
    "CreateOutcomeUnknown", "CreatedDelivery", "MessageCreated", "MessageRequest",
    "create_message", "create_messages", "resolve_outcome", "validate",
]

EVENT_TYPE_LENGTH_MAX = 256
IDEMPOTENCY_KEY_LENGTH_MAX = 255
PAYLOAD_BYTES_MAX = 1_048_576  # the schema's bound; the API enforces its own, smaller limit
BATCH_REQUESTS_MAX = 1000
ATTEMPTS_MAX_LIMIT = 50  # the schema's bound on deliveries.attempts_max
TARGET_ENDPOINTS_MAX = 100  # a targeted request (a replay) names at most this many endpoints
_CHANNEL = re.compile(r"[A-Za-z0-9_.:\-]+")  # never the separator of billing.message_plan.CHANNEL_SEPARATOR

# Batches that wrote something, by the way they were written, since this process started:
# "direct"; "unlocked"; "fell_back" (decided again, locked, after the unlocked write wrote
# nothing); "in_transaction" (locked, inside a caller's transaction).
WRITES: collections.Counter[str] = collections.Counter()
# Direct writes that wrote nothing (the batch then went planned): "not_ok" (a request did not
# pass), or the name of the error the server refused it with (a key written meanwhile).
DECLINED: collections.Counter[str] = collections.Counter()
# Unlocked writes the server refused (nothing written, the batch then decided locked), by error.
REFUSED: collections.Counter[str] = collections.Counter()


class CreateOutcomeUnknown(OutcomeUnknown):
    """The connection broke while a batch's write was in flight (the COMMIT of a locked batch, the
    statement of an unlocked one), so this side cannot tell whether it took effect. It did wholly
    or not at all; `resolve_outcome` asks the database which.

    Without this, "the write failed, nothing was written" would sometimes be untrue: a client that
    believed it and retried without an idempotency key would create, and pay for, the message twice.
    """

    def __init__(self, results: list, message_ids: list[uuid.UUID], transaction_id: int, *,
                 unlocked: _UnlockedWrite | None = None, direct: _DirectWrite | None = None) -> None:
        lost = f"transaction {transaction_id}" if unlocked is None else f"backend {unlocked.backend_pid}"
        super().__init__(f"the answer to the write of {len(message_ids)} new messages was lost ({lost})",
                         transaction_id, "it among your deliveries")
        self.results = results  # what the batch answers if it was written (a direct one's: once read back)
        self.message_ids = message_ids  # the batch's new messages: all exist if it was written, none if not
        self.unlocked = unlocked  # how to ask about an autocommit write; None: ask about transaction_id
        self.direct = direct  # a direct write's batch, whose deliveries are read back if it was written


@dataclass(frozen=True)
class _UnlockedWrite:
    """What resolve_outcome needs to tell whether an autocommit write (unlocked or direct) took effect."""
    backend_pid: int  # the backend that ran it...
    alive_at: datetime  # ...and a moment it was alive (PostgreSQL's clock), to tell it from a later one
    message_id: uuid.UUID  # one of its new messages: it exists if the write took effect
    account_id: uuid.UUID  # that message's account, which the lookup names


@dataclass(frozen=True)
class _DirectWrite:
    """What a direct write whose answer was lost needs to fill in its results, if it was written:
    the deliveries it made were in that answer."""
    batch: DirectBatch
    valid: list[int]  # where the batch's requests stand in the results


def validate(request: MessageRequest) -> None:
    if not isinstance(request.event_type, str) or not request.event_type:
        raise InvalidInput("event_type must be a non-empty string")
    if len(request.event_type) > EVENT_TYPE_LENGTH_MAX:
        raise InvalidInput(f"event_type is longer than {EVENT_TYPE_LENGTH_MAX} characters")
    if not isinstance(request.payload, bytes):
        raise InvalidInput("payload must be bytes (the exact body to send)")
    if len(request.payload) > PAYLOAD_BYTES_MAX:
        raise InvalidInput(f"payload is {len(request.payload)} bytes; the limit is {PAYLOAD_BYTES_MAX}")
    key = request.idempotency_key
    if key is not None and (not isinstance(key, str) or not 1 <= len(key) <= IDEMPOTENCY_KEY_LENGTH_MAX):
        raise InvalidInput(f"idempotency key must be 1 to {IDEMPOTENCY_KEY_LENGTH_MAX} characters")
    targets = request.endpoint_ids
    if targets is not None:
        if not isinstance(targets, tuple) or not 1 <= len(targets) <= TARGET_ENDPOINTS_MAX:
            raise InvalidInput(f"endpoint_ids must be a tuple of 1 to {TARGET_ENDPOINTS_MAX} endpoint ids")
        if not all(isinstance(endpoint_id, uuid.UUID) for endpoint_id in targets) or len(set(targets)) != len(targets):
            raise InvalidInput("endpoint_ids must be distinct UUIDs")
    channels = request.channels
    if channels is not None:
        if not isinstance(channels, tuple) or not 1 <= len(channels) <= MESSAGE_CHANNELS_MAX:
            raise InvalidInput(f"channels must be a tuple of 1 to {MESSAGE_CHANNELS_MAX} channels")
        if len(set(channels)) != len(channels) or not all(
                isinstance(channel, str) and 1 <= len(channel) <= CHANNEL_LENGTH_MAX and _CHANNEL.fullmatch(channel)
                for channel in channels):
            raise InvalidInput(f"channels must be distinct, of 1 to {CHANNEL_LENGTH_MAX} letters, digits and _ . : -")
    if request.application_id is not None and not isinstance(request.application_id, uuid.UUID):
        raise InvalidInput("application_id must be the UUID of an application of the account")
    uid = request.application_uid
    if uid is not None and (not isinstance(uid, str) or not 1 <= len(uid) <= APPLICATION_UID_LENGTH_MAX):
        raise InvalidInput(f"application_uid must be 1 to {APPLICATION_UID_LENGTH_MAX} characters")
    context = request.trace_context
    if context is not None and (not isinstance(context, str) or not 1 <= len(context) <= TRACE_CONTEXT_LENGTH_MAX):
        raise InvalidInput(f"trace_context must be 1 to {TRACE_CONTEXT_LENGTH_MAX} characters")
    if request.replay_of is not None and not isinstance(request.replay_of, uuid.UUID):
        raise InvalidInput("replay_of must be the UUID of the delivery replayed")


async def create_message(executor: Executor, request: MessageRequest, *, attempts_max: int) -> MessageCreated:
    """Create one message; raises the request's BillingError if refused."""
    (result,) = await create_messages(executor, [request], attempts_max=attempts_max)
    if isinstance(result, BillingError):
        raise result
    return result


async def create_messages(
    executor: Executor, requests: list[MessageRequest], *, attempts_max: int,
    outcome_wait_seconds: float = OUTCOME_WAIT_SECONDS,
) -> list[MessageCreated | BillingError]:
    """Create a batch; the result list matches the requests one to one.

    If the connection breaks while the write is in flight: given a pool, this asks the database
    whether the batch was written (`resolve_outcome`, for up to `outcome_wait_seconds`) and returns
    its results if it was, raises the connection error if it was not, and raises
    CreateOutcomeUnknown if the database cannot tell.
    Given a connection (now broken), it raises CreateOutcomeUnknown for the caller to resolve with
    a pool. Any other failure means nothing was written.
    """
    if not 1 <= len(requests) <= BATCH_REQUESTS_MAX:
        raise InvalidInput(f"a batch holds 1 to {BATCH_REQUESTS_MAX} requests")
    # Checked here, not left to the CHECK constraint: a driver error is not a BillingError, and
    # it would fail every request of the batch instead of being refused before anything is written.
    if isinstance(attempts_max, bool) or not isinstance(attempts_max, int) or not 1 <= attempts_max <= ATTEMPTS_MAX_LIMIT:
        raise InvalidInput(f"attempts_max must be an integer from 1 to {ATTEMPTS_MAX_LIMIT}, got {attempts_max!r}")
    results: list[MessageCreated | BillingError | None] = [None] * len(requests)
    for index, request in enumerate(requests):
        try:
            validate(request)
        except BillingError as error:
            results[index] = error
    valid = [index for index, result in enumerate(results) if result is None]
    if not valid:
        return results  # type: ignore[return-value]
    try:
        # Only a top-level write decides; in a caller's transaction the batch is a savepoint, and
        # the caller's own COMMIT is theirs to resolve.
        top_level = runs_alone(executor)
        settled = top_level and (await _create_direct(executor, requests, valid, results, attempts_max)
                                 or await _create_unlocked(executor, requests, valid, results, attempts_max))
        if not settled and await _create_locked(executor, requests, valid, results, attempts_max, top_level):
            WRITES["fell_back" if top_level else "in_transaction"] += 1
    except CreateOutcomeUnknown as unknown:
        if not isinstance(executor, asyncpg.Pool):
            raise
        if await resolve_outcome(executor, unknown, wait_seconds=outcome_wait_seconds) is None:
            raise unknown.__cause__ from None  # type: ignore[misc]  # certainly not written: the original error
    refused = [request.account_id for request, result in zip(requests, results, strict=True)
               if isinstance(result, InsufficientBalance)]
    if refused:  # only on a refusal: the path that creates pays nothing for it
        await _balance_exhausted(executor, refused)
    return results  # type: ignore[return-value]


async def _balance_exhausted(executor: Executor, account_ids: list[uuid.UUID]) -> None:
    """balance.exhausted for these refusals. Its own statement, after the batch: one that fails
    (PostgreSQL gone) must not fail a batch whose messages were written, and loses nothing, since
    the account stays armed and its next refusal writes the event."""
    try:
        await operational_outbox.balance_exhausted(executor, account_ids)
    except (asyncpg.PostgresError, *_ANSWER_LOST) as error:
        logger.warning("balance.exhausted not written now (%r); the next refusal writes it", error)


# What a write whose answer was lost fails with: the connection broke, or was closed under it.
# An error the server sent (any other PostgresError) means the statement did not take effect.
_ANSWER_LOST = (asyncpg.PostgresConnectionError, asyncpg.InterfaceError, OSError, asyncio.TimeoutError)


async def _create_direct(executor: Executor, requests: list[MessageRequest], valid: list[int], results: list,
                         attempts_max: int) -> bool:
    """Write the batch direct, if it can go that way and every request passes; whether it did.
    If not, nothing was written and the results are as they were."""
    batch_requests = [requests[index] for index in valid]
    if not message_direct.applies(batch_requests):
        return False
    batch = DirectBatch(batch_requests, attempts_max)
    async with connection_of(executor) as connection:
        alive_at = await backend_alive_at(connection)
        backend_pid = connection.get_server_pid()  # asked now: a connection that breaks is detached at once
        try:
            row = await connection.fetchrow(DIRECT_WRITE, *batch.arguments())
        except _ANSWER_LOST as error:
            unlocked = _UnlockedWrite(backend_pid, alive_at, batch.message_ids[0], batch.requests[0].account_id)
            raise CreateOutcomeUnknown(results, batch.message_ids, 0, unlocked=unlocked,
                                       direct=_DirectWrite(batch, valid)) from error
        except asyncpg.PostgresError as error:
            DECLINED[type(error).__name__] += 1
            return False  # refused (a key written meanwhile): nothing written
    if not row["ok"]:
        DECLINED["not_ok"] += 1
        return False
    for index, result in zip(valid, batch.results(row), strict=True):
        results[index] = result
    WRITES["direct"] += 1
    return True


async def _create_unlocked(executor: Executor, requests: list[MessageRequest], valid: list[int], results: list,
                           attempts_max: int) -> bool:
    """Decide and write the batch unlocked; whether that settled it. If not, nothing was written."""
    async with connection_of(executor) as connection:
        plan = await Plan.load(connection, [requests[index] for index in valid], lock=False)
        for index in valid:
            results[index] = plan.decide(requests[index], attempts_max)
        if not plan.messages:
            return True  # only refusals and replays: nothing to write
        backend_pid = connection.get_server_pid()  # asked now: a connection that breaks is detached at once
        try:
            written = await plan.write_gated(connection)
        except _ANSWER_LOST as error:
            unlocked = _UnlockedWrite(backend_pid, plan.read_at, plan.messages[0][0], plan.messages[0][1])
            raise CreateOutcomeUnknown(results, [row[0] for row in plan.messages], 0, unlocked=unlocked) from error
        except asyncpg.PostgresError as error:
            REFUSED[type(error).__name__] += 1
            return False  # refused (a key written meanwhile): nothing written
    if written:
        WRITES["unlocked"] += 1
    return written


async def _create_locked(executor: Executor, requests: list[MessageRequest], valid: list[int], results: list,
                         attempts_max: int, top_level: bool) -> bool:
    """Decide and write the batch locked, in a transaction (a savepoint if not `top_level`);
    whether it wrote anything."""
    committing: Plan | None = None
    try:
        async with transaction(executor) as connection:
            plan = await Plan.load(connection, [requests[index] for index in valid])
            for index in valid:
                results[index] = plan.decide(requests[index], attempts_max)
            await plan.write(connection)
            if top_level and plan.messages:
                committing = plan  # from here on, only the COMMIT is left
    except Exception as error:
        if committing is None:
            raise
        raise CreateOutcomeUnknown(results, [row[0] for row in committing.messages],
                                   committing.transaction_id) from error
    return bool(plan.messages)


async def resolve_outcome(pool: asyncpg.Pool, unknown: CreateOutcomeUnknown, *,
                          wait_seconds: float = OUTCOME_WAIT_SECONDS) -> list[MessageCreated | BillingError] | None:
    """Whether the batch behind `unknown` was written: its results if it was, None if nothing was.

    A locked batch: asks PostgreSQL for the status of its transaction (`transaction_status`). An
    unlocked or direct one has no transaction id before its statement runs: this ends the backend
    that ran it and waits until it has exited (`outcome_after_backend_ends`), after which the
    statement has taken effect or not for good, and then looks for one of its messages. A direct
    batch that was written then reads back the deliveries it made, which were in the lost answer.
    Raises `unknown` again if it cannot tell within `wait_seconds`: the database unreachable all
    that time, or (locked) the transaction still open.
    """
    deadline = asyncio.get_running_loop().time() + wait_seconds
    unlocked = unknown.unlocked
    if unlocked is None:
        committed = await transaction_status(pool, unknown.transaction_id, wait_seconds=wait_seconds)
    else:
        committed = await outcome_after_backend_ends(pool, unlocked.backend_pid, unlocked.alive_at, _MESSAGE_EXISTS,
                                                     unlocked.account_id,
                                                     unlocked.message_id, wait_seconds=wait_seconds)
    if committed is None:
        raise unknown
    if not committed:
        return None
    if unknown.direct is not None:
        try:
            # Within what is left of the same wait: the caller was promised an answer by then.
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise asyncio.TimeoutError()
            row = await ask_within(pool.fetchrow(
                DIRECT_READ_BACK, unknown.message_ids,
                sorted({request.account_id for request in unknown.direct.batch.requests})), remaining)
        except _ANSWER_LOST + (asyncpg.PostgresError,):
            raise unknown from None  # written, but what it made cannot be read back now
        for index, result in zip(unknown.direct.valid, unknown.direct.batch.results(row), strict=True):
            unknown.results[index] = result
    # Written after all: counted by its way, as a batch whose answer came back is. A lost COMMIT
    # is always a top-level locked batch's, which only runs after an unlocked write wrote nothing.
    WRITES["direct" if unknown.direct is not None else "unlocked" if unlocked is not None else "fell_back"] += 1
    return unknown.results


_MESSAGE_EXISTS = "SELECT EXISTS (SELECT FROM messages WHERE account_id = $1 AND id = $2)"
