"""The operator's pages: accounts with balances, dead letters across accounts, the audit, deletion jobs.
Opening an account, topping it up and deleting it are in routes_operator_accounts.

The audit is billing.audit.audit, run on demand (a POST); the worker's periodic audit leaves
only metrics, so this process keeps its own last result to show (DashboardState).
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from aiohttp import web

from billing.audit import INVARIANTS, audit
from billing.tables import DEAD_REASONS, DELETION_STEPS
from delivery.operations import dead_letters
from delivery.api.problems import FieldError, not_found
from delivery.api.validation import Query, path_id
from delivery.dashboard import filters, pages, queries

routes = web.RouteTableDef()

VIOLATIONS_SHOWN_MAX = 200
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)  # deletion cursors: exact microseconds, no float rounding


@dataclass
class AuditRun:
    report: object  # billing.audit.AuditReport
    finished_at: datetime
    duration_seconds: float


@dataclass
class DashboardState:
    last_audit: AuditRun | None = None


STATE = web.AppKey("hookledger_dashboard_state", DashboardState)


def _uuid_cursor(query: Query) -> uuid.UUID | None:
    cursor = query.cursor()
    value = path_id(cursor) if cursor is not None else None
    if cursor is not None and value is None:
        query.errors.append(FieldError("cursor", "is not a cursor this page made"))
    return value


@routes.get("/operator")
async def accounts(request: web.Request) -> web.Response:
    return await accounts_page(request)


async def accounts_page(request: web.Request, *, status: int = 200, errors: list[str] | None = None,
                        form: dict | None = None) -> web.Response:
    """Every account with its balance, and the form that opens one (with the refusals of the last try)."""
    pages.require_operator(request)
    query = Query(filters.given(request.query))
    after_id = _uuid_cursor(query)
    query.check()
    rows = await queries.accounts_page(pages.api(request).pool, after_id=after_id, limit=filters.PAGE_SIZE)
    shown = rows[:filters.PAGE_SIZE]
    next_link = (filters.link("/dashboard/operator", {}, cursor=shown[-1]["id"])
                 if len(rows) > filters.PAGE_SIZE else None)
    default_price = pages.api(request).settings.ledger.price_per_delivery_default
    return pages.render(request, "operator_accounts.html", {
        "accounts": shown, "next_link": next_link, "paged": after_id is not None, "errors": errors or [],
        "form": form or {"name": "", "price_per_delivery": default_price, "nonce": secrets.token_hex(16)},
    }, status=status)


@routes.get("/operator/dead-letters")
async def dead(request: web.Request) -> web.Response:
    pages.require_operator(request)
    query = Query(filters.given(request.query))
    chosen = {"account_id": query.uuid("account_id"), "reason": query.choice("reason", DEAD_REASONS)}
    cursor = query.cursor()
    query.check()
    page = await dead_letters.list_dead(pages.api(request).pool, dead_letters.DeadFilter(**chosen), cursor=cursor,
                                        limit=filters.PAGE_SIZE)
    shown = {name: filters.form_value(value) for name, value in chosen.items()}
    next_link = filters.link("/dashboard/operator/dead-letters", shown, cursor=page.next_cursor) if page.next_cursor else None
    return pages.render(request, "operator_dead.html", {
        "rows": page.rows, "filters": shown, "reasons": DEAD_REASONS, "next_link": next_link,
        "paged": cursor is not None, "first_link": filters.link("/dashboard/operator/dead-letters", shown),
    })


@routes.get("/operator/deliveries/{id}")
async def inspect(request: web.Request) -> web.Response:
    pages.require_operator(request)
    delivery_id = path_id(request.match_info["id"])
    if delivery_id is None:
        raise not_found("delivery")
    found = await dead_letters.inspect(pages.api(request).pool, delivery_id)  # DeliveryNotFound answers 404
    return pages.render(request, "operator_delivery.html", found)


@routes.get("/operator/audit")
async def audit_page(request: web.Request) -> web.Response:
    pages.require_operator(request)
    return _audit_page(request)


def _audit_page(request: web.Request) -> web.Response:
    run = request.app[STATE].last_audit
    return pages.render(request, "operator_audit.html", {
        "run": run, "invariants": INVARIANTS,
        "violations": run.report.violations[:VIOLATIONS_SHOWN_MAX] if run else [],
    })


@routes.post("/operator/audit")
async def run_audit(request: web.Request) -> web.Response:
    """Run the full audit now (one repeatable-read snapshot, set-based) and show it."""
    pages.require_operator(request)
    started = time.monotonic()
    report = await audit(pages.api(request).pool)
    request.app[STATE].last_audit = AuditRun(report, datetime.now(UTC), round(time.monotonic() - started, 3))
    raise pages.redirect("/dashboard/operator/audit")


def _report(raw) -> dict:
    return json.loads(raw) if isinstance(raw, str) else dict(raw or {})


def _progress(step: str, status: str) -> int:
    if status == "done":
        return 100
    return round(100 * DELETION_STEPS.index(step) / (len(DELETION_STEPS) - 1)) if step in DELETION_STEPS else 0


@routes.get("/operator/deletions")
async def deletions(request: web.Request) -> web.Response:
    pages.require_operator(request)
    query = Query(filters.given(request.query))
    cursor = query.cursor()
    before = _deletion_cursor(cursor, query)
    query.check()
    rows = await queries.deletions_page(pages.api(request).pool, before=before, limit=filters.PAGE_SIZE)
    shown = [{**dict(row), "report": _report(row["report"]), "progress": _progress(row["step"], row["status"])}
             for row in rows[:filters.PAGE_SIZE]]
    next_link = None
    if len(rows) > filters.PAGE_SIZE:
        last = shown[-1]
        next_link = filters.link("/dashboard/operator/deletions", {},
                                 cursor=f"{(last['started_at'] - _EPOCH) // _MICROSECOND}_{last['id']}")
    return pages.render(request, "operator_deletions.html", {"deletions": shown, "next_link": next_link,
                                                             "paged": cursor is not None})


def _deletion_cursor(cursor: str | None, query: Query) -> tuple[datetime, uuid.UUID] | None:
    if cursor is None:
        return None
    microseconds, _, raw_id = cursor.partition("_")
    deletion_id = path_id(raw_id)
    try:
        started_at = _EPOCH + int(microseconds) * _MICROSECOND if microseconds.isdigit() else None
    except OverflowError:
        started_at = None
    if deletion_id is None or started_at is None:
        query.errors.append(FieldError("cursor", "is not a cursor this page made"))
        return None
    return started_at, deletion_id


@routes.get("/operator/deletions/{account_id}")
async def deletion(request: web.Request) -> web.Response:
    pages.require_operator(request)
    account_id = path_id(request.match_info["account_id"])
    row = None if account_id is None else await queries.deletion(pages.api(request).pool, account_id)
    if row is None:
        raise not_found("account deletion")
    report = _report(row["report"])
    return pages.render(request, "operator_deletion.html", {
        "deletion": row, "report": report, "steps": report.get("steps", []),
        "progress": _progress(row["step"], row["status"]), "mismatches": report.get("mismatches", [])[:200],
        "report_json": json.dumps({k: v for k, v in report.items() if k not in ("steps", "mismatches")}, indent=2,
                                  sort_keys=True),
    })
