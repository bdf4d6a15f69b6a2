"""The account's overview (balance, operational notices, the last 24 hours as a chart, endpoint health) and its ledger
(entries oldest first, as the API lists them, with the balance after each; totals per day; CSV)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

from aiohttp import web

from billing import accounts as billing_accounts
from billing.tables import LEDGER_KINDS
from delivery.store import endpoints as store
from delivery.api.validation import Query
from delivery.dashboard import charts, filters, operational_notices, pages, queries
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
        "notices": await operational_notices.notices(pool, account_id),
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


DAYS_SHOWN_DEFAULT = 14  # totals per day: the last two weeks, unless the filters give a range
DAYS_SHOWN_MAX = 31


@routes.get("/ledger")
async def ledger(request: web.Request) -> web.Response:
    """Entries oldest first, as GET /v1/ledger and `hookledger ledger` list them; the page opens on
    the latest entries and pages back to earlier ones. Above them, totals per day."""
    account_id = pages.account_id(request)
    chosen = _ledger_filters(request)
    pool = pages.api(request).pool
    rows = await queries.ledger_page(pool, account_id, limit=filters.PAGE_SIZE, **chosen)  # newest first
    entries = rows[:filters.PAGE_SIZE][::-1]
    shown = {name: filters.form_value(value) for name, value in chosen.items() if name != "before_seq"}
    earlier_link = (filters.link("/dashboard/ledger", shown, cursor=entries[0]["seq"])
                    if len(rows) > filters.PAGE_SIZE else None)
    return pages.render(request, "ledger.html", {
        "entries": entries, "filters": shown, "kinds": LEDGER_KINDS, "earlier_link": earlier_link,
        "paged": chosen["before_seq"] is not None,
        "export_link": filters.link("/dashboard/ledger.csv", shown),
        "latest_link": filters.link("/dashboard/ledger", shown),
        "totals": await _daily_totals(pool, account_id, chosen["created_after"], chosen["created_before"]),
    })


async def _daily_totals(pool, account_id, created_after: datetime | None, created_before: datetime | None) -> dict:
    """Charged, refunded and net per UTC day over the filters' range (default: the last DAYS_SHOWN_DEFAULT
    days; at most the last DAYS_SHOWN_MAX of a longer range), with their sum."""
    end = created_before or datetime.now(UTC)
    start = created_after or (end.replace(hour=0, minute=0, second=0, microsecond=0)
                              - timedelta(days=DAYS_SHOWN_DEFAULT - 1))
    shortened = end - start > timedelta(days=DAYS_SHOWN_MAX)
    if shortened:
        start = end - timedelta(days=DAYS_SHOWN_MAX)
    days = [dict(row) for row in await queries.daily_totals(pool, account_id, start, end)] if start < end else []
    for day in days:
        day["net"] = day["charged"] - day["refunded"]
    sums = {name: sum(day[name] for day in days) for name in ("charges", "charged", "refunded", "net", "other", "change")}
    return {"days": days, "sums": sums, "start": start, "end": end, "shortened": shortened,
            "days_max": DAYS_SHOWN_MAX}


@routes.get("/ledger.csv")
async def ledger_csv(request: web.Request) -> web.StreamResponse:
    """Every matching entry, oldest first (as the page and the API), with the balance after each;
    streamed page by page, each page carrying the balance on to the next."""
    account_id = pages.account_id(request)
    chosen = _ledger_filters(request)
    chosen.pop("before_seq")
    pool = pages.api(request).pool
    response = web.StreamResponse(headers={
        "Content-Type": "text/csv; charset=utf-8",
        "Content-Disposition": f'attachment; filename="ledger-{account_id}.csv"',
    })
    await response.prepare(request)
    await response.write(_csv_line(CSV_COLUMNS))
    written, after_seq, balance = 0, 0, 0
    while written < CSV_ROWS_MAX:
        page = await queries.ledger_ascending(pool, account_id, after_seq=after_seq, balance_after_cursor=balance,
                                              limit=min(CSV_PAGE_SIZE, CSV_ROWS_MAX - written), **chosen)
        for row in page:
            await response.write(_csv_line((
                row["seq"], row["id"], row["created_at"].isoformat(), row["kind"], row["amount"],
                row["balance_after"], row["delivery_id"] or "", _no_formula(row["note"] or ""),
            )))
        written += len(page)
        if len(page) < CSV_PAGE_SIZE:
            break
        after_seq, balance = page[-1]["seq"], page[-1]["balance_after"]
    await response.write_eof()
    return response


def _csv_line(values) -> bytes:
    buffer = io.StringIO()
    csv.writer(buffer).writerow(values)
    return buffer.getvalue().encode()


def _no_formula(text: str) -> str:
    # A note opened in a spreadsheet must not run as a formula (CSV injection).
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text
