"""Create messages: fan out to subscribed endpoints and charge every delivery, all or nothing.

`create_messages` takes a batch of requests and runs them in ONE transaction: that is what
the API's group commit feeds it (concurrent requests coalesced), and a single create is a
batch of one. Accounts are locked in id order, so two batches never deadlock. Each request
succeeds or fails on its own: one request's insufficient balance refuses that request alone,
and a refused request writes nothing.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import defaultdict
from dataclasses import dataclass

import asyncpg

from billing import ids
from billing.database import OUTCOME_WAIT_SECONDS, Executor, OutcomeUnknown, transaction, transaction_status
from billing.errors import (
    AccountNotActive,
    AccountNotFound,
    BillingError,
    IdempotencyConflict,
    InsufficientBalance,
    InvalidInput,
)

EVENT_TYPE_LENGTH_MAX = 256
IDEMPOTENCY_KEY_LENGTH_MAX = 255
PAYLOAD_BYTES_MAX = 1_048_576  # the schema's bound; the API enforces its own, smaller limit
BATCH_REQUESTS_MAX = 1000
ATTEMPTS_MAX_LIMIT = 50  # the schema's bound on deliveries.attempts_max
TARGET_ENDPOINTS_MAX = 100  # a targeted request (a replay) names at most this many endpoints


@dataclass(frozen=True)
class MessageRequest:
    account_id: uuid.UUID
    event_type: str
    payload: bytes
    idempotency_key: str | None = None
    # None fans out to every subscribed endpoint. Given (a replay), only these endpoints, each
    # of which must still be enabled and not deleted; their event type filters do not apply.
    endpoint_ids: tuple[uuid.UUID, ...] | None = None

    def request_hash(self) -> bytes:
        content = self.event_type.encode() + b"\0" + self.payload
        if self.endpoint_ids is not None:
            # The target is part of what was asked, so one key reused for another target conflicts.
            content += b"\0" + b"".join(endpoint_id.bytes for endpoint_id in self.endpoint_ids)
        return hashlib.sha256(content).digest()


@dataclass(frozen=True)
class CreatedDelivery:
    id: uuid.UUID
    endpoint_id: uuid.UUID
    price: int


@dataclass(frozen=True)
class MessageCreated:
    message_id: uuid.UUID
    account_id: uuid.UUID
    event_type: str
    deliveries: tuple[CreatedDelivery, ...]
    total_charged: int
    replayed: bool  # True when an idempotency key returned an earlier result


class CreateOutcomeUnknown(OutcomeUnknown):
    """The connection broke while a batch's COMMIT was in flight, so this side cannot tell whether
    it took effect. It did wholly or not at all; `resolve_outcome` asks the database which.

    Without this, "the write failed, nothing was written" would sometimes be untrue: a client that
    believed it and retried without an idempotency key would create, and pay for, the message twice.
    """

    def __init__(self, results: list, message_ids: list[uuid.UUID], transaction_id: int) -> None:
        super().__init__(f"the answer to COMMIT of {len(message_ids)} new messages was lost"
                         f" (transaction {transaction_id})", transaction_id, "it among your deliveries")
        self.results = results  # what the batch answers if it was written
        self.message_ids = message_ids  # the batch's new messages: all exist if it was written, none if not


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
    """Create a batch in one transaction; the result list matches the requests one to one.

    If the connection breaks while COMMIT is in flight: given a pool, this asks the database
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
        await _create_valid(executor, requests, valid, results, attempts_max)
    except CreateOutcomeUnknown as unknown:
        if not isinstance(executor, asyncpg.Pool):
            raise
        if await resolve_outcome(executor, unknown, wait_seconds=outcome_wait_seconds) is None:
            raise unknown.__cause__ from None  # type: ignore[misc]  # certainly not written: the original error
    return results  # type: ignore[return-value]


async def _create_valid(executor: Executor, requests: list[MessageRequest], valid: list[int], results: list,
                        attempts_max: int) -> None:
    # Only a top-level COMMIT decides; in a caller's transaction this is a savepoint, and the
    # caller's own COMMIT is theirs to resolve.
    top_level = isinstance(executor, asyncpg.Pool) or not executor.is_in_transaction()
    committing: _Plan | None = None
    try:
        async with transaction(executor) as connection:
            plan = await _Plan.load(connection, [requests[index] for index in valid])
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


async def resolve_outcome(pool: asyncpg.Pool, unknown: CreateOutcomeUnknown, *,
                          wait_seconds: float = OUTCOME_WAIT_SECONDS) -> list[MessageCreated | BillingError] | None:
    """Whether the batch behind `unknown` was written: its results if it was, None if nothing was.

    Asks PostgreSQL for the status of the batch's transaction (`billing.database.transaction_status`);
    raises `unknown` again if it cannot tell within `wait_seconds`: the database unreachable all
    that time, or the transaction still open.
    """
    committed = await transaction_status(pool, unknown.transaction_id, wait_seconds=wait_seconds)
    if committed is None:
        raise unknown
    return unknown.results if committed else None


class _Plan:
    """What one batch will write, decided in memory after the accounts are locked."""

    def __init__(self, accounts, endpoints, replays, transaction_id: int) -> None:
        self.transaction_id = transaction_id  # pg_current_xact_id(), for resolve_outcome
        self.accounts = accounts  # account id -> locked row
        self.balances = {account_id: row["balance"] for account_id, row in accounts.items()}
        self.endpoints = endpoints  # account id -> [(endpoint id, event types)]
        self.replays = replays  # (account id, key) -> (request hash, MessageCreated)
        self.messages: list[tuple] = []
        self.deliveries: list[tuple] = []

    @classmethod
    async def load(cls, connection, requests: list[MessageRequest]) -> _Plan:
        account_ids = sorted({request.account_id for request in requests})
        # Only the endpoints some request of the batch can go to: those subscribed to every type
        # or to one of the batch's types, or every live one when a request names its endpoints
        # (it may name one not subscribed to its type). An account with endpoints for many types
        # would otherwise return a row for each, per batch: at fan-out 1 in bench_ingest, four
        # rows per account where one is used.
        event_types = None
        if all(request.endpoint_ids is None for request in requests):
            event_types = sorted({request.event_type for request in requests})
        # One round trip: lock the accounts in id order and read their live endpoints.
        rows = await connection.fetch(_LOCK_ACCOUNTS_READ_ENDPOINTS, account_ids, event_types)
        accounts = {}
        endpoints = defaultdict(list)
        for row in rows:
            accounts.setdefault(row["id"], row)
            if row["endpoint_id"] is not None:
                endpoints[row["id"]].append((row["endpoint_id"], row["event_types"]))
        keyed = [r for r in requests if r.idempotency_key is not None and r.account_id in accounts]
        replays = await _load_replays(connection, keyed) if keyed else {}
        return cls(accounts, endpoints, replays, rows[0]["transaction_id"] if rows else 0)

    def decide(self, request: MessageRequest, attempts_max: int) -> MessageCreated | BillingError:
        account = self.accounts.get(request.account_id)
        if account is None:
            return AccountNotFound(f"no account {request.account_id}")
        key = (request.account_id, request.idempotency_key)
        if request.idempotency_key is not None and key in self.replays:
            stored_hash, stored = self.replays[key]
            if stored_hash != request.request_hash():
                return IdempotencyConflict(
                    f"idempotency key {request.idempotency_key!r} was used with a different request"
                )
            return stored
        if account["status"] != "active":
            return AccountNotActive(f"account {request.account_id} is {account['status']}")
        subscribed = self._targets(request)
        if isinstance(subscribed, BillingError):
            return subscribed
        price = account["price_per_delivery"]
        total = price * len(subscribed)
        if self.balances[request.account_id] < total:
            return InsufficientBalance(
                f"balance {self.balances[request.account_id]} cannot cover {len(subscribed)}"
                f" deliveries at {price} credits each ({total})"
            )
        self.balances[request.account_id] -= total
        created = self._add(request, subscribed, price, attempts_max)
        if request.idempotency_key is not None:
            self.replays[key] = (request.request_hash(), _replayed(created))
        return created

    def _targets(self, request: MessageRequest) -> list[uuid.UUID] | BillingError:
        live = self.endpoints.get(request.account_id, ())
        if request.endpoint_ids is None:
            return [
                endpoint_id for endpoint_id, event_types in live if event_types is None or request.event_type in event_types
            ]
        live_ids = {endpoint_id for endpoint_id, _ in live}
        missing = [endpoint_id for endpoint_id in request.endpoint_ids if endpoint_id not in live_ids]
        if missing:
            return InvalidInput(
                f"endpoint {missing[0]} is not an enabled, undeleted endpoint of account {request.account_id}"
            )
        return list(request.endpoint_ids)

    def _add(self, request: MessageRequest, subscribed, price: int, attempts_max: int) -> MessageCreated:
        message_id, *delivery_ids = ids.new_ids(1 + len(subscribed))
        self.messages.append(
            (message_id, request.account_id, request.event_type, request.payload,
             request.idempotency_key, request.request_hash() if request.idempotency_key else None)
        )
        created = []
        for endpoint_id, delivery_id in zip(subscribed, delivery_ids, strict=True):
            self.deliveries.append((delivery_id, request.account_id, message_id, endpoint_id, price, attempts_max))
            created.append(CreatedDelivery(delivery_id, endpoint_id, price))
        return MessageCreated(
            message_id, request.account_id, request.event_type, tuple(created), price * len(created), replayed=False
        )

    async def write(self, connection) -> None:
        """The whole batch in one statement: messages, deliveries, their charges, the balances."""
        if not self.messages:
            return
        deliveries = list(zip(*self.deliveries)) or [[], [], [], [], [], []]
        changed = [(account_id, balance) for account_id, balance in self.balances.items()
                   if balance != self.accounts[account_id]["balance"]]
        balances = list(zip(*changed)) or [[], []]
        await connection.execute(_WRITE_BATCH, *zip(*self.messages), *deliveries, *balances)


# Lock the batch's accounts in id order and read their live endpoints, in one round trip; $2 the
# batch's event types, or NULL for every live endpoint.
# LATERAL with OFFSET 0 (which keeps PostgreSQL from flattening it into a plain join): one index
# probe of endpoints per locked account, whatever the statistics say. Without them, the plain join
# scanned and sorted every endpoint of every account: 3.2 ms a batch, not 0.2.
# pg_current_xact_id(): the transaction's id, for resolve_outcome; locking the rows assigns it
# anyway, so asking costs nothing.
_LOCK_ACCOUNTS_READ_ENDPOINTS = (
    "SELECT a.id, a.status, a.balance, a.price_per_delivery, e.id AS endpoint_id, e.event_types,"
    "   pg_current_xact_id() AS transaction_id"
    " FROM accounts a LEFT JOIN LATERAL ("
    "   SELECT e.id, e.event_types FROM endpoints e"
    "   WHERE e.account_id = a.id AND e.enabled AND e.deleted_at IS NULL"
    "     AND ($2::text[] IS NULL OR e.event_types IS NULL OR e.event_types && $2::text[]) OFFSET 0) e ON true"
    " WHERE a.id = ANY($1::uuid[]) ORDER BY a.id, e.id FOR UPDATE OF a"
)

# One charge per delivery, its id derived from the delivery id (invariant I1), written in the
# same statement as the delivery, and the balances moved in that statement too.
_WRITE_BATCH = (
    "WITH message_rows AS ("
    "   INSERT INTO messages (id, account_id, event_type, payload, idempotency_key, request_hash)"
    "   SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bytea[], $5::text[], $6::bytea[])),"
    " delivery_rows AS ("
    "   INSERT INTO deliveries (id, account_id, message_id, endpoint_id, price, attempts_max)"
    "   SELECT * FROM unnest($7::uuid[], $8::uuid[], $9::uuid[], $10::uuid[], $11::bigint[], $12::int[])"
    "   RETURNING id, account_id, price),"
    " charge_rows AS ("
    "   INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount)"
    "   SELECT 'charge:' || id, account_id, id, 'charge', -price FROM delivery_rows)"
    " UPDATE accounts SET balance = t.balance FROM unnest($13::uuid[], $14::bigint[]) AS t(id, balance)"
    " WHERE accounts.id = t.id"
)


def _replayed(created: MessageCreated) -> MessageCreated:
    return MessageCreated(
        created.message_id, created.account_id, created.event_type, created.deliveries, created.total_charged, True
    )


async def _load_replays(connection, requests: list[MessageRequest]) -> dict:
    """Earlier results for the batch's idempotency keys, read after the accounts are locked."""
    rows = await connection.fetch(
        "SELECT m.id, m.account_id, m.event_type, m.idempotency_key, m.request_hash,"
        "   coalesce(array_agg(d.id ORDER BY d.id) FILTER (WHERE d.id IS NOT NULL), '{}') AS delivery_ids,"
        "   coalesce(array_agg(d.endpoint_id ORDER BY d.id) FILTER (WHERE d.id IS NOT NULL), '{}') AS endpoint_ids,"
        "   coalesce(array_agg(d.price ORDER BY d.id) FILTER (WHERE d.id IS NOT NULL), '{}') AS prices"
        " FROM messages m JOIN unnest($1::uuid[], $2::text[]) AS k(account_id, idempotency_key)"
        "   ON m.account_id = k.account_id AND m.idempotency_key = k.idempotency_key"
        " LEFT JOIN deliveries d ON d.message_id = m.id"
        " GROUP BY m.id",
        [request.account_id for request in requests],
        [request.idempotency_key for request in requests],
    )
    replays = {}
    for row in rows:
        deliveries = tuple(
            CreatedDelivery(d, e, p) for d, e, p in zip(row["delivery_ids"], row["endpoint_ids"], row["prices"])
        )
        created = MessageCreated(
            row["id"], row["account_id"], row["event_type"], deliveries, sum(d.price for d in deliveries), True
        )
        replays[(row["account_id"], row["idempotency_key"])] = (row["request_hash"], created)
    return replays
