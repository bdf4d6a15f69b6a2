"""An account's API keys: create (shown once), list (prefixes only), revoke; and the operator's create."""

from __future__ import annotations

import uuid

from aiohttp import web

from billing import accounts as billing_accounts
from billing.database import Executor, OutcomeUnknown, resolved_transaction
from delivery.api import api_keys, idempotency, responses
from delivery.api.context import ApiContext, context
from delivery.api.problems import Problem, not_found
from delivery.api.validation import Empty, decode, path_id
from delivery.store.idempotent_responses import OPERATOR_PRINCIPAL

routes = web.RouteTableDef()


@routes.post("/v1/api-keys")
async def create_key(request: web.Request) -> web.Response:
    ctx = context(request)
    account_id = await ctx.account(request)
    decode(await request.read(), Empty, optional=True)
    return await idempotency.once(request, str(account_id),
                                  lambda executor: _created(ctx, executor, account_id, "GET /v1/api-keys"))


@routes.post("/v1/accounts/{id}/api-keys")
async def create_key_for_account(request: web.Request) -> web.Response:
    """Operator: a new key for an account, say one that revoked its last (its keys are its only way in)."""
    ctx = context(request)
    await ctx.operator(request)
    account_id = path_id(request.match_info["id"])
    if account_id is None:
        raise not_found("account")
    decode(await request.read(), Empty, optional=True)
    where = f"the account's keys (revoke through DELETE /v1/api-keys with a key of {account_id})"
    return await idempotency.once(request, OPERATOR_PRINCIPAL, lambda executor: _created(ctx, executor, account_id, where))


async def _created(ctx: ApiContext, executor: Executor, account_id: uuid.UUID, where: str) -> web.Response:
    try:
        # A COMMIT answer lost is resolved, not guessed: the key is shown only in this answer.
        async with resolved_transaction(executor, wait_seconds=ctx.settings.api.commit_outcome_wait_seconds) as connection:
            # The account lock serializes concurrent creates, so the per-account bound holds.
            await billing_accounts.lock_active(connection, account_id, "keys")
            try:
                key = await api_keys.create_key(connection, account_id)
            except api_keys.KeyLimitReached as error:
                raise Problem(409, str(error), "limit-reached") from None
    except OutcomeUnknown as unknown:  # raised only at COMMIT, so the block has run: key is set
        unknown.look_for = (f"key {key.id} in {where}; if it is there, its secret was lost with the"
                            " answer, so revoke it and create another")
        raise
    return responses.json(responses.from_row(responses.ApiKeyCreated, key), 201)


@routes.get("/v1/api-keys")
async def list_keys(request: web.Request) -> web.Response:
    ctx = context(request)
    account_id = await ctx.account(request)
    keys = await api_keys.list_keys(ctx.pool, account_id)
    return responses.json(responses.ApiKeyList([responses.from_row(responses.ApiKey, key) for key in keys]))


@routes.delete("/v1/api-keys/{id}")
async def revoke_key(request: web.Request) -> web.Response:
    ctx = context(request)
    account_id = await ctx.account(request)
    key_id = path_id(request.match_info["id"])
    if key_id is None:
        raise not_found("API key")
    digest = await api_keys.revoke_key(ctx.pool, account_id, key_id)
    if digest is None:
        raise not_found("API key")
    ctx.auth.forget(bytes(digest))
    return web.Response(status=204)
