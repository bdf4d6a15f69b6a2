"""Deliveries: filter, open one (its payload and headers as sent, every attempt, its ledger entries,
why it died, what it replays and what replays it), replay with the cost confirmed.

Reads come from delivery.api.reads (account-scoped, so another account's delivery is a 404
like a missing one). A replay is a new delivery with its own charge: a dead one goes through
delivery.operations.dead_letters.replay (keyed `replay:<id>`, so a double submit replays once, and a
bulk replay later knows it was done); a delivered one through the API's group commit, keyed by
the confirmation page it came from. The confirmation names the price; if the price changed
before the click, nothing is replayed and the page asks again. Where a replay cannot succeed (the
endpoint deleted or disabled, the payload erased, the account closing, the balance short) the
page says why instead of offering it, and a replay refused after all says why on the page.
"""

from __future__ import annotations

import re
import secrets
import uuid

from aiohttp import web

from billing import accounts as billing_accounts
from billing.errors import AccountNotActive, InsufficientBalance, InvalidInput
from billing.messages import MessageRequest
from billing.tables import DELIVERY_STATES
from delivery.engine.sender import USER_AGENT
from delivery.operations import dead_letters
from delivery.operations.dead_letters import ReplayRefused
from delivery.store import endpoints as store
from delivery.api import reads
from delivery.api.problems import FieldError, Problem, not_found
from delivery.api.routes_deliveries import REPLAYABLE_STATES
from delivery.api.routes_messages import submit
from delivery.api.validation import Query, path_id
from delivery.dashboard import filters, pages, queries

routes = web.RouteTableDef()

_NONCE = re.compile(r"[0-9a-f]{32}")


def _list_filters(request: web.Request) -> dict:
    values = filters.given(request.query)
    query = Query(values)
    chosen = {"event_type": filters.event_type(values, query)}
    chosen.update(
        state=query.choice("state", DELIVERY_STATES),
        endpoint_id=query.uuid("endpoint_id"),
        created_after=query.timestamp("created_after"),
        created_before=query.timestamp("created_before"),
    )
    cursor = query.cursor()
    chosen["before_id"] = path_id(cursor) if cursor is not None else None
    if cursor is not None and chosen["before_id"] is None:
        query.errors.append(FieldError("cursor", "is not a cursor this page made"))
    query.check()
    return chosen


@routes.get("/deliveries")
async def list_deliveries(request: web.Request) -> web.Response:
    account_id = pages.account_id(request)
    pool = pages.api(request).pool
    chosen = _list_filters(request)
    rows = await queries.deliveries_page(pool, account_id, limit=filters.PAGE_SIZE, **chosen)
    deliveries = rows[:filters.PAGE_SIZE]
    shown = {name: filters.form_value(value) for name, value in chosen.items() if name != "before_id"}
    next_link = (filters.link("/dashboard/deliveries", shown, cursor=deliveries[-1]["id"])
                 if len(rows) > filters.PAGE_SIZE else None)
    return pages.render(request, "deliveries.html", {
        "deliveries": deliveries, "filters": shown, "states": DELIVERY_STATES, "next_link": next_link,
        "endpoints": await store.list_endpoints(pool, account_id), "paged": chosen["before_id"] is not None,
        "first_link": filters.link("/dashboard/deliveries", shown),
        "live": any(row["state"] in ("pending", "sending") for row in deliveries),
    })


async def _delivery(request: web.Request) -> tuple[uuid.UUID, object]:
    account_id = pages.account_id(request)
    delivery_id = path_id(request.match_info["id"])
    row = None if delivery_id is None else await reads.delivery(pages.api(request).pool, account_id, delivery_id)
    if row is None:
        raise not_found("delivery")
    return account_id, row


PAYLOAD_SHOWN_BYTES_MAX = 16 * 1024  # a delivery page shows this much of the payload, and says so when cut
REPLAYS_SHOWN_MAX = 20


@routes.get("/deliveries/{id}")
async def show_delivery(request: web.Request) -> web.Response:
    account_id, delivery = await _delivery(request)
    pool = pages.api(request).pool
    endpoint = await store.get_endpoint(pool, account_id, delivery["endpoint_id"])
    attempts = await reads.attempts(pool, account_id, delivery["id"])
    entries = await reads.delivery_ledger(pool, account_id, delivery["id"])
    account = await billing_accounts.get_account(pool, account_id)
    erased = delivery["payload_erased_at"] is not None
    payload = _payload(None if erased else await queries.payload_head(pool, account_id, delivery["id"],
                                                                       PAYLOAD_SHOWN_BYTES_MAX))
    return pages.render(request, "delivery.html", {
        "delivery": delivery, "endpoint": endpoint, "attempts": attempts, "entries": entries,
        "payload": payload, "payload_shown_bytes_max": PAYLOAD_SHOWN_BYTES_MAX,
        "headers": outgoing_headers(delivery["webhook_id"], attempts),
        "replays": await queries.replays_of(pool, account_id, delivery["id"], REPLAYS_SHOWN_MAX),
        "refund": refund_mark(entries),
        "replayable": delivery["state"] in REPLAYABLE_STATES,
        "replay_blocker": replay_blocker(endpoint, account, _kept_bytes(delivery, payload)),
        "erased": reads.erased_text(delivery["payload_erased_at"]) if delivery["payload_erased_at"] else None,
        "replayed_from": path_id(request.query.get("replayed_from", "")),
    })


def _payload(row) -> dict:
    """The payload as sent (None: erased), its size, and whether the page shows only its head."""
    if row is None or row["bytes"] is None:
        return {"text": None, "bytes": None, "cut": False}
    head = bytes(row["head"])
    cut = row["bytes"] > len(head)
    # A cut can fall inside a character: that one shows as U+FFFD. The payload itself is UTF-8.
    return {"text": head.decode("utf-8", "replace"), "bytes": row["bytes"], "cut": cut}


def outgoing_headers(webhook_id: uuid.UUID, attempts) -> list[tuple[str, str, str]]:
    """The headers each attempt sends, as (name, value, note); the signature is never shown."""
    last = attempts[-1] if attempts else None
    if last is None:
        timestamp, when = "", "unix seconds, signed when the first attempt starts"
    else:
        timestamp = str(int(last["started_at"].timestamp()))
        when = (f"about when attempt {last['attempt']} started (the exact value it signed is not"
                " stored); each attempt signs its own")
    return [
        ("content-type", "application/json", ""),
        ("user-agent", USER_AGENT, ""),
        ("webhook-id", str(webhook_id), "the same on every attempt, and on a replay the replayed delivery's:"
                                        " receivers dedupe on it"),
        ("webhook-timestamp", timestamp, when),
        ("webhook-signature", "v1,…", "HMAC-SHA256 of id.timestamp.body with the endpoint's secret (not shown)"),
    ]


def refund_mark(entries) -> str | None:
    """"refunded", "refunded, then reclaimed" (it arrived after all), or None, from the delivery's ledger entries."""
    kinds = {entry["kind"] for entry in entries}
    if "refund" not in kinds:
        return None
    return "refunded, then reclaimed" if "reclaim" in kinds else "refunded"


def replay_blocker(endpoint, account, payload_bytes: int | None) -> str | None:
    """Why a replay of a dead or delivered delivery cannot succeed now, in words; None when it can."""
    if endpoint is None:
        return "Its endpoint was deleted, so there is nowhere to send it again."
    if not endpoint.enabled:
        return "Its endpoint is disabled: enable the endpoint to replay it."
    if payload_bytes is None:
        return "Its payload was erased, so there is nothing to send again."
    if account.status != "active":
        return f"The account is {account.status}: it sends nothing more."
    if account.balance < account.price_per_delivery:
        return (f"The balance ({account.balance} credits) does not cover a replay"
                f" ({account.price_per_delivery} credits): ask for a top-up first.")
    return None


async def _blocker(request: web.Request, account_id: uuid.UUID, delivery) -> str | None:
    pool = pages.api(request).pool
    endpoint = await store.get_endpoint(pool, account_id, delivery["endpoint_id"])
    account = await billing_accounts.get_account(pool, account_id)
    payload = await queries.payload_head(pool, account_id, delivery["id"], 0)
    return replay_blocker(endpoint, account, _kept_bytes(delivery, payload))


def _kept_bytes(delivery, payload) -> int | None:
    """The payload's size, or None when it was erased (by an expunge, retention or the account's deletion)."""
    if delivery["payload_erased_at"] is not None or not payload:
        return None
    return payload["bytes"]


async def _replay_page(request: web.Request, delivery, *, error: str | None = None, status: int = 200) -> web.Response:
    account_id = pages.account_id(request)
    account = await billing_accounts.get_account(pages.api(request).pool, account_id)
    if delivery["state"] not in REPLAYABLE_STATES:
        raise Problem(409, f"the delivery is {delivery['state']}; only dead or delivered deliveries can be replayed",
                      "not-replayable")
    blocker = await _blocker(request, account_id, delivery)
    return pages.render(request, "replay_confirm.html", {
        "delivery": delivery, "account": account, "nonce": secrets.token_hex(16), "error": error,
        "blocker": blocker,
    }, status=409 if blocker and status == 200 else status)


@routes.get("/deliveries/{id}/replay")
async def confirm_replay(request: web.Request) -> web.Response:
    _, delivery = await _delivery(request)
    return await _replay_page(request, delivery)


@routes.post("/deliveries/{id}/replay")
async def replay(request: web.Request) -> web.Response:
    account_id, delivery = await _delivery(request)
    ctx = pages.api(request)
    form = await pages.form(request)
    account = await billing_accounts.get_account(ctx.pool, account_id)
    if form.get("price") != str(account.price_per_delivery):
        return await _replay_page(request, delivery, status=409,
                                  error=f"The price is now {account.price_per_delivery} credits; confirm again.")
    try:
        if delivery["state"] == "dead":
            new_id = await _replay_dead(ctx, account_id, delivery["id"])
        else:
            nonce = form.get("nonce")
            if not isinstance(nonce, str) or not _NONCE.fullmatch(nonce):
                raise Problem(400, "the confirmation page was not complete; open it again", "bad-request")
            new_id = await _replay_delivered(ctx, account_id, delivery["id"], nonce)
    except (ReplayRefused, InsufficientBalance, AccountNotActive, InvalidInput) as refused:
        # The endpoint was deleted or disabled, the balance spent, the account closed since the page
        # was shown: nothing was written. Say why, on the page (the API answers 402, 409 or 422).
        status = 402 if isinstance(refused, InsufficientBalance) else 409
        return await _replay_page(request, delivery, status=status, error=f"Not replayed: {refused.detail}.")
    raise pages.redirect(f"/dashboard/deliveries/{new_id}?replayed_from={delivery['id']}")


async def _replay_dead(ctx, account_id: uuid.UUID, delivery_id: uuid.UUID) -> uuid.UUID:
    result = await dead_letters.replay(ctx.pool, delivery_id, attempts_max=ctx.settings.ledger.attempts_max,
                                       outcome_wait_seconds=ctx.settings.api.commit_outcome_wait_seconds,
                                       account_id=account_id)
    if delivery_id in result.created:
        new_id = result.created[delivery_id]
        if ctx.queue is not None:
            await ctx.queue.wake([(account_id, new_id)])  # else the sweeper finds it
        return new_id
    if delivery_id in result.refused:  # its payload was erased meanwhile
        raise Problem(409, result.refused[delivery_id], "not-replayable")
    return result.already[delivery_id]  # replayed before (a second click): nothing charged now


async def _replay_delivered(ctx, account_id: uuid.UUID, delivery_id: uuid.UUID, nonce: str) -> uuid.UUID:
    source = await reads.message_of_delivery(ctx.pool, account_id, delivery_id)
    if source is None:
        raise not_found("delivery")
    if source["payload"] is None:
        raise Problem(409, f"the message's payload was {reads.erased_text(source['payload_erased_at'])};"
                      " it cannot be replayed", "not-replayable")
    created = await submit(ctx, MessageRequest(
        account_id, source["event_type"], bytes(source["payload"]), f"dashboard-replay:{delivery_id}:{nonce}",
        endpoint_ids=(source["endpoint_id"],), replay_of=delivery_id,
    ))
    return created.deliveries[0].id
