"""What one batch of creates writes: read the accounts and endpoints, decide each request in
memory, write the batch in one statement.

Two ways to run it (billing.messages chooses):
- locked: inside a transaction, the read locks the accounts in id order (FOR UPDATE), and the
  write sets the balances the plan computed. Four round trips: BEGIN, read, write, COMMIT.
- unlocked: the read locks nothing and the write is one autocommit statement that locks the
  accounts in id order itself and writes the batch only if every account still passes what the
  plan assumed (active, the same price, a balance that covers its charges), else nothing. Two
  round trips; a batch that wrote nothing is then decided again, locked.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from billing import ids
from billing.errors import (
    AccountNotActive,
    ApplicationNotFound,
    AccountNotFound,
    BillingError,
    IdempotencyConflict,
    InsufficientBalance,
    InvalidInput,
)


@dataclass(frozen=True)
class MessageRequest:
    account_id: uuid.UUID
    event_type: str
    payload: bytes
    idempotency_key: str | None = None
    # None fans out to every subscribed endpoint. Given (a replay), only these endpoints, each
    # of which must still be enabled and not deleted; their event type filters do not apply.
    endpoint_ids: tuple[uuid.UUID, ...] | None = None
    # A replay: the delivery it sends again. Part of what was asked, as the target is. Written on
    # its deliveries (deliveries.replay_of): what tells the recovery and the operator's bulk
    # replay that a dead delivery was replayed, whoever replayed it and under whatever key.
    replay_of: uuid.UUID | None = None
    # The application it is sent to (an application of the account, checked by the caller); None,
    # or the account's own id, is the account's default application. A targeted request (a
    # replay) goes to its endpoints' application, which must then be this one if given.
    application_id: uuid.UUID | None = None
    # The uid the sender named the application by, if it named it so: the write then checks that
    # the application still has this uid. The API resolves a uid through a per-process cache, and
    # another API process may have moved the uid to another application meanwhile; without the
    # check, a message could go to the application that had the uid a moment ago. None: not named
    # by uid. Not part of what was asked (the application's id is): the request hash leaves it out.
    application_uid: str | None = None
    # Up to MESSAGE_CHANNELS_MAX channels: only endpoints that filter on no channel, or on one of
    # these, receive it. None: no channels.
    channels: tuple[str, ...] | None = None
    # The W3C traceparent of the request's span (delivery.tracing), kept with the message so that
    # every attempt of its deliveries joins that trace; None when tracing is off. Not part of what
    # was asked: the request hash leaves it out.
    trace_context: str | None = None

    @property
    def application(self) -> uuid.UUID | None:
        """The application named, None for the default (whose id is the account's)."""
        return None if self.application_id == self.account_id else self.application_id

    @property
    def application_checked(self) -> bool:
        """Whether the write checks the request's application: one other than the default, which
        may have been deleted, or any named by uid, whose uid may have moved."""
        return self.application is not None or self.application_uid is not None

    def request_hash(self) -> bytes:
        content = self.event_type.encode() + b"\0" + self.payload
        if self.application is not None:
            # One key reused for another application conflicts (and the default's hash is as before).
            content += b"\0application\0" + self.application.bytes
        if self.channels is not None:
            content += b"\0channels\0" + CHANNEL_SEPARATOR.join(self.channels).encode()
        if self.endpoint_ids is not None:
            # The target is part of what was asked, so one key reused for another target conflicts.
            content += b"\0" + b"".join(endpoint_id.bytes for endpoint_id in self.endpoint_ids)
        if self.replay_of is not None:
            # So does the delivery replayed: one key reused to replay another one conflicts.
            content += b"\0replay\0" + self.replay_of.bytes
        return hashlib.sha256(content).digest()


# Channels travel to the statements joined by this (a channel is letters, digits and _ . : -), one
# text per message: unnest would flatten an array of arrays.
CHANNEL_SEPARATOR = ","


def subscribed(event_type: str, event_types, prefixes) -> bool:
    """Whether an endpoint subscribed to `event_types` (None: every type), whose wildcard
    subscriptions ("invoice.*") have `prefixes` ("invoice."), takes `event_type`."""
    return (event_types is None or event_type in event_types
            or (prefixes is not None and any(event_type.startswith(prefix) for prefix in prefixes)))


def in_channels(message_channels, endpoint_channels) -> bool:
    """Whether an endpoint filtering on `endpoint_channels` (None: on none) takes a message of `message_channels`."""
    return endpoint_channels is None or bool(message_channels and not set(endpoint_channels).isdisjoint(message_channels))


def joined_channels(request: MessageRequest) -> str | None:
    return None if request.channels is None else CHANNEL_SEPARATOR.join(request.channels)


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


class Plan:
    """What one batch will write, decided in memory after the accounts are read."""

    def __init__(self, accounts, endpoints, targets, applications, replays, transaction_id: int,
                 read_at: datetime | None) -> None:
        self.transaction_id = transaction_id  # locked: pg_current_xact_id(), for resolve_outcome
        self.read_at = read_at  # unlocked: when the read ran on this connection's backend, ditto
        self.accounts = accounts  # account id -> its row as read (locked, or not)
        self.balances = {account_id: row["balance"] for account_id, row in accounts.items()}
        # (account id, application id) -> [(endpoint id, event types, wildcard prefixes, channels)]
        self.endpoints = endpoints
        self.targets = targets  # endpoint id -> (account id, application id): the live endpoints targeted
        self.applications = applications  # (account id, application id) -> uid: the live applications named
        self.replays = replays  # (account id, key) -> (request hash, MessageCreated)
        self.messages: list[tuple] = []
        self.message_applications: list[uuid.UUID] = []  # beside each message: its application
        self.message_channels: list[str | None] = []  # beside each message: its channels, joined
        self.deliveries: list[tuple] = []
        self.replay_of: list[uuid.UUID | None] = []  # beside each delivery: the delivery it replays, if any
        self.trace_contexts: list[str | None] = []  # beside each message: its trace context, if any

    @classmethod
    async def load(cls, connection, requests: list[MessageRequest], *, lock: bool = True) -> Plan:
        account_ids = sorted({request.account_id for request in requests})
        # Only the endpoints some request of the batch can go to: those of the applications the
        # batch sends to, subscribed to every type or to one of the batch's types, and the live
        # ones a request names (it may name one not subscribed to its type). An account with
        # endpoints for many types would otherwise return a row for each, per batch: at fan-out 1
        # in bench_ingest, four rows per account where one is used.
        fanned = sorted({(request.account_id, request.application_id or request.account_id)
                         for request in requests if request.endpoint_ids is None})
        event_types = sorted({request.event_type for request in requests if request.endpoint_ids is None})
        targeted = sorted({endpoint_id for request in requests for endpoint_id in request.endpoint_ids or ()})
        # One round trip: read the accounts (locked in id order, or not) and those endpoints.
        read = LOCK_ACCOUNTS_READ_ENDPOINTS if lock else READ_ACCOUNTS_ENDPOINTS
        rows = await connection.fetch(read, account_ids, event_types, [pair[0] for pair in fanned],
                                      [pair[1] for pair in fanned], targeted)
        accounts = {}
        endpoints = defaultdict(list)
        targets = {}
        for row in rows:
            accounts.setdefault(row["id"], row)
            if row["endpoint_id"] is None:
                continue
            if row["targeted"]:
                targets[row["endpoint_id"]] = (row["id"], row["application_id"])
            else:
                endpoints[row["id"], row["application_id"]].append(
                    (row["endpoint_id"], row["event_types"], row["event_type_prefixes"], row["channels"]))
        named = sorted({(request.account_id, request.application_id or request.account_id) for request in requests
                        if request.application_checked})
        applications = {}
        if named:  # the live applications the batch names (an account's default is never deleted), and their uids
            applications = {(row["account_id"], row["id"]): row["uid"] for row in await connection.fetch(
                _LIVE_APPLICATIONS, [account_id for account_id, _ in named], [application for _, application in named])}
        keyed = [r for r in requests if r.idempotency_key is not None and r.account_id in accounts]
        replays = await _load_replays(connection, keyed) if keyed else {}
        transaction_id = rows[0]["transaction_id"] if rows and lock else 0
        return cls(accounts, endpoints, targets, applications, replays, transaction_id,
                   rows[0]["read_at"] if rows and not lock else None)

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
        targets = self._targets(request)
        if isinstance(targets, BillingError):
            return targets
        application_id, subscribed = targets
        price = account["price_per_delivery"]
        total = price * len(subscribed)
        if self.balances[request.account_id] < total:
            return InsufficientBalance(
                f"balance {self.balances[request.account_id]} cannot cover {len(subscribed)}"
                f" deliveries at {price} credits each ({total})"
            )
        self.balances[request.account_id] -= total
        created = self._add(request, application_id, subscribed, price, attempts_max)
        if request.idempotency_key is not None:
            self.replays[key] = (request.request_hash(), _replayed(created))
        return created

    def _targets(self, request: MessageRequest) -> tuple[uuid.UUID, list[uuid.UUID]] | BillingError:
        """The request's application and the endpoints it goes to."""
        if request.application_checked:
            named = (request.account_id, request.application_id or request.account_id)
            if named not in self.applications or (request.application_uid is not None
                                                  and self.applications[named] != request.application_uid):
                return ApplicationNotFound(f"no live application {named[1]} of account {request.account_id}"
                                           + ("" if request.application_uid is None
                                              else f" with uid {request.application_uid!r}"))
        if request.endpoint_ids is None:
            application_id = request.application_id or request.account_id
            live = self.endpoints.get((request.account_id, application_id), ())
            return application_id, [
                endpoint_id for endpoint_id, event_types, prefixes, channels in live
                if subscribed(request.event_type, event_types, prefixes) and in_channels(request.channels, channels)
            ]
        found = [self.targets.get(endpoint_id) for endpoint_id in request.endpoint_ids]
        for endpoint_id, target in zip(request.endpoint_ids, found, strict=True):
            if target is None or target[0] != request.account_id:
                return InvalidInput(
                    f"endpoint {endpoint_id} is not an enabled, undeleted endpoint of account {request.account_id}"
                )
        applications = {application_id for _, application_id in found}
        if len(applications) > 1 or (request.application_id is not None
                                     and applications != {request.application_id}):
            return InvalidInput("the endpoints of a targeted message must all belong to its one application")
        return applications.pop(), list(request.endpoint_ids)

    def _add(self, request: MessageRequest, application_id: uuid.UUID, subscribed, price: int,
             attempts_max: int) -> MessageCreated:
        message_id, *delivery_ids = ids.new_ids(1 + len(subscribed))
        self.message_applications.append(application_id)
        self.message_channels.append(joined_channels(request))
        self.messages.append(
            (message_id, request.account_id, request.event_type, request.payload,
             request.idempotency_key, request.request_hash() if request.idempotency_key else None)
        )
        self.trace_contexts.append(request.trace_context)
        created = []
        for endpoint_id, delivery_id in zip(subscribed, delivery_ids, strict=True):
            self.deliveries.append((delivery_id, request.account_id, message_id, endpoint_id, price, attempts_max))
            self.replay_of.append(request.replay_of)
            created.append(CreatedDelivery(delivery_id, endpoint_id, price))
        return MessageCreated(
            message_id, request.account_id, request.event_type, tuple(created), price * len(created), replayed=False
        )

    def _rows(self) -> list:
        """The write's $1 to $12: the messages' columns, then the deliveries' (empty ones when no
        message of the batch goes to any endpoint)."""
        return [*zip(*self.messages), *(list(zip(*self.deliveries)) or [[]] * 6)]

    def _traces(self) -> list | None:
        """The messages' trace contexts, last of the write's parameters: a NULL array (no element
        encoded; unnest pads it with NULLs) when no message of the batch has one."""
        return self.trace_contexts if any(self.trace_contexts) else None

    def _replays(self) -> bool:
        """Whether a delivery of the batch replays one: then the write carries the replay_of column."""
        return any(replayed is not None for replayed in self.replay_of)

    async def write(self, connection) -> None:
        """Locked: the whole batch in one statement: messages, deliveries, their charges, the balances."""
        if not self.messages:
            return
        changed = [(account_id, balance) for account_id, balance in self.balances.items()
                   if balance != self.accounts[account_id]["balance"]]
        balances = list(zip(*changed)) or [[], []]
        if self._replays():
            await connection.execute(WRITE_BATCH_REPLAYS, *self._rows(), *balances, self.replay_of, self._traces(),
                                     self.message_applications, self.message_channels)
        else:
            await connection.execute(WRITE_BATCH, *self._rows(), *balances, self._traces(), self.message_applications,
                                     self.message_channels)

    async def write_gated(self, connection) -> bool:
        """Unlocked: one autocommit statement writes the whole batch if every account with new
        messages still passes what the plan assumed, and nothing if one does not; whether it wrote."""
        accounts = sorted({account_id for _, account_id, *_ in self.messages})
        replays = self._replays()
        return await connection.fetchval(
            GATED_WRITE_REPLAYS if replays else GATED_WRITE, *self._rows(), accounts,
            [self.accounts[account_id]["balance"] - self.balances[account_id] for account_id in accounts],
            [self.accounts[account_id]["price_per_delivery"] for account_id in accounts],
            *([self.replay_of] if replays else []), self._traces(),
            self.message_applications, self.message_channels,
        )


# The live applications among the (account $1, application $2) pairs a batch names, with their uids.
_LIVE_APPLICATIONS = (
    "SELECT ap.id, ap.account_id, ap.uid FROM unnest($1::uuid[], $2::uuid[]) AS k(account_id, id)"
    " JOIN applications ap ON ap.account_id = k.account_id AND ap.id = k.id"
    " WHERE ap.account_id = ANY($1::uuid[]) AND ap.deleted_at IS NULL"
)

# Read the batch's accounts and the endpoints it can go to, in one round trip. $1 the accounts;
# $3, $4 the (account, application) pairs the batch fans out to, and $2 the event types of the
# requests that fan out; $5 the endpoints targeted by the requests that name theirs (a replay),
# with whichever application and event types they have, among the endpoints of the batch's
# accounts (every statement names its accounts: a distributed table prunes to their shards). Locked: FOR UPDATE of the accounts, in id
# order (LockRows above the Sort). LATERAL with OFFSET 0 (which keeps PostgreSQL from flattening it
# into a plain join): one probe of ix_endpoints_application_id_account_id per pair, whatever the statistics
# say; a plain join once scanned and sorted every endpoint of every account, 3.2 ms a batch, not 0.2.
# Locked, pg_current_xact_id(): the transaction's id, for resolve_outcome; locking the rows
# assigns it anyway, so asking costs nothing. Unlocked, statement_timestamp(): a moment at which
# this connection's backend was alive, which tells it apart from a later one with the same pid.
_READ_ACCOUNTS_ENDPOINTS = (
    "WITH account AS MATERIALIZED ("
    "   SELECT a.id, a.status, a.balance, a.price_per_delivery, {marker} FROM accounts a"
    "   WHERE a.id = ANY($1::uuid[]) ORDER BY a.id{lock}),"
    " endpoint AS ("
    "   SELECT k.account_id, e.*, false AS targeted"
    "   FROM unnest($3::uuid[], $4::uuid[]) AS k(account_id, application_id) CROSS JOIN LATERAL ("
    "     SELECT e.id, e.application_id, e.event_types, e.event_type_prefixes, e.channels FROM endpoints e"
    "     WHERE e.application_id = k.application_id AND e.account_id = k.account_id"
    "       AND e.account_id = ANY($1::uuid[]) AND e.enabled AND e.deleted_at IS NULL"
    "       AND (e.event_types IS NULL OR e.event_types && $2::text[] OR e.event_type_prefixes IS NOT NULL) OFFSET 0) e"
    "   UNION ALL"
    "   SELECT e.account_id, e.id, e.application_id, e.event_types, e.event_type_prefixes, e.channels, true"
    "   FROM endpoints e WHERE e.account_id = ANY($1::uuid[]) AND e.id = ANY($5::uuid[])"
    "     AND e.enabled AND e.deleted_at IS NULL)"
    " SELECT a.*, e.id AS endpoint_id, e.application_id, e.event_types, e.event_type_prefixes, e.channels, e.targeted"
    " FROM account a LEFT JOIN endpoint e ON e.account_id = a.id ORDER BY a.id, e.id"
)
LOCK_ACCOUNTS_READ_ENDPOINTS = _READ_ACCOUNTS_ENDPOINTS.format(
    marker="pg_current_xact_id() AS transaction_id", lock=" FOR UPDATE OF a")
READ_ACCOUNTS_ENDPOINTS = _READ_ACCOUNTS_ENDPOINTS.format(marker="statement_timestamp() AS read_at", lock="")

# The batch's rows: its messages, its deliveries, and one charge per delivery, its id derived
# from the delivery id (invariant I1), written in the same statement as the delivery. {only}
# limits the inserts (the unlocked write's "ok"); $1 to $12 the columns, ${trace} the messages' trace
# contexts. {deliveries}: the deliveries' rows (below), with, for a batch that replays a delivery,
# their replay_of and webhook_id.
_INSERT_BATCH = (
    " message_rows AS ("
    "   INSERT INTO messages (id, account_id, event_type, payload, idempotency_key, request_hash, trace_context,"
    "     application_id, channels)"
    "   SELECT m.id, m.account_id, m.event_type, m.payload, m.idempotency_key, m.request_hash, m.trace_context,"
    "     m.application_id, string_to_array(m.channels, '" + CHANNEL_SEPARATOR + "')"
    "   FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bytea[], $5::text[], $6::bytea[],"
    "     ${trace}::text[], ${application}::uuid[], ${channels}::text[])"
    "     AS m(id, account_id, event_type, payload, idempotency_key, request_hash, trace_context, application_id,"
    "       channels){only}),"
    " delivery_rows AS ("
    "   INSERT INTO deliveries {deliveries}{only}"
    "   RETURNING id, account_id, price),"
    " charge_rows AS ("
    "   INSERT INTO ledger_entries (id, account_id, delivery_id, kind, amount)"
    "   SELECT 'charge:' || id, account_id, id, 'charge', -price FROM delivery_rows)"
)


_DELIVERIES = (
    "(id, account_id, message_id, endpoint_id, price, attempts_max)"
    " SELECT * FROM unnest($7::uuid[], $8::uuid[], $9::uuid[], $10::uuid[], $11::bigint[], $12::int[])"
)
# A replay is sent under the webhook-id of the delivery it replays (Standard Webhooks: the
# receiver's idempotency key is the same however often one webhook is sent): the id that one was
# sent under, its own unless it is a replay too, so a chain of replays keeps the first one's. Read
# from a delivery of the same account (one primary-key probe per replay); NULL where the row
# replays none. {replay_of}: the number of the parameter that carries each row's replay_of.
_REPLAY_DELIVERIES = (
    "(id, account_id, message_id, endpoint_id, price, attempts_max, replay_of, webhook_id)"
    " SELECT u.*, (SELECT coalesce(r.webhook_id, r.id) FROM deliveries r"
    "   WHERE r.account_id = ANY($8::uuid[]) AND r.account_id = u.account_id AND r.id = u.replay_of)"
    " FROM unnest($7::uuid[], $8::uuid[], $9::uuid[], $10::uuid[], $11::bigint[], $12::int[], ${replay_of}::uuid[])"
    " AS u(id, account_id, message_id, endpoint_id, price, attempts_max, replay_of)"
)


def _insert_batch(only: str, replay_of: int | None, trace: int) -> str:
    """The inserts; with `replay_of`, the number of the parameter that carries each delivery's
    replay_of; `trace`, that of the messages' trace contexts, and the two after it their
    applications and their channels (each statement's last three)."""
    deliveries = _DELIVERIES if replay_of is None else _REPLAY_DELIVERIES.format(replay_of=replay_of)
    return _INSERT_BATCH.format(only=only, deliveries=deliveries, trace=trace, application=trace + 1,
                                channels=trace + 2)


# The locked write: the rows, and the balances the plan computed ($13, $14), in one statement.
def _write_batch(replay_of: int | None) -> str:
    return (
        "WITH" + _insert_batch("", replay_of, 15 if replay_of is None else replay_of + 1) +
        " UPDATE accounts SET balance = t.balance, balance_exhausted_armed = true"
        " FROM unnest($13::uuid[], $14::bigint[]) AS t(id, balance)"
        " WHERE accounts.id = ANY($13::uuid[]) AND accounts.id = t.id"
    )


# The unlocked write, one autocommit statement, all or nothing. "locked" takes the row locks of
# the accounts that still pass, in id order (LockRows above the Sort, as in the locked read, so
# this never deadlocks with either): active, at the plan's price, with a balance covering the
# plan's total. A row changed by a concurrent write is checked again on its newest version once
# locked. Only if every account passes ("ok") are the balances moved and the rows inserted; the
# statement answers "ok". $13 to $15: the accounts with new messages, the total each is charged,
# the price the plan used.
def _gated_write(replay_of: int | None) -> str:
    return (
        "WITH locked AS ("
        "   SELECT a.id FROM accounts a, unnest($13::uuid[], $14::bigint[], $15::bigint[]) AS t(id, total, price)"
        "   WHERE a.id = ANY($13::uuid[]) AND a.id = t.id AND a.status = 'active' AND a.price_per_delivery = t.price"
        "     AND a.balance >= t.total"
        "   ORDER BY a.id FOR UPDATE OF a),"
        " ok AS (SELECT count(*) = cardinality($13::uuid[]) AS ok FROM locked),"
        " gate AS ("
        "   UPDATE accounts a SET balance = a.balance - t.total, balance_exhausted_armed = true"
        "   FROM unnest($13::uuid[], $14::bigint[]) AS t(id, total), ok"
        "   WHERE ok.ok AND a.id = ANY($13::uuid[]) AND a.id = t.id),"
        + _insert_batch(" WHERE (SELECT ok FROM ok)", replay_of, 16 if replay_of is None else replay_of + 1) +
        " SELECT ok FROM ok"
    )


# Each comes twice. A batch that replays no delivery (every ordinary create that goes this way)
# sends the plain statement: its deliveries' replay_of and webhook_id are NULL, which costs
# nothing to write (the row has a null bitmap anyway) and nothing to send. A batch with a replay
# in it sends one more uuid array ($15, $16): each delivery's replay_of, NULL where it replays
# none; the statement reads each replayed delivery's webhook-id itself. Last come the messages'
# trace contexts (a NULL array while tracing is off), applications and channels.
WRITE_BATCH = _write_batch(None)
WRITE_BATCH_REPLAYS = _write_batch(15)
GATED_WRITE = _gated_write(None)
GATED_WRITE_REPLAYS = _gated_write(16)

def _replayed(created: MessageCreated) -> MessageCreated:
    return MessageCreated(
        created.message_id, created.account_id, created.event_type, created.deliveries, created.total_charged, True
    )


async def _load_replays(connection, requests: list[MessageRequest]) -> dict:
    """Earlier results for the batch's idempotency keys. Unlocked, a key written after this read
    makes the write fail on the unique index (nothing written), and the batch is decided locked."""
    rows = await connection.fetch(
        "SELECT m.id, m.account_id, m.event_type, m.idempotency_key, m.request_hash,"
        "   coalesce(array_agg(d.id ORDER BY d.id) FILTER (WHERE d.id IS NOT NULL), '{}') AS delivery_ids,"
        "   coalesce(array_agg(d.endpoint_id ORDER BY d.id) FILTER (WHERE d.id IS NOT NULL), '{}') AS endpoint_ids,"
        "   coalesce(array_agg(d.price ORDER BY d.id) FILTER (WHERE d.id IS NOT NULL), '{}') AS prices"
        " FROM messages m JOIN unnest($1::uuid[], $2::text[]) AS k(account_id, idempotency_key)"
        "   ON m.account_id = k.account_id AND m.idempotency_key = k.idempotency_key"
        " LEFT JOIN deliveries d ON d.account_id = m.account_id AND d.message_id = m.id"
        " GROUP BY m.account_id, m.id",
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
