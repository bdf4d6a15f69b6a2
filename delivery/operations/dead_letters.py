"""Dead letters: list, inspect and replay deliveries that died.

A replay is a NEW delivery with its own id and its own charge, created through
billing.messages.create_messages and targeted at the dead delivery's endpoint; the old
delivery stays dead and keeps its refund. Each replay carries the idempotency key
`replay:<dead delivery id>`, so a retried request (a double click, a network retry) replays a
dead delivery once; replaying it again on purpose is explicit (`again=True`, no key) and never
silently ignored (Outpost lost manual retries to a static key, hookdeck/outpost #670).

A replay is sent under the webhook-id of the delivery it replays (deliveries.webhook_id, set by
the create path from replay_of), so that a receiver deduplicating on webhook-id drops a replay of
a webhook it processed (its answer lost to a timeout) and processes one it never did.

Every replay records the delivery it replays on the new delivery (deliveries.replay_of): these,
keyed or not, and the API's (POST /v1/deliveries/{id}/replay, under the caller's Idempotency-Key
or none). Bulk replays and the API's recovery leave out a dead delivery that any replay replays,
so one replayed singly is not replayed and charged again by a recovery. The other way round is
left open on purpose: asked for by id, a single replay of a dead delivery that a bulk replay or a
recovery replayed already makes one more, charged (but for this module's keyed `replay`, which
shares their key and so answers their replay). The key `replay:<dead id>` stays what makes bulk
replays and recoveries that race write each dead delivery's replay at most once; replay_of only
says which dead deliveries were replayed.

Bulk replay of one endpoint's dead deliveries over a time range is two calls: `plan_bulk_replay`
computes the total charge, `bulk_replay` replays only when its `confirm_total` equals the total
computed again at that moment (the API's recovery, which plans and checks under the account's lock
itself, replays that plan with `replay_plan`), in batches of
REPLAY_BATCH_MAX through create_messages, at most REPLAY_PER_CALL_MAX per call; dead
deliveries replayed before (by anyone, above) are left out, so the next call goes on where this
one stopped.

A batch whose COMMIT answer was lost is resolved by asking the database (create_messages); when
it cannot tell in time, `ReplayOutcomeUnknown` says which replays were written before that batch
and which are in doubt. Keyed replays can then simply be run again: each is written at most once.

Accounts. The operator's reads (the listing, `inspect`, a replay or bulk replay asked by a delivery
or endpoint id alone) span accounts by nature: the operator names no account. Given the caller's
account (the account's dashboard, the API's recovery), the reads name it too. Joins between
account-scoped tables join on the account, and the replays are written by create_messages, whose
statements name their accounts.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from billing.errors import BillingError, DeliveryNotFound, InvalidInput
from billing.messages import OUTCOME_WAIT_SECONDS, CreateOutcomeUnknown, MessageCreated, MessageRequest, create_messages

PAGE_SIZE_MAX = 500
REPLAY_BATCH_MAX = 200  # requests per create_messages transaction (each holds a payload, up to 1 MiB)
REPLAY_PER_CALL_MAX = 5_000
ATTEMPTS_SHOWN_MAX = 50
REPLAY_KEY_PREFIX = "replay:"


class ReplayRefused(BillingError):
    """The replay was refused; nothing was written."""


class ReplayOutcomeUnknown(CreateOutcomeUnknown):
    """The connection broke while a batch of replays was committing and the database could not be
    asked in time whether it was written. `done` holds what earlier batches of the call wrote for
    certain; `in_doubt` the dead deliveries whose replays may or may not exist now."""

    def __init__(self, unknown: CreateOutcomeUnknown, done: Replayed, in_doubt: list[uuid.UUID], keyed: bool) -> None:
        super().__init__(unknown.results, unknown.message_ids, unknown.transaction_id)
        self.done = done
        self.in_doubt = in_doubt
        self.keyed = keyed  # keyed replays are safe to run again: each is written at most once


class ReplayTotalMismatch(ReplayRefused):
    """The confirmed total differs from the total charge computed now; nothing was replayed."""


@dataclass(frozen=True)
class DeadFilter:
    account_id: uuid.UUID | None = None
    endpoint_id: uuid.UUID | None = None
    reason: str | None = None
    died_after: datetime | None = None  # finished_at >= this
    died_before: datetime | None = None  # finished_at < this


@dataclass(frozen=True)
class DeadPage:
    rows: list[dict]
    next_cursor: str | None  # the id after which the next page starts (newest first)


# Newest first by id (time-ordered ids). The statement names only the filters given (and the
# cursor when there is one), so that PostgreSQL, in a generic plan too, estimates what a page
# reads: with every filter an "$n IS NULL OR ...", a generic plan took the filters' selectivity
# for tiny, read every dead delivery through a bitmap and sorted them (1,000 rows for a page of 50
# among 1,000 dead). Unfiltered, a page walks ix_deliveries_dead (the dead ones in id order)
# from the cursor; with an account or an endpoint, PostgreSQL picks between that and their own
# indexes. At most 2^6 statements, each prepared once per connection. The page of deliveries is
# chosen first and then joined to its endpoints and messages within each account: joined on the
# account before the LIMIT, PostgreSQL hashed every dead delivery against the endpoints and sorted
# them (2,500 rows for a page of 50).
_DEAD_COLUMNS = (
    "SELECT d.id, d.account_id, d.endpoint_id, d.message_id, d.price, d.dead_reason, d.attempt, d.created_at,"
    "   d.finished_at, e.url, m.event_type"
    " FROM (SELECT * FROM deliveries d WHERE d.state = 'dead'"
)
_DEAD_JOINS = (
    ") d JOIN endpoints e ON e.account_id = d.account_id AND e.id = d.endpoint_id"
    " JOIN messages m ON m.account_id = d.account_id AND m.id = d.message_id ORDER BY d.id DESC"
)
_DEAD_CONDITIONS = (
    "d.account_id = ${}::uuid", "d.endpoint_id = ${}::uuid", "d.dead_reason = ${}::text",
    "d.finished_at >= ${}::timestamptz", "d.finished_at < ${}::timestamptz", "d.id < ${}::uuid",
)


def _dead_page(filters: DeadFilter, after: uuid.UUID | None, limit: int) -> tuple[str, list]:
    """The statement for one page and its arguments: the conditions of the values given, then the size."""
    values = (filters.account_id, filters.endpoint_id, filters.reason, filters.died_after, filters.died_before, after)
    sql, arguments = [_DEAD_COLUMNS], []
    for condition, value in zip(_DEAD_CONDITIONS, values, strict=True):
        if value is not None:
            arguments.append(value)
            sql.append(" AND " + condition.format(len(arguments)))
    arguments.append(limit + 1)
    # One account's page is ordered by the account too: the order of its own dead deliveries'
    # index (ix_deliveries_account_dead), never of every account's (ix_deliveries_dead), which a
    # plan would walk through every account's dead deliveries looking for this one's.
    order = "d.account_id DESC, d.id DESC" if filters.account_id is not None else "d.id DESC"
    sql.append(f" ORDER BY {order} LIMIT ${len(arguments)}" + _DEAD_JOINS)
    return "".join(sql), arguments


# One delivery with its endpoint and message. {accounts}: each table filtered by the accounts $2 as
# well as joined on the delivery's, so that on partitioned (or distributed) tables the plan reads
# only those accounts' partitions (shards), as the claims' joins do (delivery.engine.claims).
_DELIVERY_OF = (
    "SELECT d.id, d.account_id, d.endpoint_id, d.message_id, d.price, d.state, d.dead_reason, d.attempt,"
    "   d.attempts_max, d.created_at, d.finished_at, d.replay_of, coalesce(d.webhook_id, d.id) AS webhook_id,"
    "   e.url, e.enabled, e.deleted_at AS endpoint_deleted_at,"
    "   m.event_type, octet_length(m.payload) AS payload_bytes"
    " FROM deliveries d JOIN endpoints e ON e.account_id = d.account_id AND e.id = d.endpoint_id{accounts_e}"
    " JOIN messages m ON m.account_id = d.account_id AND m.id = d.message_id{accounts_m}"
    " WHERE {accounts_d}d.id = $1"
)
_DELIVERY = _DELIVERY_OF.format(accounts_e=" AND e.account_id = ANY($2::uuid[])",
                                accounts_m=" AND m.account_id = ANY($2::uuid[])",
                                accounts_d="d.account_id = ANY($2::uuid[]) AND ")
# A delivery the operator names by its id alone. Its account is read first from its ledger entries
# (every delivery is written with its charge, which names it: ix_ledger_entries_delivery_id), then
# the delivery by its key (account_id, id). Only when that finds nothing (an id of no delivery, or
# a delivery with no entry on its own account: a broken ledger, which the audit reports) is it
# looked up by the bare id, a scan of every account's deliveries once the index on bare ids goes
# (a write on every delivery created; migration 0025 keeps it for the trigger functions' probes):
# an operator's rare read.
_ACCOUNTS_OF_DELIVERIES = "SELECT DISTINCT account_id FROM ledger_entries WHERE delivery_id = ANY($1::uuid[])"
_DELIVERY_BY_BARE_ID = _DELIVERY_OF.format(accounts_e="", accounts_m="", accounts_d="")
_ATTEMPTS = (
    "SELECT attempt, started_at, finished_at, status_code, latency_ms, error, response_excerpt, stale, sent_headers"
    " FROM delivery_attempts WHERE account_id = $3 AND delivery_id = $1 ORDER BY attempt DESC LIMIT $2"
)
# Its charge, refund and reclaim, and any adjustment tied to it by id (billing.adjustments).
_LEDGER = (
    "SELECT id, kind, amount, note, created_at FROM ledger_entries"
    " WHERE account_id = $2 AND (delivery_id = $1 OR id IN ('adjustment:' || $1::text || ':missing_charge',"
    "   'adjustment:' || $1::text || ':charge_difference', 'adjustment:' || $1::text || ':refund_on_live'))"
    " ORDER BY seq"
)
# The dead deliveries of one endpoint in a time range, not replayed yet (by anyone: no delivery
# replays it, through ix_deliveries_replay_of), oldest first; with the price a replay charges now
# (the account's current price). $4: at most this many. OFFSET 0 keeps the endpoint's dead
# deliveries read through its (endpoint_id, state) index and then sorted: without it, ORDER BY id
# LIMIT may walk ix_deliveries_dead, every account's dead deliveries in id order, looking for
# this endpoint's, and read them all when it has few (measured: 30,000 rows for none).
# {account}: with the caller's account, the endpoint's deliveries are read in that account ($5).
_BULK_CANDIDATES = (
    "SELECT d.id, d.account_id, (SELECT a.price_per_delivery FROM accounts a WHERE a.id = d.account_id) AS price"
    " FROM (SELECT id, account_id FROM deliveries"
    "       WHERE {account}endpoint_id = $1 AND state = 'dead' AND finished_at >= $2 AND finished_at < $3 OFFSET 0) d"
    " WHERE NOT EXISTS (SELECT FROM deliveries r WHERE r.replay_of = d.id AND r.account_id = d.account_id)"
    " ORDER BY d.id LIMIT $4"
)
_OPERATOR_BULK_CANDIDATES = _BULK_CANDIDATES.format(account="")
_ACCOUNT_BULK_CANDIDATES = _BULK_CANDIDATES.format(account="account_id = $5 AND ")
# The deliveries to replay, with their payloads; {account}: in the caller's account ($2), or in
# the accounts $2 (messages filtered by them too, as in _DELIVERY_OF).
_SOURCES = (
    "SELECT d.id, d.account_id, d.endpoint_id, m.event_type, m.payload, m.payload_erased_at FROM deliveries d"
    " JOIN messages m ON m.account_id = d.account_id AND m.id = d.message_id{messages}"
    " WHERE {account}d.id = ANY($1::uuid[]) AND d.state IN ('dead', 'delivered')"
    " ORDER BY d.id"
)
_OPERATOR_SOURCES = _SOURCES.format(account="", messages="")  # by bare ids: the fallback, as _DELIVERY_BY_BARE_ID
_ACCOUNT_SOURCES = _SOURCES.format(account="d.account_id = $2 AND ", messages="")
_ACCOUNTS_SOURCES = _SOURCES.format(account="d.account_id = ANY($2::uuid[]) AND ",
                                    messages=" AND m.account_id = ANY($2::uuid[])")


async def list_dead(pool: asyncpg.Pool, filters: DeadFilter = DeadFilter(), *, cursor: str | None = None,
                    limit: int = 50) -> DeadPage:
    """One page of dead deliveries, newest first, per account or across accounts."""
    if not 1 <= limit <= PAGE_SIZE_MAX:
        raise InvalidInput(f"limit must be 1 to {PAGE_SIZE_MAX}")
    after = _cursor(cursor)
    sql, arguments = _dead_page(filters, after, limit)
    rows = await pool.fetch(sql, *arguments)
    page = [dict(row) for row in rows[:limit]]
    return DeadPage(page, str(page[-1]["id"]) if len(rows) > limit else None)


def _cursor(cursor: str | None) -> uuid.UUID | None:
    if cursor is None:
        return None
    try:
        return uuid.UUID(cursor)
    except ValueError:
        raise InvalidInput("cursor is not one this listing returned") from None


async def inspect(pool: asyncpg.Pool, delivery_id: uuid.UUID) -> dict:
    """One delivery with its latest attempts (status, latency, errors, response excerpt) and ledger entries."""
    async with pool.acquire() as connection, connection.transaction(isolation="repeatable_read", readonly=True):
        accounts = [row[0] for row in await connection.fetch(_ACCOUNTS_OF_DELIVERIES, [delivery_id])]
        row = await connection.fetchrow(_DELIVERY, delivery_id, accounts) if accounts else None
        if row is None:
            row = await connection.fetchrow(_DELIVERY_BY_BARE_ID, delivery_id)
        if row is None:
            raise DeliveryNotFound(f"no delivery {delivery_id}")
        attempts = await connection.fetch(_ATTEMPTS, delivery_id, ATTEMPTS_SHOWN_MAX, row["account_id"])
        ledger = await connection.fetch(_LEDGER, delivery_id, row["account_id"])
    return {"delivery": dict(row), "attempts": [dict(a) for a in attempts], "ledger": [dict(e) for e in ledger]}


@dataclass
class Replayed:
    """What a replay did: old delivery id -> the new delivery (or why it was refused)."""

    created: dict[uuid.UUID, uuid.UUID] = field(default_factory=dict)
    already: dict[uuid.UUID, uuid.UUID] = field(default_factory=dict)  # replayed before; nothing charged now
    refused: dict[uuid.UUID, str] = field(default_factory=dict)
    charged: int = 0


async def replay(pool: asyncpg.Pool, delivery_id: uuid.UUID, *, attempts_max: int, again: bool = False,
                 outcome_wait_seconds: float = OUTCOME_WAIT_SECONDS, account_id: uuid.UUID | None = None) -> Replayed:
    """Replay one dead (or delivered) delivery as a new delivery to its endpoint, with a new charge,
    as the API's replay does; bulk replays take dead deliveries only. `account_id`: the caller's
    account (None: the operator's, any account)."""
    result = await _replay(pool, [delivery_id], attempts_max=attempts_max, keyed=not again,
                           outcome_wait_seconds=outcome_wait_seconds, account_id=account_id)
    if delivery_id in result.refused:
        raise ReplayRefused(result.refused[delivery_id])
    return result


@dataclass(frozen=True)
class BulkReplayPlan:
    endpoint_id: uuid.UUID
    delivery_ids: tuple[uuid.UUID, ...]
    total_charge: int
    more: bool  # more dead deliveries match than one call replays
    account_id: uuid.UUID | None = None  # the caller's account it was planned in (None: the operator's)


async def plan_bulk_replay(pool: asyncpg.Pool, endpoint_id: uuid.UUID, died_after: datetime,
                           died_before: datetime, *, limit: int = REPLAY_PER_CALL_MAX,
                           account_id: uuid.UUID | None = None) -> BulkReplayPlan:
    """What a bulk replay would do now, and what it would charge. Writes nothing. `account_id`:
    the caller's account, the endpoint's (None: the operator's)."""
    if not 1 <= limit <= REPLAY_PER_CALL_MAX:
        raise InvalidInput(f"limit must be 1 to {REPLAY_PER_CALL_MAX}")
    if account_id is None:
        rows = await pool.fetch(_OPERATOR_BULK_CANDIDATES, endpoint_id, died_after, died_before, limit + 1)
    else:
        rows = await pool.fetch(_ACCOUNT_BULK_CANDIDATES, endpoint_id, died_after, died_before, limit + 1, account_id)
    chosen = rows[:limit]
    return BulkReplayPlan(endpoint_id, tuple(row["id"] for row in chosen), sum(row["price"] for row in chosen),
                          len(rows) > limit, account_id)


async def bulk_replay(pool: asyncpg.Pool, endpoint_id: uuid.UUID, died_after: datetime, died_before: datetime,
                      *, confirm_total: int, attempts_max: int, limit: int = REPLAY_PER_CALL_MAX,
                      outcome_wait_seconds: float = OUTCOME_WAIT_SECONDS) -> Replayed:
    """Replay the endpoint's dead deliveries in the range if `confirm_total` equals the total charge now."""
    plan = await plan_bulk_replay(pool, endpoint_id, died_after, died_before, limit=limit)
    if confirm_total != plan.total_charge:
        raise ReplayTotalMismatch(
            f"the replay would charge {plan.total_charge} credits for {len(plan.delivery_ids)} deliveries,"
            f" but {confirm_total} was confirmed; nothing was replayed"
        )
    return await replay_plan(pool, plan, attempts_max=attempts_max, outcome_wait_seconds=outcome_wait_seconds)


async def replay_plan(executor: asyncpg.Pool | asyncpg.Connection, plan: BulkReplayPlan, *, attempts_max: int,
                      outcome_wait_seconds: float = OUTCOME_WAIT_SECONDS) -> Replayed:
    """Replay a plan's dead deliveries, keyed, as planned: for a caller that checked the plan's total
    itself and holds the account's lock since it planned (so nothing it planned has changed)."""
    return await _replay(executor, list(plan.delivery_ids), attempts_max=attempts_max, keyed=True,
                         outcome_wait_seconds=outcome_wait_seconds, account_id=plan.account_id)


async def _replay(pool: asyncpg.Pool, delivery_ids: list[uuid.UUID], *, attempts_max: int, keyed: bool,
                  outcome_wait_seconds: float, account_id: uuid.UUID | None = None) -> Replayed:
    result = Replayed()
    for start in range(0, len(delivery_ids), REPLAY_BATCH_MAX):
        batch = delivery_ids[start:start + REPLAY_BATCH_MAX]
        sources = await _sources(pool, batch, account_id)
        requests, olds = [], []
        for old_id in batch:
            source = sources.get(old_id)
            if source is None:
                result.refused[old_id] = f"delivery {old_id} does not exist, or is neither dead nor delivered"
            elif source["payload"] is None:
                erased_at = source["payload_erased_at"]
                erased = f"erased on {erased_at:%Y-%m-%d}" if erased_at is not None else "erased"
                result.refused[old_id] = f"the payload of delivery {old_id} was {erased}; it cannot be replayed"
            else:
                key = f"{REPLAY_KEY_PREFIX}{old_id}" if keyed else None
                requests.append(MessageRequest(source["account_id"], source["event_type"], source["payload"], key,
                                               endpoint_ids=(source["endpoint_id"],), replay_of=old_id))
                olds.append(old_id)
        if requests:
            try:
                outcomes = await create_messages(pool, requests, attempts_max=attempts_max,
                                                 outcome_wait_seconds=outcome_wait_seconds)
            except CreateOutcomeUnknown as unknown:
                raise ReplayOutcomeUnknown(unknown, result, olds, keyed) from unknown.__cause__
            for old_id, outcome in zip(olds, outcomes):
                _record(result, old_id, outcome)
    return result


async def _sources(pool: asyncpg.Pool, batch: list[uuid.UUID], account_id: uuid.UUID | None) -> dict:
    """The deliveries to replay by id: in the caller's account; for the operator (None), in the
    accounts of their ledger entries, and by bare id those not found there (see _DELIVERY_BY_BARE_ID)."""
    if account_id is not None:
        return {row["id"]: row for row in await pool.fetch(_ACCOUNT_SOURCES, batch, account_id)}
    accounts = [row[0] for row in await pool.fetch(_ACCOUNTS_OF_DELIVERIES, batch)]
    found = {row["id"]: row for row in await pool.fetch(_ACCOUNTS_SOURCES, batch, accounts)} if accounts else {}
    missing = [delivery_id for delivery_id in batch if delivery_id not in found]
    if missing:
        found |= {row["id"]: row for row in await pool.fetch(_OPERATOR_SOURCES, missing)}
    return found


def _record(result: Replayed, old_id: uuid.UUID, outcome: MessageCreated | BillingError) -> None:
    if isinstance(outcome, BillingError):
        result.refused[old_id] = outcome.detail
    elif outcome.replayed:
        result.already[old_id] = outcome.deliveries[0].id
    else:
        result.created[old_id] = outcome.deliveries[0].id
        result.charged += outcome.total_charged

