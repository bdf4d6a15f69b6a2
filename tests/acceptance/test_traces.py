"""One message, one trace: from the app's request to the receiver, across a retry, exported over OTLP/HTTP.

A real `hookledger api` and `hookledger worker` run with the standard OpenTelemetry environment
pointed at an OTLP/HTTP receiver on loopback (an aiohttp server taking POST /v1/traces, read with
opentelemetry-proto). A message goes to a receiver that answers 500 once and then 200. The test
finds one trace holding the request, a link from it to its group-commit batch (and back), both
attempts (each with its claim, send and record, and their attributes), and no byte of the payload
in anything exported.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

import aiohttp
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from billing import accounts
from billing.database import create_pool
from delivery.api import api_keys
from engine_helpers import add_endpoint, fast_environment
from signing import generate_secret

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_KEY = "op_traces_" + "k" * 32
WAIT_SECONDS = 90


class Collector:
    """An OTLP/HTTP trace receiver: keeps every export's raw body and its spans."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.spans: list = []  # (resource service name, span)

    async def traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.bodies.append(body)
        export = ExportTraceServiceRequest()
        export.ParseFromString(body)
        for resource_spans in export.resource_spans:
            service = next((a.value.string_value for a in resource_spans.resource.attributes
                            if a.key == "service.name"), "")
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend((service, span) for span in scope_spans.spans)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")


class FailingOnce:
    """A webhook receiver that answers 500 to the first request and 200 to the next ones."""

    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.url = ""
        self.statuses: list[int] = []

    async def hook(self, request: web.Request) -> web.Response:
        await request.read()
        status = 500 if not self.statuses else 200
        self.statuses.append(status)
        return web.Response(status=status)


def _attributes(span) -> dict:
    values = {}
    for attribute in span.attributes:
        value = attribute.value
        values[attribute.key] = getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None
    return values


async def _serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


def _free_port() -> int:
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _wait_for(check, what: str, processes: list[subprocess.Popen]):
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        found = await check()
        if found:
            return found
        for process in processes:
            assert process.poll() is None, f"{process.args} exited while waiting for {what}"
        assert time.monotonic() < deadline, f"no {what} within {WAIT_SECONDS} s"
        await asyncio.sleep(0.2)


def _start(command: list[str], environment: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=ROOT, env=environment, stdout=log.open("w"), stderr=subprocess.STDOUT)


async def test_one_trace_holds_the_request_its_batch_both_attempts_and_the_record(
        make_database, redis_url, keyring, tmp_path):
    """A message that fails once and then arrives is one trace: request, batch link, two attempts
    (claim, send, record each) with account, endpoint, delivery, attempt and outcome; no payload."""
    collector = Collector()
    otlp_app = web.Application()
    otlp_app.router.add_post("/v1/traces", collector.traces)
    otlp_runner, otlp_port = await _serve(otlp_app)
    receiver = FailingOnce(secret=generate_secret())
    hook_app = web.Application()
    hook_app.router.add_post("/hook", receiver.hook)
    hook_runner, hook_port = await _serve(hook_app)
    receiver.url = f"http://127.0.0.1:{hook_port}/hook"

    database_url = make_database("hookledger_traces")
    api_port = _free_port()
    environment = {
        **os.environ,
        **fast_environment(database_url, redis_url, keyring),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "PYTHONUNBUFFERED": "1",
        "HOOKLEDGER_OPERATOR_KEY": OPERATOR_KEY, "HOOKLEDGER_API_PORT": str(api_port),
        "HOOKLEDGER_LOG_LEVEL": "info", "HOOKLEDGER_DATA_DIR": str(tmp_path / "data"),
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp_port}",
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # milliseconds: export soon after each span ends
    }
    environment.pop("OTEL_SERVICE_NAME", None)
    pool = await create_pool(database_url, size_min=1, size_max=2)
    processes = [
        _start([sys.executable, "-m", "delivery", "api"], environment, tmp_path / "api.log"),
        _start([sys.executable, "-m", "delivery", "worker"], environment, tmp_path / "worker.log"),
    ]
    marker = f"payload-marker-{uuid.uuid4().hex}"
    try:
        account = await accounts.create_account(pool, "traced", price_per_delivery=3)
        await accounts.top_up(pool, account.id, f"order-{account.id}", 100)
        endpoint_id = await add_endpoint(pool, account.id, receiver, keyring)
        key = (await api_keys.create_key(pool, account.id)).key
        api = f"http://127.0.0.1:{api_port}"

        async def healthy():
            try:
                async with aiohttp.ClientSession() as session, session.get(f"{api}/healthz") as answer:
                    return answer.status == 200
            except aiohttp.ClientError:
                return False

        await _wait_for(healthy, "the API", processes)
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{api}/v1/messages", headers={"Authorization": f"Bearer {key}"},
                                    json={"event_type": "order.paid", "payload": {"note": marker}}) as answer:
                assert answer.status == 202, await answer.text()
                created = await answer.json()
                request_id = answer.headers["X-Request-Id"]
        (delivery,) = created["deliveries"]
        delivery_id = delivery["id"]

        async def delivered():
            return await pool.fetchval("SELECT state = 'delivered' FROM deliveries WHERE id = $1",
                                       uuid.UUID(delivery_id))

        await _wait_for(delivered, "the delivery delivered", processes)
        assert receiver.statuses == [500, 200]
        stored = await pool.fetchval("SELECT trace_context FROM messages WHERE id = $1", uuid.UUID(created["id"]))
        version, trace_hex, _, flags = stored.split("-")
        assert version == "00" and int(flags, 16) & 1  # a W3C traceparent, sampled
        trace_id = bytes.fromhex(trace_hex)

        def named(name: str) -> list:
            return [span for _, span in collector.spans if span.name == name and span.trace_id == trace_id]

        async def whole_trace():
            records = named("delivery.record")
            outcomes = {_attributes(span).get("hookledger.outcome") for span in records}
            return (named("POST /v1/messages") and {"retrying", "delivered"} <= outcomes
                    and len(named("delivery.attempt")) == 2
                    and any(span.name == "group_commit.batch" for _, span in collector.spans))

        await _wait_for(whole_trace, "the whole trace exported", processes)

        # The request: the trace's root, a SERVER span of the API, linked to the batch that wrote it.
        services = {span.span_id: service for service, span in collector.spans}
        (request,) = named("POST /v1/messages")
        assert services[request.span_id] == "hookledger-api"
        assert request.parent_span_id == b""
        assert _attributes(request)["http.response.status_code"] == 202
        assert _attributes(request)["hookledger.account_id"] == str(account.id)
        batches = {span.span_id: span for _, span in collector.spans if span.name == "group_commit.batch"}
        (link,) = request.links
        batch = batches[link.span_id]
        assert batch.trace_id == link.trace_id != trace_id  # the batch is a trace of its own...
        assert any(back.trace_id == trace_id and back.span_id == request.span_id for back in batch.links)  # ...linked back

        # Both attempts, children of the request in its trace, each with its claim, send and record.
        attempts = sorted(named("delivery.attempt"), key=lambda span: _attributes(span)["hookledger.attempt"])
        assert [_attributes(span)["hookledger.attempt"] for span in attempts] == [1, 2]
        for attempt, outcome, status in zip(attempts, ("retrying", "delivered"), (500, 200), strict=True):
            attributes = _attributes(attempt)
            assert services[attempt.span_id] == "hookledger-worker"
            assert attempt.parent_span_id == request.span_id
            assert attributes["hookledger.account_id"] == str(account.id)
            assert attributes["hookledger.endpoint_id"] == str(endpoint_id)
            assert attributes["hookledger.delivery_id"] == delivery_id
            assert attributes["hookledger.outcome"] == outcome
            children = defaultdict(list)
            for _, span in collector.spans:
                if span.parent_span_id == attempt.span_id:
                    children[span.name].append(span)
            assert sorted(children) == ["delivery.claim", "delivery.record", "delivery.send"]
            (claim,), (send,), (record,) = children["delivery.claim"], children["delivery.send"], children["delivery.record"]
            assert _attributes(send)["http.response.status_code"] == status
            assert _attributes(send)["hookledger.latency_ms"] >= 0
            assert _attributes(record)["hookledger.outcome"] == outcome
            # In order: claimed, then sent, then recorded; all within the attempt.
            assert attempt.start_time_unix_nano <= claim.start_time_unix_nano <= claim.end_time_unix_nano
            assert claim.end_time_unix_nano <= send.start_time_unix_nano <= send.end_time_unix_nano
            assert send.end_time_unix_nano <= record.end_time_unix_nano <= attempt.end_time_unix_nano
        assert attempts[0].end_time_unix_nano <= attempts[1].start_time_unix_nano

        # Never the payload, in any span, attribute or event exported by either process.
        assert collector.bodies
        assert all(marker.encode() not in body for body in collector.bodies)

        # The API's log lines written under the request's span carry its ids.
        lines = [json.loads(line) for line in (tmp_path / "api.log").read_text().splitlines() if line.startswith("{")]
        (logged,) = [line for line in lines if line.get("request_id") == request_id and line.get("event") == "request"]
        assert logged["trace_id"] == trace_id.hex() and logged["span_id"] == request.span_id.hex()
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
        await pool.close()
        await hook_runner.cleanup()
        await otlp_runner.cleanup()
