"""The account's overview (balance, the last 24 hours as a chart, endpoint health) and its ledger."""

from __future__ import annotations

import csv
import io

from aiohttp import web

from billing import accounts as billing_accounts
from billing.tables import LEDGER_KINDS
from delivery.store import endpoints as store
from delivery.api.validation import Query
from delivery.dashboard import charts, filters, pages, queries
from delivery.dashboard.routes_endpoints import endpoint_health

routes = web.RouteTableDef()

CSV_PAGE_SIZE = 1000
CSV_ROWS_MAX = 100_000  # an export stops here; narrow it by time for more
CSV_COLUMNS = ("seq", "id", "created_at", "kind", "amount", "balance_after", "delivery_id", "note")


@routes.get("/overview")
async def overview(request: web.Request) -> web.Response:
    account_id = pages.account_id(request)
    pool = pages.api(request).pool
    account = await billing_accounts.get_account(pool, account_id)
    balance = await billing_accounts.get_balance(pool, account_id)
    chart = charts.hourly_outcomes(await queries.hourly_outcomes(pool, account_id))
    endpoints = await store.list_endpoints(pool, account_id)
    health = await endpoint_health(pool, account_id, endpoints)
    return pages.render(request, "overview.html", {
        "account": account, "balance": balance, "chart": chart, "health": health,
    })


def _ledger_filters(request: web.Request) -> dict:
    query = Query(filters.given(request.query))
    values = {
        "kind": query.choice("kind", LEDGER_KINDS),
        "created_after": query.timestamp("created_after"),
        "created_before": query.timestamp("created_before"),
        "before_seq": filters.seq_cursor(query),
    }
    query.check()
    return values


@routes.get("/ledger")
async def ledger(request: web.Request) -> web.Response:
    account_id = pages.account_id(request)
    chosen = _ledger_filters(request)
    rows = await queries.ledger_page(pages.api(request).pool, account_id, limit=filters.PAGE_SIZE, **chosen)
    entries = rows[:filters.PAGE_SIZE]
    shown = {name: filters.form_value(value) for name, value in chosen.items() if name != "before_seq"}
    next_link = (filters.link("/dashboard/ledger", shown, cursor=entries[-1]["seq"])
                 if len(rows) > filters.PAGE_SIZE else None)
    return pages.render(request, "ledger.html", {
        "entries": entries, "filters": shown, "kinds": LEDGER_KINDS, "next_link": next_link,
        "paged": chosen["before_seq"] is not None,
        "export_link": filters.link("/dashboard/ledger.csv", shown),
        "first_link": filters.link("/dashboard/ledger", shown),
    })


@routes.get("/ledger.csv")
async def ledger_csv(request: web.Request) -> web.StreamResponse:
    """Every matching entry, newest first, with the balance after each; streamed page by page."""
    account_id = pages.account_id(request)
    chosen = _ledger_filters(request)
    pool = pages.api(request).pool
    response = web.StreamResponse(headers={
        "Content-Type": "text/csv; charset=utf-8",
        "Content-Disposition": f'attachment; filename="ledger-{account_id}.csv"',
    })
    await response.prepare(request)
    await response.write(_csv_line(CSV_COLUMNS))
    written, balance_before_cursor = 0, None
    while written < CSV_ROWS_MAX:
        rows = await queries.ledger_page(pool, account_id, limit=CSV_PAGE_SIZE,
                                         balance_before_cursor=balance_before_cursor, **chosen)
        page = rows[:CSV_PAGE_SIZE]
        for row in page[:CSV_ROWS_MAX - written]:
            await response.write(_csv_line((
                row["seq"], row["id"], row["created_at"].isoformat(), row["kind"], row["amount"],
                row["balance_after"], row["delivery_id"] or "", _no_formula(row["note"] or ""),
            )))
        written += len(page)
        if len(rows) <= CSV_PAGE_SIZE:
            break
        # The next page continues below this one; what the balance was before it is known now.
        chosen["before_seq"] = page[-1]["seq"]
        balance_before_cursor = page[-1]["balance_after"] - page[-1]["amount"]
    await response.write_eof()
    return response


def _csv_line(values) -> bytes:
    buffer = io.StringIO()
    csv.writer(buffer).writerow(values)
    return buffer.getvalue().encode()


def _no_formula(text: str) -> str:
    # A note opened in a spreadsheet must not run as a formula (CSV injection).
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text
