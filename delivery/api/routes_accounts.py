"""Accounts: the operator creates them and tops them up; an account reads its balance and ledger."""

from __future__ import annotations

import uuid

import msgspec
from aiohttp import web

from billing import accounts as billing_accounts
from billing.accounts import PAYLOAD_RETENTION_DAYS_DEFAULT
from billing.database import Executor, OutcomeUnknown, resolved_transaction
from delivery.operations import deletion
from delivery.api import api_keys, idempotency, reads, responses
from delivery.api.context import ApiContext, context
from delivery.api.problems import FieldError, not_found, validation
from delivery.api.validation import AccountCreate, AccountPatch, Query, TopupCreate, decode, path_id
from delivery.store.idempotent_responses import OPERATOR_PRINCIPAL

routes = web.RouteTableDef()


def _account_id(request: web.Request):
    """The account id in the path; a malformed one answers 404 like a missing account."""
    account_id = path_id(request.match_info["id"])
    if account_id is None:
        raise not_found("account")
    return account_id


def _account(account: billing_accounts.Account) -> responses.Account:
    return responses.from_row(responses.Account, account)


@routes.post("/v1/accounts")
async def create_account(request: web.Request) -> web.Response:
    ctx = context(request)
    await ctx.operator(request)
    body = decode(await request.read(), AccountCreate)
    price = body.price_per_delivery
    if price is None:
        price = ctx.settings.ledger.price_per_delivery_default
    return await idempotency.once(request, OPERATOR_PRINCIPAL,
                                  lambda executor: create_account_answer(ctx, executor, body.name, price,
                                                                         body.payload_retention_days))


async def create_account_answer(ctx: ApiContext, executor: Executor, name: str, price: int,
                                retention_days: int = PAYLOAD_RETENTION_DAYS_DEFAULT) -> web.Response:
    """201 with the account and its first API key (shown once): for POST /v1/accounts and the dashboard."""
    # The account and its first key in one transaction: never an account nobody can use. Its
    # COMMIT answer lost is resolved, not guessed: an operator told "failed" would create another.
    try:
        async with resolved_transaction(executor, wait_seconds=ctx.settings.api.commit_outcome_wait_seconds) as connection:
            account = await billing_accounts.create_account(connection, name, price_per_delivery=price,
                                                            payload_retention_days=retention_days)
            key = await api_keys.create_key(connection, account.id)
    except OutcomeUnknown as unknown:  # raised only at COMMIT, so the block has run: account is set
        unknown.look_for = (f"account {account.id} (GET /v1/accounts/{account.id}); if it exists, its first API key"
                            " was lost with the answer, so delete it and create another")
        raise
    created = responses.AccountCreated(_account(account), responses.from_row(responses.ApiKeyCreated, key))
    return responses.json(created, 201)


@routes.get("/v1/accounts/{id}")
async def get_account(request: web.Request) -> web.Response:
    ctx = context(request)
    await ctx.operator(request)
    account_id = _account_id(request)
    return responses.json(_account(await billing_accounts.get_account(ctx.pool, account_id)))


async def _update_settings(ctx: ApiContext, account_id: uuid.UUID, body: AccountPatch) -> web.Response:
    """payload_retention_days (applied by the retention job), low_balance_threshold and
    portal_frame_ancestors (the customer portal's CSP frame-ancestors), each when given."""
    days = None if body.payload_retention_days is msgspec.UNSET else body.payload_retention_days
    threshold_given = body.low_balance_threshold is not msgspec.UNSET
    account = await billing_accounts.update_settings(
        ctx.pool, account_id, payload_retention_days=days, set_threshold=threshold_given,
        low_balance_threshold=body.low_balance_threshold if threshold_given else None,
        portal_frame_ancestors=frame_ancestors(body.portal_frame_ancestors))
    return responses.json(_account(account))


def frame_ancestors(given) -> list[str] | None:
    """The origins to store (lower case, each once, in the order given); None: unchanged. 422 for a repeat."""
    if given is msgspec.UNSET:
        return None
    origins = [origin.lower() for origin in given or []]
    repeats = [FieldError(f"portal_frame_ancestors[{index}]", "lists an origin given before it")
               for index, origin in enumerate(origins) if origin in origins[:index]]
    if repeats:
        raise validation(repeats)
    return origins


@routes.patch("/v1/accounts/{id}")
async def update_account(request: web.Request) -> web.Response:
    """The operator's settings of an account."""
    ctx = context(request)
    await ctx.operator(request)
    account_id = _account_id(request)
    return await _update_settings(ctx, account_id, decode(await request.read(), AccountPatch))


@routes.get("/v1/account")
async def get_own_account(request: web.Request) -> web.Response:
    """The calling account: its name, status, balance, price and settings."""
    ctx = context(request)
    account_id = await ctx.account(request)
    return responses.json(_account(await billing_accounts.get_account(ctx.pool, account_id)))


@routes.patch("/v1/account")
async def update_own_account(request: web.Request) -> web.Response:
    """The calling account's own settings, as the operator's PATCH sets them."""
    ctx = context(request)
    account_id = await ctx.account(request)
    return await _update_settings(ctx, account_id, decode(await request.read(), AccountPatch))


def _deletion(state) -> responses.AccountDeletion:
    return responses.AccountDeletion(state.id, state.account_id, state.status, state.step, state.report)


@routes.delete("/v1/accounts/{id}")
async def delete_account(request: web.Request) -> web.Response:
    """Start the account-deletion job (delivery.operations.deletion): 202 with the job; its status is readable."""
    ctx = context(request)
    await ctx.operator(request)
    account_id = _account_id(request)
    redis = ctx.queue.redis if ctx.queue is not None else None
    await deletion.start_account_deletion(ctx.pool, redis, account_id)
    state = await deletion.read_deletion(ctx.pool, account_id)
    location = f"/v1/accounts/{account_id}/deletion"
    return responses.json(_deletion(state), 202, headers={"Location": location})


@routes.get("/v1/accounts/{id}/deletion")
async def get_deletion(request: web.Request) -> web.Response:
    ctx = context(request)
    await ctx.operator(request)
    account_id = path_id(request.match_info["id"])
    state = None if account_id is None else await deletion.read_deletion(ctx.pool, account_id)
    if state is None:
        raise not_found("account deletion")
    return responses.json(_deletion(state))


@routes.post("/v1/accounts/{id}/topups")
async def top_up(request: web.Request) -> web.Response:
    """Idempotent by order id: the same order again answers 200 with applied=false."""
    ctx = context(request)
    await ctx.operator(request)
    account_id = _account_id(request)
    body = decode(await request.read(), TopupCreate)
    result = await billing_accounts.top_up(ctx.pool, account_id, body.order_id, body.amount)
    topup = responses.Topup(body.order_id, result.entry_id, result.amount, result.balance, result.applied)
    return responses.json(topup, 201 if result.applied else 200)


@routes.post("/v1/accounts/{id}/topups/{order_id}/reversal")
async def reverse_top_up(request: web.Request) -> web.Response:
    ctx = context(request)
    await ctx.operator(request)
    account_id = path_id(request.match_info["id"])
    order_id = request.match_info["order_id"]
    if account_id is None or not 1 <= len(order_id) <= billing_accounts.ORDER_ID_LENGTH_MAX or "\x00" in order_id:
        raise not_found("top-up")
    result = await billing_accounts.reverse_top_up(ctx.pool, account_id, order_id)
    topup = responses.Topup(order_id, result.entry_id, result.amount, result.balance, result.applied)
    return responses.json(topup, 201 if result.applied else 200)


@routes.get("/v1/balance")
async def balance(request: web.Request) -> web.Response:
    ctx = context(request)
    account_id = await ctx.account(request)
    result = await billing_accounts.get_balance(ctx.pool, account_id)
    return responses.json(responses.Balance(result.balance, result.in_flight))


@routes.get("/v1/ledger")
async def ledger(request: web.Request) -> web.Response:
    """The account's ledger, oldest first; `cursor` is the seq of the last entry of the previous page."""
    ctx = context(request)
    account_id = await ctx.account(request)
    query = Query(request.query)
    limit = query.limit()
    delivery_id = query.uuid("delivery_id")
    after_seq = query.seq_cursor()
    query.check()
    rows = await reads.ledger_page(ctx.pool, account_id, delivery_id=delivery_id, after_seq=after_seq, limit=limit)
    entries = [responses.from_row(responses.LedgerEntry, row) for row in rows[:limit]]
    next_cursor = str(entries[-1].seq) if len(rows) > limit else None
    return responses.json(responses.LedgerPage(entries, next_cursor))

