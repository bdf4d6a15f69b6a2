"""A portal delivery's page: its state, every attempt (status, times, response excerpt), the payload
as sent (or "erased on <date>") and the headers it goes out with; a dead one offers a replay, its
price on the button. Nothing of the account's ledger is shown.

The reads are the dashboard's (delivery.api.reads, queries.payload_head, the outgoing headers of
routes_deliveries), behind portal.delivery_of: a delivery of another application or account is a 404.
"""

from __future__ import annotations

from aiohttp import web

from delivery.api import reads
from delivery.api.problems import not_found
from delivery.api.validation import path_id
from delivery.dashboard import pages, queries
from delivery.dashboard.portal_pages import render, session
from delivery.dashboard.routes_deliveries import PAYLOAD_SHOWN_BYTES_MAX, outgoing_headers
from delivery.store import endpoints as endpoint_store
from delivery.store import portal

routes = web.RouteTableDef()


@routes.get("/deliveries/{id}")
async def show_delivery(request: web.Request) -> web.Response:
    current = session(request)
    pool = pages.api(request).pool
    delivery_id = path_id(request.match_info["id"])
    own = None if delivery_id is None else await portal.delivery_of(pool, current.account_id,
                                                                     current.application_id, delivery_id)
    delivery = None if own is None else await reads.delivery(pool, current.account_id, delivery_id)
    if delivery is None:
        raise not_found("delivery")
    attempts = await reads.attempts(pool, current.account_id, delivery_id)
    erased = reads.erased_text(delivery["payload_erased_at"]) if delivery["payload_erased_at"] else None
    head = None if erased else await queries.payload_head(pool, current.account_id, delivery_id,
                                                          PAYLOAD_SHOWN_BYTES_MAX)
    payload = None
    if head is not None and head["bytes"] is not None:
        text = bytes(head["head"]).decode("utf-8", "replace")
        payload = {"text": text, "bytes": head["bytes"], "cut": head["bytes"] > len(bytes(head["head"]))}
    endpoint = await endpoint_store.get_endpoint(pool, current.account_id, delivery["endpoint_id"])
    price = await pool.fetchval("SELECT price_per_delivery FROM accounts WHERE id = $1", current.account_id)
    return render(request, "portal_delivery.html", {
        "delivery": delivery, "attempts": attempts, "erased": erased or ("erased" if payload is None else None),
        "payload": payload, "payload_shown_bytes_max": PAYLOAD_SHOWN_BYTES_MAX, "endpoint": endpoint,
        "headers": outgoing_headers(delivery["webhook_id"], attempts), "price": price,
    })
