"""Operations routes: health, readiness (503 when Redis is unreachable), Prometheus metrics with the
queue depth read at scrape time, the OpenAPI document, the docs page, request ids and JSON logs."""

from __future__ import annotations

import json
import logging
import uuid

from aiohttp.test_utils import TestClient, TestServer

from billing import messages

from delivery.engine import queue as job_queue
from delivery.api import logs
from delivery.platform.web_app import create_app


async def test_health_and_readiness(api):
    """/healthz is 200; /readyz is 200 with PostgreSQL and Redis reachable."""
    assert (await (await api.client.get("/healthz")).json()) == {"status": "ok"}
    assert (await (await api.client.get("/readyz")).json()) == {"status": "ready", "postgres": True, "redis": True}


async def test_readiness_is_503_when_redis_is_unreachable(api, pool):
    """A queue whose Redis connection points at a closed port makes /readyz answer 503 naming Redis."""
    from arq.connections import ArqRedis

    unreachable = ArqRedis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    try:
        app = create_app(api.settings, pool, job_queue.Queue(unreachable))
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            response = await client.get("/readyz")
            assert response.status == 503
            assert (await response.json()) == {"status": "unavailable", "postgres": True, "redis": False}
    finally:
        await unreachable.aclose()


async def test_metrics_expose_the_named_series_and_the_queue_depth(api):
    """/metrics has the delivery, attempt, latency, refund series and a queue depth equal to the due pending count."""
    _, headers = await api.account(balance=10)
    await api.endpoint(headers)
    direct_before = messages.WRITES["direct"]
    for _ in range(3):
        await api.send(headers)
    text = await (await api.client.get("/metrics")).text()
    for name in ("hookledger_deliveries_total", "hookledger_delivery_attempts_total",
                 "hookledger_delivery_latency_seconds", "hookledger_refunds_total", "hookledger_group_commit_batch_requests",
                 "hookledger_group_commit_seconds", "hookledger_create_batches_written",
                 "hookledger_create_unlocked_refused", "hookledger_create_direct_declined"):
        assert f"# TYPE {name.removesuffix('_total')}" in text
    assert "hookledger_queue_depth 3.0" in text
    # The create counts are billing's own counters, read at the scrape: the three creates, one batch each.
    assert f'hookledger_create_batches_written_total{{way="direct"}} {direct_before + 3.0}' in text, text


async def test_metrics_say_how_late_the_queue_runs(api):
    """/metrics reads from PostgreSQL at the scrape how long the oldest due delivery has been due and
    how many live deliveries wait in each state (no worker runs here, so nothing moves them)."""
    from prometheus_client.parser import text_string_to_metric_families

    def samples(text: str) -> dict:
        return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
                for family in text_string_to_metric_families(text) for sample in family.samples}

    _, headers = await api.account(balance=10)
    await api.endpoint(headers)
    empty = samples(await (await api.client.get("/metrics")).text())
    assert empty[("hookledger_oldest_due_delivery_age_seconds", ())] == 0
    ids = [uuid.UUID((await (await api.send(headers)).json())["deliveries"][0]["id"]) for _ in range(4)]
    await api.pool.execute("UPDATE deliveries SET next_attempt_at = now() - interval '90 seconds' WHERE id = $1", ids[0])
    await api.pool.execute("UPDATE deliveries SET next_attempt_at = now() + interval '1 hour' WHERE id = $1", ids[1])
    seen = samples(await (await api.client.get("/metrics")).text())
    assert 90 <= seen[("hookledger_oldest_due_delivery_age_seconds", ())] < 90 + 600
    assert seen[("hookledger_queue_depth", ())] == 3  # the one an hour ahead is not due
    assert seen[("hookledger_deliveries_waiting", (("state", "pending"),))] == 4
    assert seen[("hookledger_deliveries_waiting", (("state", "sending"),))] == 0


async def test_openapi_document_and_docs_page(api):
    """/openapi.json is OpenAPI 3.1 listing every JSON route the app serves (the HTML dashboard under
    /dashboard and the customer portal under /portal are not part of the API); /docs renders it with Redoc from our own origin, under our CSP."""
    spec = await (await api.client.get("/openapi.json")).json()
    assert spec["openapi"].startswith("3.1")
    served = {(route.method.lower(), route.resource.canonical) for route in api.client.app.router.routes()
              if route.method not in ("HEAD", "OPTIONS")
              and not route.resource.canonical.startswith(("/dashboard", "/portal"))}
    documented = {(method, path) for path, methods in spec["paths"].items() for method in methods}
    docs = {("get", "/openapi.json"), ("get", "/docs"), ("get", "/docs/redoc.standalone.js"), ("get", "/docs/receiving")}
    assert documented == served - docs
    response = await api.client.get("/docs")
    page = await response.text()
    assert '<redoc spec-url="/openapi.json">' in page and "http://" not in page and "https://" not in page
    assert '<script src="/docs/redoc.standalone.js"></script>' in page and page.count("<script") == 1
    assert "script-src 'self';" in response.headers["Content-Security-Policy"]
    script = await api.client.get("/docs/redoc.standalone.js")
    assert script.status == 200 and len(await script.read()) > 100_000  # the real bundle, from the package


async def test_request_ids_are_echoed_or_made(api):
    """A sane incoming X-Request-Id is echoed; an insane one is replaced by a fresh id."""
    assert (await api.client.get("/healthz", headers={"X-Request-Id": "abc-123"})).headers["X-Request-Id"] == "abc-123"
    replaced = (await api.client.get("/healthz", headers={"X-Request-Id": "bad id\twith tabs"})).headers["X-Request-Id"]
    assert replaced != "bad id\twith tabs" and len(replaced) == 32
    made = {(await api.client.get("/healthz")).headers["X-Request-Id"] for _ in range(3)}
    assert len(made) == 3 and replaced not in made  # a fresh id for every request without one


async def test_logs_are_json_lines_with_the_request_id(api, capsys):
    """With logging configured, each request logs one JSON line carrying its request id."""
    root_handlers = logging.getLogger().handlers[:]
    logs.configure("info")
    try:
        await api.client.get("/healthz", headers={"X-Request-Id": "trace-me"})
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
        assert any(line.get("request_id") == "trace-me" and line["status"] == 200 for line in lines)
    finally:
        import structlog

        structlog.reset_defaults()
        logging.getLogger().handlers[:] = root_handlers


async def test_lines_logged_while_serving_carry_its_request_id_and_only_those(capsys):
    """At level warning the per-request line is not written, but any line logged while a request
    is served (structlog's or the standard library's) carries its request id; a line logged after
    the request carries none."""
    import structlog
    from aiohttp import web

    from delivery.api import middleware

    async def handler(request: web.Request) -> web.Response:
        logging.getLogger("hookledger.test").warning("inside, from the standard library")
        structlog.get_logger("hookledger.test").warning("inside, from structlog")
        return web.json_response({})

    app = web.Application(middlewares=[middleware.observe])
    app.router.add_get("/x", handler)
    root_handlers = logging.getLogger().handlers[:]
    logs.configure("warning")
    try:
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            assert (await client.get("/x", headers={"X-Request-Id": "trace-this"})).status == 200
        logging.getLogger("hookledger.test").warning("after the request")
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
        inside = [line for line in lines if line["event"].startswith("inside")]
        assert len(inside) == 2 and all(line["request_id"] == "trace-this" for line in inside)
        assert not any(line["event"] == "request" for line in lines)  # info lines are off
        after = [line for line in lines if line["event"] == "after the request"]
        assert len(after) == 1 and "request_id" not in after[0]
    finally:
        logs.configure("info")  # the per-request line on again, as in every other test
        structlog.reset_defaults()
        logging.getLogger().handlers[:] = root_handlers
