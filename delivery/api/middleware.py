"""Middlewares: request ids, one log line and one metric per request, and problem+json errors."""

from __future__ import annotations

import re
import time
import uuid

import structlog
from aiohttp import web

from billing.errors import BillingError
from delivery import metrics
from delivery.api import problems
from delivery.api.problems import Problem

log = structlog.get_logger("hookledger.api")
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


@web.middleware
async def observe(request: web.Request, handler) -> web.StreamResponse:
    """Accept a sane incoming X-Request-Id or make one; bind it to the log context; count the request."""
    incoming = request.headers.get("X-Request-Id", "")
    request_id = incoming if _SANE_REQUEST_ID.fullmatch(incoming) else uuid.uuid4().hex
    structlog.contextvars.bind_contextvars(request_id=request_id)
    started = time.perf_counter()
    try:
        response = await handler(request)
        response.headers["X-Request-Id"] = request_id
        route = request.match_info.route.resource
        template = route.canonical if route is not None else "unmatched"
        metrics.API_REQUESTS.labels(template, str(response.status)).inc()
        log.info(
            "request", method=request.method, path=request.path, route=template, status=response.status,
            duration_ms=round((time.perf_counter() - started) * 1000, 2),
        )
        return response
    finally:
        structlog.contextvars.unbind_contextvars("request_id")


@web.middleware
async def errors_as_problems(request: web.Request, handler) -> web.StreamResponse:
    """Every error leaves as application/problem+json; unexpected ones are logged and answer 500."""
    try:
        return await handler(request)
    except Problem as problem:
        return problems.response(problem)
    except BillingError as error:
        return problems.response(problems.from_billing(error))
    except web.HTTPRequestEntityTooLarge as error:
        return problems.response(Problem(413, error.text or "the body is too large", "payload-too-large"))
    except web.HTTPException as error:
        if error.status < 400:
            raise
        headers = {k: v for k, v in error.headers.items() if k.lower() in ("allow", "retry-after")}
        detail = error.reason if error.status != 404 else "no such route"
        return problems.response(Problem(error.status, detail, _slug(error.status), headers=headers))
    except Exception:
        log.exception("unhandled error", method=request.method, path=request.path)
        return problems.response(Problem(500, "an unexpected error occurred; it was logged", "internal"))


def _slug(status: int) -> str:
    return {404: "not-found", 405: "method-not-allowed"}.get(status, "error")
