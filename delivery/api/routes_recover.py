"""Recover an endpoint's dead deliveries (Svix's "recover"): the plan, then the replays, for an account.

`GET /v1/endpoints/{id}/recover?since=&until=` says what a recovery would do now and writes
nothing; `POST /v1/endpoints/{id}/recover {since, until?, confirm_total}` does it: each dead
delivery of the endpoint that died in [since, until) and was not replayed before (by any replay:
this, the operator's, or POST /v1/deliveries/{id}/replay; each names what it replays in
deliveries.replay_of) becomes a NEW delivery with a new charge (the old stays dead and keeps its
refund), through delivery.operations.dead_letters (planned, then `replay_plan`), so each replay carries the
key `replay:<dead delivery id>` and a dead delivery is replayed at most once by recoveries and
bulk replays, whoever asks and however often.

One call is one transaction of at most dead_letters.REPLAY_BATCH_MAX replays (`more` says to call
again; the next call goes on where this one stopped, since replayed ones are left out). In it, the
account row is locked first (the platform's one lock order), then the endpoint row (shared, so a
PATCH that disables it waits), and only then is the total computed: nothing that charges or dies
on this account can commit in between, so the total checked against `confirm_total` and against
the balance is the total written. The whole call is refused (402, nothing written) when the
balance cannot cover it, rather than replaying part of it, as POST /v1/messages refuses a message
it cannot cover wholly.

Being one transaction, the call runs inside `idempotency.once`: with an Idempotency-Key a retried
POST answers the first answer (Idempotent-Replayed: true) instead of 409 total-changed; the key's
answer is stored in this same transaction, whose lost COMMIT `once` resolves. Without a key the
transaction is a resolved one of its own (billing.database.resolved_transaction).

A deleted endpoint answers 404, as on every other /v1/endpoints/{id} route; a disabled one 409
endpoint-disabled (a replay to it would be refused, as POST /v1/deliveries/{id}/replay refuses
one: re-enable it first). Its plan still answers, with `endpoint_enabled` false.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime
from typing import Annotated

import msgspec
import structlog
from aiohttp import web

from billing.database import Executor, OutcomeUnknown, resolved_transaction
from billing import accounts
from billing.errors import InsufficientBalance
from delivery.operations import dead_letters
from delivery.api import idempotency, responses
from delivery.api.context import ApiContext
from delivery.api.problems import FieldError, Problem, not_found, validation
from delivery.api.routes_endpoints import endpoint_ids
from delivery.api.validation import BIGINT_MAX, TIME_RANGE, Query, decode, in_utc

log = structlog.get_logger("hookledger.api")
routes = web.RouteTableDef()

REPLAYS_PER_CALL_MAX = dead_letters.REPLAY_BATCH_MAX  # one transaction's worth (each replay holds a payload)
WAKE_SECONDS_MAX = 1.0  # a wake-up that does not go through in time is left to the sweeper
TOTAL_CHANGED = "total-changed"

Timestamp = Annotated[datetime, msgspec.Meta(
    tz=True, description="RFC 3339 with a timezone (Z or an offset), like 2026-01-31T12:00:00Z.")]
ConfirmTotal = Annotated[int, msgspec.Meta(
    ge=0, le=BIGINT_MAX, description="Credits: the total the plan showed; the call replays only if it is still the total.")]


class RecoverCreate(msgspec.Struct, forbid_unknown_fields=True):
    since: Timestamp
    confirm_total: ConfirmTotal
    until: Timestamp | None = None  # absent or null: now, by PostgreSQL's clock


class RecoverPlan(msgspec.Struct):
    """What POST would replay now, and charge; nothing was written."""

    endpoint_id: uuid.UUID
    endpoint_enabled: bool  # false: POST answers 409 endpoint-disabled until it is enabled again
    since: datetime
    until: datetime
    count: int  # dead deliveries this call would replay (at most 200)
    total_charge: int  # credits: the account's current price for each
    more: bool  # more match than one call replays
    dead_delivery_ids: list[uuid.UUID]


class RecoveredDelivery(msgspec.Struct):
    dead_delivery_id: uuid.UUID
    delivery_id: uuid.UUID  # the new delivery (or, for already_replayed, the earlier replay)


class RecoverRefusal(msgspec.Struct):
    dead_delivery_id: uuid.UUID
    reason: str


class Recovered(msgspec.Struct):
    """What POST did: new deliveries (pending, charged once each), and what it left and why."""

    endpoint_id: uuid.UUID
    since: datetime
    until: datetime
    replayed_count: int
    replayed: list[RecoveredDelivery]
    already_replayed_count: int  # replayed before (by an earlier call): nothing charged now
    already_replayed: list[RecoveredDelivery]
    refused_count: int
    refused: list[RecoverRefusal]
    total_charged: int
    more: bool  # more dead deliveries match than this call replayed: call again (with the next plan's total)


REQUEST_BODIES = (RecoverCreate,)
RESPONSE_BODIES = (RecoverPlan, Recovered)

# The endpoint, the account's own, shared-locked so that it is not disabled or deleted under us
# (after the account's lock: the one lock order), with PostgreSQL's clock for a default `until`.
_LOCK_ENDPOINT = "SELECT enabled, deleted_at, now() AS now FROM endpoints WHERE id = $1 AND account_id = $2 FOR SHARE"
# The plan reads the endpoint and the clock in one snapshot with the candidates.
_READ_ENDPOINT = "SELECT enabled, deleted_at, now() AS now FROM endpoints WHERE id = $1 AND account_id = $2"


def _body_times(body: RecoverCreate) -> tuple[datetime, datetime | None]:
    times = {name: getattr(body, name) for name in ("since", "until")}
    utc = {name: None if value is None else in_utc(value) for name, value in times.items()}
    errors = [FieldError(name, TIME_RANGE) for name in times if times[name] is not None and utc[name] is None]
    if errors:
        raise validation(errors)
    return utc["since"], utc["until"]


def _check_range(since: datetime, until: datetime | None, now: datetime) -> datetime:
    """`until` (now when absent), which must be later than `since`; 422 otherwise."""
    if until is None:
        if since >= now:
            raise validation([FieldError("since", f"must be earlier than until (absent: now, {now.isoformat()})")])
        return now
    if since >= until:
        raise validation([FieldError("until", "must be later than since")])
    return until


@routes.get("/v1/endpoints/{id}/recover")
async def recover_plan(request: web.Request) -> web.Response:
    """The plan: how many dead deliveries a POST would replay now, and the total it would charge."""
    ctx, account_id, endpoint_id = await endpoint_ids(request)
    query = Query(request.query)
    since = query.timestamp("since", required=True, zone_required=True)
    until = query.timestamp("until", zone_required=True)
    query.check()
    since, until = in_utc(since), None if until is None else in_utc(until)
    if until is not None:
        _check_range(since, until, until)
    async with ctx.pool.acquire() as connection, connection.transaction(isolation="repeatable_read", readonly=True):
        endpoint = await connection.fetchrow(_READ_ENDPOINT, endpoint_id, account_id)
        if endpoint is None or endpoint["deleted_at"] is not None:
            raise not_found("endpoint")
        until = _check_range(since, until, endpoint["now"])
        plan = await dead_letters.plan_bulk_replay(connection, endpoint_id, since, until, limit=REPLAYS_PER_CALL_MAX,
                                                   account_id=account_id)
    return responses.json(RecoverPlan(endpoint_id, endpoint["enabled"], since, until, len(plan.delivery_ids),
                                      plan.total_charge, plan.more, list(plan.delivery_ids)))


@routes.post("/v1/endpoints/{id}/recover")
async def recover(request: web.Request) -> web.Response:
    """Replay the plan's dead deliveries as new, charged deliveries, if `confirm_total` is still its total."""
    ctx, account_id, endpoint_id = await endpoint_ids(request)
    body = decode(await request.read(), RecoverCreate)
    since, until = _body_times(body)
    if until is not None:
        _check_range(since, until, until)
    created: list[uuid.UUID] = []  # the new deliveries, woken once their transaction has committed
    response = await idempotency.once(
        request, str(account_id),
        lambda executor: _recover(ctx, executor, account_id, endpoint_id, since, until, body.confirm_total, created),
    )
    if created:
        await _wake(ctx, [(account_id, delivery_id) for delivery_id in created])
    return response


async def _recover(ctx: ApiContext, executor: Executor, account_id: uuid.UUID, endpoint_id: uuid.UUID,
                   since: datetime, until: datetime | None, confirm_total: int, created: list[uuid.UUID]) -> web.Response:
    try:
        async with resolved_transaction(executor, wait_seconds=ctx.settings.api.commit_outcome_wait_seconds) as connection:
            balance = await accounts.lock_active(connection, account_id, "deliveries")
            endpoint = await connection.fetchrow(_LOCK_ENDPOINT, endpoint_id, account_id)
            if endpoint is None or endpoint["deleted_at"] is not None:
                raise not_found("endpoint")
            if not endpoint["enabled"]:
                raise Problem(409, "the endpoint is disabled; enable it (PATCH enabled: true) before recovering",
                              "endpoint-disabled")
            until = _check_range(since, until, endpoint["now"])
            plan = await dead_letters.plan_bulk_replay(connection, endpoint_id, since, until,
                                                       limit=REPLAYS_PER_CALL_MAX, account_id=account_id)
            _check_total(plan, confirm_total)
            if balance < plan.total_charge:
                # All or nothing: replaying what the balance covers would leave the client a
                # partial recovery it did not confirm.
                raise InsufficientBalance(f"balance {balance} cannot cover {len(plan.delivery_ids)}"
                                          f" replays ({plan.total_charge} credits); nothing was replayed")
            # Under the account's lock since it was planned: nothing that charges or dies on the
            # account has committed since, so the plan checked is the plan replayed.
            result = await dead_letters.replay_plan(connection, plan, attempts_max=ctx.settings.ledger.attempts_max)
    except OutcomeUnknown as unknown:
        unknown.look_for = (f"the endpoint's new deliveries (GET /v1/endpoints/{endpoint_id}/recover shows what"
                            " is left; a dead delivery is never replayed twice)")
        raise
    created.extend(result.created.values())
    return responses.json(_recovered(endpoint_id, since, until, result, plan.more), 202)


def _check_total(plan: dead_letters.BulkReplayPlan, confirm_total: int) -> None:
    if confirm_total != plan.total_charge:
        raise Problem(409, f"the recovery would now charge {plan.total_charge} credits for"
                           f" {len(plan.delivery_ids)} dead deliveries, but {confirm_total} was confirmed;"
                           " nothing was replayed", TOTAL_CHANGED)


def _recovered(endpoint_id: uuid.UUID, since: datetime, until: datetime, result: dead_letters.Replayed,
               more: bool) -> Recovered:
    replayed = [RecoveredDelivery(old, new) for old, new in result.created.items()]
    already = [RecoveredDelivery(old, new) for old, new in result.already.items()]
    refused = [RecoverRefusal(old, reason) for old, reason in result.refused.items()]
    return Recovered(endpoint_id, since, until, len(replayed), replayed, len(already), already, len(refused), refused,
                     result.charged, more)


async def _wake(ctx: ApiContext, delivery_ids: list[tuple[uuid.UUID, uuid.UUID]]) -> None:
    """Ask a worker to send the new deliveries now; a lost wake-up costs a sweep interval, never a delivery."""
    if ctx.queue is None:
        return
    try:
        await asyncio.wait_for(ctx.queue.wake(delivery_ids), WAKE_SECONDS_MAX)
    except Exception as error:  # Redis down or slow: the sweeper finds them
        log.warning("wake-up after recover failed; the sweeper sends them", deliveries=len(delivery_ids),
                    error=repr(error))
