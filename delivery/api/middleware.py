"""Middlewares: request ids, one log line and one metric per request, and problem+json errors."""

from __future__ import annotations

import itertools
import re
import secrets
import time

import structlog
from aiohttp import hdrs, web

from billing.errors import BillingError
from billing.database import NotWritten, OutcomeUnknown
from delivery import metrics, tracing
from delivery.store import connection_loss
from delivery.api import logs, problems
from delivery.api.problems import Problem

log = structlog.get_logger("hookledger.api")
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
# Our request ids: a random prefix per process and a counter, unique across processes and
# restarts without a system call per request (uuid4 read os.urandom on every request).
_REQUEST_ID_PREFIX = secrets.token_hex(8)
_request_numbers = itertools.count(1)
_request_counters: dict[tuple[str, int], object] = {}  # (route, status) -> its child of API_REQUESTS


def _new_request_id() -> str:
    return f"{_REQUEST_ID_PREFIX}{next(_request_numbers):016x}"


def _count(route: str, status: int) -> None:
    counter = _request_counters.get((route, status))
    if counter is None:
        # Bounded: routes are the app's templates (or "unmatched") and statuses are three digits.
        counter = _request_counters[(route, status)] = metrics.API_REQUESTS.labels(route, str(status))
    counter.inc()


@web.middleware
async def observe(request: web.Request, handler) -> web.StreamResponse:
    """Accept a sane incoming X-Request-Id or make one; bind it to the log context; count the
    request; with tracing on, serve it under its span (delivery.tracing)."""
    if not tracing.ENABLED:
        return await _observe(request, handler)
    with tracing.request_span(request.method, _template(request), request.headers) as span:
        response = await _observe(request, handler)
        tracing.request_answered(span, response.status)
        return response


def _template(request: web.Request) -> str:
    route = request.match_info.route.resource
    return route.canonical if route is not None else "unmatched"


async def _observe(request: web.Request, handler) -> web.StreamResponse:
    incoming = request.headers.get("X-Request-Id", "")
    request_id = incoming if incoming and _SANE_REQUEST_ID.fullmatch(incoming) else _new_request_id()
    bound = logs.REQUEST_ID.set(request_id)
    started = time.perf_counter()
    try:
        response = await handler(request)
        response.headers["X-Request-Id"] = request_id
        route = request.match_info.route.resource
        template = route.canonical if route is not None else "unmatched"
        _count(template, response.status)
        if logs.requests_logged():
            log.info(
                "request", method=request.method, path=request.path, route=template, status=response.status,
                duration_ms=round((time.perf_counter() - started) * 1000, 2),
            )
        return response
    finally:
        logs.REQUEST_ID.reset(bound)


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
JSON_MEDIA_TYPE = "application/json"
API_PREFIX = "/v1/"


def _require_json_body(request: web.Request) -> None:
    """A body sent to the API must be declared JSON: application/json or a +json type (415 if not).

    A body without Content-Type is read as JSON (RFC 9110 lets the recipient decide; `requests`
    sends bytes that way), so refusing only a declared other type loses no caller that means JSON.
    Only /v1/ routes: the dashboard, a sub-application under /dashboard, takes HTML forms.
    """
    declared = request.headers.get(hdrs.CONTENT_TYPE)
    if declared is None or declared == JSON_MEDIA_TYPE or not request.body_exists:
        return
    media_type = request.content_type  # lower case, without parameters
    if media_type == JSON_MEDIA_TYPE or (media_type.startswith("application/") and media_type.endswith("+json")):
        return
    if request.path.startswith(API_PREFIX) and request.match_info.http_exception is None:
        raise Problem(415, f"the body must be JSON, sent with Content-Type: {JSON_MEDIA_TYPE}; got {declared[:100]!r}",
                      "unsupported-media-type")


@web.middleware
async def errors_as_problems(request: web.Request, handler) -> web.StreamResponse:
    """Every error leaves as application/problem+json; unexpected ones are logged and answer 500."""
    try:
        _require_json_body(request)
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
    except OutcomeUnknown as error:  # a COMMIT answer lost, and no way to check it in time
        log.error("write outcome unknown", method=request.method, path=request.path, error=repr(error))
        return problems.response(problems.write_outcome_unknown(keyed=False, look_for=error.look_for))
    except NotWritten as error:  # a COMMIT answer lost, and the database says it did not take effect
        log.warning("write not committed", method=request.method, path=request.path, error=repr(error))
        return problems.response(problems.write_failed())
    except Exception as error:
        if connection_loss.lost_database(error):
            # The database went away (one of connection_loss.UNAVAILABLE, or asyncpg's InterfaceError on
            # the way out of a transaction or savepoint on the closed connection, the loss as its
            # context): a 503 to retry, not a 500.
            return _database_unavailable(request, error)
        log.exception("unhandled error", method=request.method, path=request.path)
        return problems.response(Problem(500, "an unexpected error occurred; it was logged", "internal"))


def _database_unavailable(request: web.Request, error: Exception) -> web.Response:
    log.warning("database unavailable", method=request.method, path=request.path, error=repr(error))
    detail = "the database is unavailable; retry shortly"
    if request.method not in SAFE_METHODS:
        # The connection may have gone during this request's COMMIT, and the write with it or not.
        detail += ("; if it went away while this request was being written, the write may have completed,"
                   " so retry only a call that is safe to repeat")
    return problems.response(Problem(503, detail, "database-unavailable", headers={"Retry-After": "1"}))


def _slug(status: int) -> str:
    return {404: "not-found", 405: "method-not-allowed"}.get(status, "error")
