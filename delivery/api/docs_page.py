"""The API's documentation: /openapi.json, and /docs where Redoc renders it.

Redoc comes from a package (drf-spectacular-sidecar ships its standalone build) and is served
from here, so the page loads nothing from a CDN and runs under a Content-Security-Policy of
ours. Redoc needs inline styles (it injects its own <style>) and a blob: worker for its search;
scripts only from this origin. /docs/receiving serves signing/RECEIVING.md, the receivers' guide.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
from pathlib import Path

import msgspec
from aiohttp import web

from delivery.api import openapi

routes = web.RouteTableDef()

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:;"
    " font-src 'self' data:; connect-src 'self'; worker-src blob:; frame-ancestors 'none'; base-uri 'none';"
    " form-action 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
}
_REDOC_IN_PACKAGE = ("static", "drf_spectacular_sidecar", "redoc", "bundles", "redoc.standalone.js")


def redoc_script() -> Path:
    """The installed Redoc bundle. Found without importing its package (that would import Django)."""
    spec = importlib.util.find_spec("drf_spectacular_sidecar")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("drf-spectacular-sidecar is not installed (a dependency of hookledger): /docs needs it")
    return Path(next(iter(spec.submodule_search_locations)), *_REDOC_IN_PACKAGE)


_SPEC_BYTES = msgspec.json.encode(openapi.document())
_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>hookledger API</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body>
<nav style="font-family:sans-serif;padding:.6em 1em;border-bottom:1px solid #ddd">
<strong>hookledger API v1</strong> &middot;
<a href="/dashboard/">Dashboard</a> &middot;
<a href="/docs/receiving">Receiving webhooks</a> &middot;
<a href="/openapi.json">OpenAPI document</a>
</nav>
<redoc spec-url="/openapi.json"></redoc>
<script src="/docs/redoc.standalone.js"></script>
</body></html>
"""


def _receiving_guide() -> str:
    return importlib.resources.files("signing").joinpath("RECEIVING.md").read_text(encoding="utf-8")


@routes.get("/openapi.json")
async def openapi_json(request: web.Request) -> web.Response:
    return web.Response(body=_SPEC_BYTES, content_type="application/json", headers=SECURITY_HEADERS)


@routes.get("/docs")
async def docs(request: web.Request) -> web.Response:
    return web.Response(text=_PAGE, content_type="text/html", headers=SECURITY_HEADERS)


@routes.get("/docs/redoc.standalone.js")
async def redoc(request: web.Request) -> web.FileResponse:
    return web.FileResponse(redoc_script(), headers={**SECURITY_HEADERS, "Content-Type": "text/javascript",
                                                     "Cache-Control": "public, max-age=86400"})


@routes.get("/docs/receiving")
async def receiving(request: web.Request) -> web.Response:
    return web.Response(text=_receiving_guide(), content_type="text/plain", charset="utf-8",
                        headers=SECURITY_HEADERS)
