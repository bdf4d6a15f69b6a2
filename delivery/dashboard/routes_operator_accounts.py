"""The operator opens an account, tops it up and starts its deletion: the API's operator calls, as forms.

Each goes through what the API runs, with its checks: the account and its first key through
delivery.api.routes_accounts.create_account_answer under the API's stored-answer idempotency
(keyed by the form's page, so a double submit opens one account and shows the same key again);
a top-up through billing.accounts.top_up, once per order id; a deletion through
delivery.operations.deletion.start_account_deletion, after the operator types the account's
name or id. The new API key is shown once, on a page that is not cached.
"""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime

import msgspec
from aiohttp import web

from billing import accounts as billing_accounts
from delivery.api import idempotency
from delivery.api.problems import Problem, not_found
from delivery.api.routes_accounts import create_account_answer
from delivery.api.validation import AccountCreate, TopupCreate, decode, path_id
from delivery.dashboard import pages, queries
from delivery.dashboard.routes_operator import accounts_page
from delivery.operations import deletion
from delivery.store.idempotent_responses import OPERATOR_PRINCIPAL

routes = web.RouteTableDef()

_NONCE = re.compile(r"[0-9a-f]{32}")
_WHOLE = re.compile(r"-?[0-9]{1,20}")
ACCOUNT_LABELS = {"name": "Name", "price_per_delivery": "Price per delivery"}
TOPUP_LABELS = {"order_id": "Order id", "amount": "Amount"}


def _number(raw: object) -> object:
    """A form's number as an int when it is one, None when left empty; else the text itself, which the
    body's check refuses in words."""
    text = raw.strip() if isinstance(raw, str) else ""
    if not text:
        return None
    return int(text) if _WHOLE.fullmatch(text) else text


def _as_typed(form, fields: dict) -> dict[str, str]:
    """The fields as the operator typed them, to fill the form in again."""
    return {name: str(form.get(name, "")) for name in fields}


def new_order_id() -> str:
    return f"dashboard-{datetime.now(UTC):%Y%m%d}-{secrets.token_hex(4)}"


async def _account(request: web.Request) -> billing_accounts.Account:
    pages.require_operator(request)
    account_id = path_id(request.match_info["id"])
    if account_id is None:
        raise not_found("account")
    return await billing_accounts.get_account(pages.api(request).pool, account_id)  # AccountNotFound: 404


@routes.post("/operator/accounts")
async def open_account(request: web.Request) -> web.Response:
    pages.require_operator(request)
    ctx = pages.api(request)
    form = await pages.form(request)
    nonce = form.get("nonce")
    if not isinstance(nonce, str) or not _NONCE.fullmatch(nonce):
        raise Problem(400, "the form was not complete; open the page again", "bad-request")
    fields = {"name": str(form.get("name", "")).strip(), "price_per_delivery": _number(form.get("price_per_delivery"))}
    try:
        body = decode(msgspec.json.encode(fields), AccountCreate)
    except Problem as problem:  # shown on the accounts page, where the form is
        return await accounts_page(request, status=422, errors=pages.error_lines(problem, ACCOUNT_LABELS),
                                   form={**_as_typed(form, fields), "nonce": nonce})
    price = body.price_per_delivery
    if price is None:
        price = ctx.settings.ledger.price_per_delivery_default
    answer = await idempotency.once(request, OPERATOR_PRINCIPAL,
                                    lambda executor: create_account_answer(ctx, executor, body.name, price),
                                    key=f"dashboard-account:{nonce}")
    created = msgspec.json.decode(answer.body)
    return pages.render(request, "operator_account_created.html", {
        "account": created["account"], "api_key": created["api_key"],
        "again": answer.headers.get("Idempotent-Replayed") == "true",
    }, status=201)


@routes.get("/operator/accounts/{id}")
async def show_account(request: web.Request) -> web.Response:
    account = await _account(request)
    return await _account_page(request, account, notice=await _topup_notice(request, account.id))


async def _account_page(request: web.Request, account, *, status: int = 200, errors: list[str] | None = None,
                        form: dict | None = None, notice: str | None = None) -> web.Response:
    pool = pages.api(request).pool
    balance = await billing_accounts.get_balance(pool, account.id)
    return pages.render(request, "operator_account.html", {
        "account": account, "balance": balance, "deletion": await queries.deletion(pool, account.id),
        "errors": errors or [], "form": form or {"order_id": new_order_id(), "amount": ""}, "notice": notice,
        "amount_max": billing_accounts.AMOUNT_MAX,
    }, status=status)


@routes.post("/operator/accounts/{id}/topups")
async def top_up(request: web.Request) -> web.Response:
    account = await _account(request)
    form = await pages.form(request)
    fields = {"order_id": str(form.get("order_id", "")).strip(), "amount": _number(form.get("amount"))}
    try:
        body = decode(msgspec.json.encode(fields), TopupCreate)
    except Problem as problem:
        return await _account_page(request, account, status=422, form=_as_typed(form, fields),
                                   errors=pages.error_lines(problem, TOPUP_LABELS))
    # Refusals (the account closing, the order applied with another amount, past the largest
    # balance) are billing errors: the error page says which, with its status.
    result = await billing_accounts.top_up(pages.api(request).pool, account.id, body.order_id, body.amount)
    outcome = "applied" if result.applied else "already"
    raise pages.redirect(f"/dashboard/operator/accounts/{account.id}?topup={outcome}&order={body.order_id}")


async def _topup_notice(request: web.Request, account_id) -> str | None:
    """What the top-up just did, read from the ledger (a link's query string alone cannot make the page
    claim a top-up that is not there)."""
    outcome, order_id = request.query.get("topup"), request.query.get("order", "")
    if outcome not in ("applied", "already") or not 1 <= len(order_id) <= billing_accounts.ORDER_ID_LENGTH_MAX:
        return None
    entry = await queries.topup_entry(pages.api(request).pool, account_id, order_id)
    if entry is None:
        return None
    if outcome == "already":
        return f"Order {order_id} was applied before ({entry['amount']} credits): nothing was added this time."
    return f"Topped up {entry['amount']} credits for order {order_id}."


@routes.get("/operator/accounts/{id}/delete")
async def confirm_deletion(request: web.Request) -> web.Response:
    account = await _account(request)
    return await _deletion_page(request, account)


async def _deletion_page(request: web.Request, account, *, error: str | None = None, status: int = 200) -> web.Response:
    balance = await billing_accounts.get_balance(pages.api(request).pool, account.id)
    return pages.render(request, "operator_account_delete.html", {
        "account": account, "balance": balance, "error": error,
    }, status=status)


@routes.post("/operator/accounts/{id}/delete")
async def delete_account(request: web.Request) -> web.Response:
    """Start the deletion job, as DELETE /v1/accounts/{id}, once the account's name or id is typed."""
    account = await _account(request)
    typed = (await pages.form(request)).get("confirm")
    typed = typed.strip() if isinstance(typed, str) else ""
    if typed not in (account.name, str(account.id)):
        return await _deletion_page(request, account, status=422,
                                    error="What you typed is neither the account's name nor its id: nothing was deleted.")
    ctx = pages.api(request)
    await deletion.start_account_deletion(ctx.pool, ctx.queue.redis if ctx.queue is not None else None, account.id)
    raise pages.redirect(f"/dashboard/operator/deletions/{account.id}")

