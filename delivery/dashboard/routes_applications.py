"""Applications: the account's customers, a page at a time, each with its endpoints and what its
deliveries cost over the last 30 days (billing.usage, summed from the ledger)."""

from __future__ import annotations

from aiohttp import web

from billing import usage
from delivery.api.validation import path_id
from delivery.dashboard import pages
from delivery.store import applications as store

routes = web.RouteTableDef()

PAGE_SIZE = 50
USAGE_DAYS = 30


@routes.get("/applications")
async def list_applications(request: web.Request) -> web.Response:
    account_id = pages.account_id(request)
    pool = pages.api(request).pool
    cursor = path_id(request.query.get("cursor", ""))
    rows = await store.page(pool, account_id, after=cursor, limit=PAGE_SIZE)
    shown = rows[:PAGE_SIZE]
    since = await pool.fetchval("SELECT now() - make_interval(days => $1)", USAGE_DAYS)
    costs = await usage.usage_by_application(pool, account_id, [application.id for application in shown], since)
    endpoints = dict(await pool.fetch(
        "SELECT application_id, count(*) FROM endpoints WHERE application_id = ANY($1::uuid[]) AND account_id = $2"
        " AND deleted_at IS NULL GROUP BY application_id", [application.id for application in shown], account_id))
    return pages.render(request, "applications.html", {
        "applications": [(application, endpoints.get(application.id, 0), costs[application.id]) for application in shown],
        "next_cursor": shown[-1].id if len(rows) > PAGE_SIZE else None, "usage_days": USAGE_DAYS,
    })
