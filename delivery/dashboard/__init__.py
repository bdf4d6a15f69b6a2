"""The web dashboard for accounts and the operator, served by the API process under /dashboard.

`setup(app)` mounts it as a sub-application with its own middlewares (pages.py): HTML error
pages instead of problem+json, a strict Content-Security-Policy, server-side sessions
(session.py) and CSRF tokens on every form (csrf.py). Pages are Jinja2 templates, autoescaped;
charts are inline SVG drawn on the server (charts.py); the one small script and the stylesheet
are static files, so nothing comes from a CDN and the dashboard works offline.

It is one more client of the platform's code: reads from delivery.api.reads and queries.py,
writes through delivery.store.endpoints, delivery.operations.dead_letters, the API's group commit and
billing.audit; no business rule is restated here.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp_jinja2
import jinja2
from aiohttp import web

from delivery.dashboard import (
    pages,
    portal,
    routes_account,
    routes_applications,
    routes_deliveries,
    routes_endpoints,
    routes_operator,
    routes_operator_accounts,
    routes_session,
)

STATIC_DIR = Path(__file__).parent / "static"


def setup(app: web.Application) -> web.Application:
    """Mount the dashboard on the API app at /dashboard; returns the sub-application."""
    dashboard = web.Application(
        middlewares=[pages.security_headers, pages.errors_as_pages, pages.authenticate],
        client_max_size=pages.FORM_BYTES_MAX,
    )
    aiohttp_jinja2.setup(
        dashboard, loader=jinja2.PackageLoader("delivery.dashboard", "templates"), autoescape=True,
        undefined=jinja2.StrictUndefined, filters=pages.FILTERS,
    )
    dashboard[routes_operator.STATE] = routes_operator.DashboardState()
    for module in (routes_session, routes_account, routes_endpoints, routes_applications, routes_deliveries,
                   routes_operator, routes_operator_accounts):
        dashboard.add_routes(module.routes)
    dashboard.router.add_static("/static/", STATIC_DIR)
    # /dashboard itself, without the slash, is the sub-application's too (its path "" under the
    # prefix): so its redirect, and its 405 to another method, carry the pages' security headers.
    dashboard.router.add_get("", _to_dashboard)
    dashboard.router.add_route("*", "/{tail:.*}", _no_such_page)
    app.add_subapp(pages.PREFIX, dashboard)
    portal.setup(app)  # the customer portal at /portal, beside the dashboard
    return dashboard


async def _to_dashboard(request: web.Request) -> web.Response:
    raise web.HTTPSeeOther(f"{pages.PREFIX}/")


async def _no_such_page(request: web.Request) -> web.Response:
    raise web.HTTPNotFound()
